"""`report`: one self-contained HTML page, checked in a real headless browser (Debian's chromium)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import robustbench_pid as rbp
from robustbench_pid.cli import main
from robustbench_pid.results.inputs import load_inputs
from robustbench_pid.results.report.html import build_report


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    for m in ("deit", "pid_deit"):
        rbp.evaluate(model=m, attack="fgsm", eps=["2/255", "4/255"], limit=24, batch_size=24, out=d / m)
    return d


def test_report_is_self_contained_with_all_sections(runs, tmp_path):
    out = tmp_path / "report.html"
    assert main(["report", str(runs), "-o", str(out)]) == 0
    page = out.read_text()
    for heading in ("Paper-style table", "Model comparisons", "All results", "Plots", "Gradient-masking diagnostics",
                    "Provenance"):
        assert f"<h2>{heading}" in page
    assert "McNemar exact, n=24" in page and "deit_smoke" not in page
    assert page.count("<svg") >= 2  # accuracy-vs-eps plots, inline
    assert "run.json of deit" in page and "run.json of pid_deit" in page
    assert "efee7ca68bbb59b4" in page  # the deit checkpoint's sha256 (provenance)
    # nothing to fetch: no scripts, stylesheets, external images or fonts
    assert not re.search(r"<script|<link|<iframe|@import|url\((?!#)", page, re.I)  # url(#id): SVG-internal
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:|//)", page, re.I)


def test_report_shows_diagnostics_or_says_why(runs):
    page = build_report(load_inputs(runs))
    section = page.split("<h2>Gradient-masking diagnostics</h2>", 1)[1].split("<h2>", 1)[0]
    try:
        import robustbench_pid.results.report.diagnostics  # noqa: F401
    except ImportError:
        assert "not available in this version" in section
    else:
        assert "<li" in section or "No gradient-masking signs" in section


def test_report_says_no_signs_only_where_the_evidence_supports_it(tmp_path):
    """PGD-2 whose incomplete-optimisation indicator flags samples: the page says so, with the terminal's warning,
    instead of "no gradient-masking signs" (it said that while its own evidence table showed the flags)."""
    rbp.evaluate(model="deit", attack="pgd", eps="4/255", steps=2, limit=8, out=tmp_path / "r1", quiet=True)
    flagged = load_inputs(tmp_path / "r1").results
    assert (flagged.loc[flagged["metric"] == "incomplete_optimization", "value"] > 0).any()
    page = build_report(load_inputs(tmp_path / "r1"))
    section = page.split("<h2>Gradient-masking diagnostics</h2>", 1)[1].split("<h2>", 1)[0]
    assert "No gradient-masking signs" not in section
    assert "may be an overestimate" in section and "--converge" in section


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser():
    for b in BROWSERS:
        p = shutil.which(b)
        if p:
            return p
    return None


@pytest.mark.skipif(_browser() is None, reason="no headless browser installed (CI: apt-get install -y chromium)")
def test_report_renders_in_headless_chromium_offline(runs, tmp_path):
    out = tmp_path / "report.html"
    rbp.write_report(load_inputs(runs), out)
    flags = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'ud'}",
             "--host-resolver-rules=MAP * ~NOTFOUND"]  # any network fetch would fail
    dom = subprocess.run(flags + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "Paper-style table (PIDformer Table 1 shape)" in html
    assert "FGSM (4/255)" in html and "p pid_deit vs deit" in html
    assert html.count("<svg") >= 2
    shot = tmp_path / "shot.png"
    r = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,1600", out.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000  # a page with tables and plots, not blank


def test_the_evidence_matrix_keeps_protocols_and_runs_apart(tmp_path):
    """FGSM in the standard and the paper protocol, and PGD on 8 and on 24 samples, were one row each (the first
    one's values); now a row per protocol and per run, and the report shows the runs its tables show."""
    from robustbench_pid.results.report.evidence_text import evidence_matrix

    for name, kw in (("fs", dict(attack="fgsm", protocol="standard", limit=8)),
                     ("fp", dict(attack="fgsm", protocol="paper", limit=8)),
                     ("p8", dict(attack="pgd", steps=2, limit=8)), ("p24", dict(attack="pgd", steps=2, limit=24))):
        rbp.evaluate(model="deit", eps="4/255", out=tmp_path / name, quiet=True, **kw)
    wide, _ = evidence_matrix(load_inputs([tmp_path / "fs", tmp_path / "fp"]).results)
    assert sorted(wide["protocol"]) == ["paper", "standard"]
    inp = load_inputs([tmp_path / "p8", tmp_path / "p24"])  # identical settings: the tables show one run
    wide, _ = evidence_matrix(inp.results)
    shown = inp.results[(inp.results["attack"] == "pgd") & (inp.results["metric"] == "incomplete_optimization")]
    assert len(wide) == 1 and len(shown) == 1 and wide["incomplete"].iloc[0] == f"{shown['value'].iloc[0]:.1f}%"
    assert any("identical settings in several runs" in n for n in inp.notes)
    wide, _ = evidence_matrix(inp.rows)  # every run's rows (as a caller may pass them): a row per run
    assert sorted(c.rsplit(" (", 1)[-1] for c in wide["condition "]) == ["p24)", "p8)"]


def test_whether_indicators_ran_is_decided_per_run(tmp_path):
    """Records of a run with --indicators beside one without: the second's cells are not called 'not computable'
    (it simply was not run with --indicators, so it gets no indicator rows of that kind)."""
    from robustbench_pid.results.report.evidence_rows import evidence_rows

    rbp.evaluate(model="deit", attack="pgd", eps="4/255", steps=2, limit=8, indicators=True, out=tmp_path / "ai",
                 quiet=True)
    rbp.evaluate(model="deit", attack="fgsm", eps="4/255", limit=8, out=tmp_path / "fs", quiet=True)
    rows = evidence_rows(rbp.load_records(tmp_path))
    fgsm = rows[rows["attack"] == "fgsm"]
    assert "unstable_predictions" not in set(fgsm["metric"])
    assert "unstable_predictions" in set(rows[rows["attack"] == "pgd"]["metric"])

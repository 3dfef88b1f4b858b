"""Progress where a person waits (issue 46, item 1): a study's rows each say "[k/n] row" and draw a bar whose ETA
is priced from the image-passes left (not from the clean pass's pace), one line per redraw in a log file; --quiet
keeps only the final table; doctor names each check as it starts; notebooks show progress by default."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from robustbench_pid.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robustbench_pid", *args], capture_output=True, text=True,
                          env=ENV, timeout=600)


def test_a_newcomers_study_run_shows_each_row_and_quiet_stays_quiet(tmp_path: Path) -> None:
    base = ["reproduce", "digits-smoke", "--model", "pid_deit", "--limit", "4", "--only", "clean", "--only",
            "fgsm-2", "--device", "cpu"]
    p = _cli(*base, "--out", str(tmp_path / "loud"))
    assert p.returncode == 0, p.stderr
    assert "[1/2] row 'clean' (Clean)" in p.stdout and "[2/2] row 'fgsm-2' (FGSM 2/255)" in p.stdout
    err = p.stderr.splitlines()
    assert "\r" not in p.stderr  # a log file gets one line per redraw, not one carriage-returned line
    for row, total in (("clean", "4.00"), ("fgsm-2", "24.0")):  # FGSM row: clean 4 + 4 x (2 forwards + 1 f+b x 3)
        mine = [ln for ln in err if ln.startswith(f"pid_deit adversarial {row}:")]
        assert any(" 0%|" in ln for ln in mine) and any(f"100%|##########| {total}/{total} [" in ln for ln in mine)
        assert all("passes/s" in ln for ln in mine)
    q = _cli(*base, "--quiet", "--out", str(tmp_path / "quiet"))
    assert q.returncode == 0 and q.stderr == ""
    assert q.stdout.lstrip().startswith("### Digits smoke study") and "[1/2]" not in q.stdout


def test_the_bar_counts_image_passes_so_the_clean_pass_does_not_set_the_eta(tmp_path: Path) -> None:
    from robustbench_pid.run.context import prepare
    from robustbench_pid.run.plan import plan_units
    from robustbench_pid.run.runner import FB_COST, unit_weight
    from robustbench_pid.run.spec_builder import build_spec

    ctx = prepare(build_spec("deit", attack="pgd", eps="2/255", steps=5, limit=8, dry_run=True))
    weights = {u.attack: unit_weight(ctx, u) for u in plan_units(ctx)}
    assert weights == {"clean": 1.0, "pgd": 2 + FB_COST * 5}  # PGD-5: clean + verdict forward, 5 f+b
    p = _cli("evaluate", "--model", "deit", "--attack", "pgd", "--eps", "2/255", "--steps", "5", "--limit", "8",
             "--device", "cpu", "--out", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    total = 8 * (1 + 2 + FB_COST * 5)  # the clean unit is 8 of these 144, not half of the bar
    assert f"{total:.0f}/{total:.0f} [" in p.stderr and "passes/s" in p.stderr


def test_doctor_names_each_check_as_it_starts(monkeypatch, tmp_path: Path, capsys) -> None:
    import robustbench_pid.doctor as doctor

    def ok(s, state):
        return "PASS", "fine", {}

    monkeypatch.setattr(doctor, "plan", lambda s: [("environment", "one", ok), ("speed", "two", ok)])
    out = io.StringIO()
    report = doctor.run_doctor("cpu", quick=True, out=out)
    err = capsys.readouterr().err.splitlines()
    assert err == ["[1/2] environment one ...", "[2/2] speed two ..."] and report.exit_code == 0
    assert "environment one" in out.getvalue() and "[1/2]" not in out.getvalue()  # the table stays on stdout


def test_progress_is_on_in_a_notebook_and_off_in_a_script(monkeypatch) -> None:
    from robustbench_pid.runtime.progress import LogLines, in_notebook, wants_progress

    assert wants_progress(None) is in_notebook() is False  # pytest is no notebook
    assert wants_progress(True) is True and wants_progress(False) is False
    with pytest.raises(UserError, match="progress must be True, False or None"):
        wants_progress("yes")

    class ZMQInteractiveShell:  # what a Jupyter kernel's get_ipython() returns
        pass

    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: ZMQInteractiveShell()
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert in_notebook() and wants_progress(None) is True
    buf = io.StringIO()
    lines = LogLines(buf)
    for chunk in ("\rrow:  0%| 0/4", "\rrow: 100%| 4/4   ", "\n"):
        lines.write(chunk)
    assert buf.getvalue() == "row:  0%| 0/4\nrow: 100%| 4/4\n"


def test_the_python_api_shows_its_bar_with_progress_true_and_nothing_by_default_in_a_script(tmp_path: Path,
                                                                                             capsys) -> None:
    import robustbench_pid as rbp

    rbp.evaluate("deit", attack="fgsm", eps="2/255", limit=4, out=tmp_path / "quiet", device="cpu")
    assert "img" not in capsys.readouterr().err  # a script: no bar unless asked
    rbp.evaluate("deit", attack="fgsm", eps="2/255", limit=4, out=tmp_path / "shown", device="cpu", progress=True)
    assert "deit adversarial" in capsys.readouterr().err
    with pytest.raises(UserError, match="give progress= or quiet=, not both"):
        rbp.evaluate("deit", attack="fgsm", eps="2/255", limit=4, out=tmp_path / "x", progress=True, quiet=True)
    with pytest.raises(UserError, match="progress must be True, False or None"):
        rbp.evaluate("deit", attack="fgsm", eps="2/255", limit=4, out=tmp_path / "y", progress="yes")


def test_each_ladder_rung_reports_its_progress(plain, digits8, tmp_path: Path, monkeypatch) -> None:
    """A --converge run names every rung on the progress line as it starts and as its batches finish: the round,
    the rung, samples attacked and broken so far, and the rung's own ETA (issue 46: the ladder sat silent behind a
    finished bar)."""
    import robustbench_pid as rbp
    from robustbench_pid.run.context import Context

    seen: list = []
    monkeypatch.setattr(Context, "note", lambda self, text: seen.append(text))
    x, y = digits8
    rbp.evaluate(model=plain, data=(x[:24], y[:24]), attack="pgd", eps=0.1, steps=5, converge=True, progress=True,
                 converge_opt={"steps": 10, "sweep_steps": 4, "square_queries": 50},
                 out=tmp_path / "run", name="mlp", mean=[0.0], std=[1.0])
    rungs = {t.split(": ")[0].split()[-1] for t in seen}
    assert {"apgd-ce", "apgd-t", "square"} <= rungs, seen  # round 1 (FAB-T runs only in the full budget)
    assert all("attacked" in t and "broken" in t and "rung ETA" in t and " round " in t for t in seen)
    assert any(t.split(": ")[1].startswith("0/") for t in seen)  # said as the rung starts, before its first batch

"""One static, self-contained HTML report: tables, plots, provenance, gradient-masking diagnostics.

Everything is inlined (SVG figures as markup, PNG as base64 data URIs, CSS in a <style> block, no
scripts, no fonts or links to fetch), so the file can be attached to an issue, mailed or archived
and viewed offline. Written with the standard library's ``html.escape`` rather than a template
engine: the page is small and fixed, and this keeps the report free of extra dependencies.
"""
from __future__ import annotations

import base64
import html
import json
import tempfile
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pandas as pd

from ...core.version import __version__
from ..tables.comparisons import compare_models
from .attention_report import attention_section
from .diagnostics import checks_that_apply, diagnose, format_findings
from .evidence_text import overestimate_note
from .evidence_report import converge_section, evidence_section
from ..inputs import AGGREGATE_METRICS, Inputs, as_inputs, attack_norms
from ...core.labels import eps_text
from ..files.outputs import output_file, write_text
from .plots import figure_bytes, figures, write_rank_collapse
from ..tables.render import Table, fmt_p, render_html
from ..tables.layouts import paper_tables, wide_table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
     padding:0 1em;color:#1a1a1a;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.05em;margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.85em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right;white-space:nowrap}
th{background:#f3f3f3} td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}
ul.notes{font-size:.85em;color:#444} .muted{color:#666;font-size:.9em}
figure{margin:1em 0} figure svg,figure img{max-width:100%;height:auto}
details pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em;max-height:30em}
.finding{margin:.3em 0} .sev-warning{color:#9a5b00} .sev-error,.sev-high{color:#b00020} .sev-info{color:#225}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _svg_inline(fig: Any) -> str:
    svg = figure_bytes(fig, "svg").decode("utf-8")
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _scroll(inner: str) -> str:
    return f"<div style='overflow-x:auto'>{inner}</div>"


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _finding_html(f: Any) -> str:
    """A diagnostics finding of any reasonable shape: dataclass, dict, object with attributes, or text."""
    if is_dataclass(f) and not isinstance(f, type):
        f = asdict(f)
    if isinstance(f, dict):
        d = f
    elif hasattr(f, "__dict__") and not isinstance(f, str):
        d = {k: v for k, v in vars(f).items() if not k.startswith("_")}
    else:
        return f"<li class='finding'>{_esc(f)}</li>"
    sev = str(d.get("severity", d.get("level", "warning")))
    msg = d.get("message", d.get("text", d.get("description", "")))
    kind = d.get("code", d.get("kind", d.get("check", d.get("name", ""))))
    rest = {k: v for k, v in d.items() if k not in ("severity", "level", "message", "text", "description", "kind",
                                                  "check", "name", "code") and v not in (None, "")}
    extra = f" <span class='muted'>{_esc(json.dumps(rest, default=str))}</span>" if rest else ""
    head = f"<b>{_esc(kind)}</b>: " if kind else ""
    return f"<li class='finding sev-{_esc(sev.lower())}'>[{_esc(sev)}] {head}{_esc(msg)}{extra}</li>"


def diagnostics_section(inp: Inputs) -> Tuple[str, List[Any]]:
    """HTML for the gradient-masking diagnostics, and the raw findings."""
    if inp.records is None:
        return "<p class='muted'>Diagnostics need per-sample records: pass run folders, not tidy tables.</p>", []
    try:
        findings = list(diagnose(inp.records) or [])
        note = overestimate_note(inp.results)  # the de-duplicated rows the tables show
        applied = checks_that_apply(inp.records)
    except Exception as exc:  # noqa: BLE001  (a failing check must not hide the rest of the report)
        return f"<p class='sev-error'>The diagnostics failed: {_esc(exc)}</p>", []
    warn = f"<p class='sev-warning'>{_esc(note)}</p>" if note else ""
    if not findings:  # the same words as the terminal: "no signs" only where the checks that ran support it
        text = format_findings(findings, flagged=bool(note), applied=applied).removeprefix("diagnostics: ")
        return f"<p>{_esc(text[:1].upper() + text[1:])}.</p>" + warn, []
    return "<ul>" + "".join(_finding_html(f) for f in findings) + "</ul>" + warn, findings


def provenance_section(runs: Sequence[Dict[str, Any]], norms: Optional[Mapping[str, str]] = None) -> str:
    """Each run's run.json in a table (and in full); ``norms``: attack -> norm, for writing eps."""
    norms = norms or {}
    if not runs:
        return "<p class='muted'>No run.json available (tidy tables carry no provenance).</p>"
    cols = ["run", "model", "arch", "checkpoint sha256", "dataset", "n", "skipped", "protocol", "benchmark", "attacks", "seed",
            "device", "versions", "git", "finished", "wall s"]
    rows = []
    for r in runs:
        attacks = ", ".join(sorted({f"{a.get('attack')}@{eps_text(a['eps'], norms.get(a.get('attack'), ''))}"
                                    if 'eps' in a else str(a.get('attack')) for a in r.get("attacks", [])})) or "-"
        v = r.get("versions", {}) or {}
        rows.append([r.get("run_id", ""), r.get("model", ""), r.get("arch", ""),
                     str(r.get("checkpoint_sha256") or "-")[:16], f"{r.get('dataset', '')}/{r.get('split', '')}",
                     r.get("n_samples", ""), _n_skipped(r), r.get("protocol", ""), r.get("benchmark", ""), attacks, r.get("seed", ""),
                     r.get("device_name") or r.get("device", ""),
                     " ".join(f"{k} {v[k]}" for k in ("robustbench_pid", "torch", "timm") if k in v),
                     str(r.get("git_commit") or "-")[:10], r.get("finished", ""), r.get("wall_seconds", "")])
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_esc(x)}</td>" for x in row) + "</tr>" for row in rows)
    details = "".join(
        f"<details><summary>run.json of {_esc(r.get('run_id', ''))}</summary><pre>"
        f"{_esc(json.dumps({k: v for k, v in r.items() if k != 'path'}, indent=2, default=str))}</pre></details>"
        for r in runs)
    return f"<div style='overflow-x:auto'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{details}"


def _n_skipped(run: Dict[str, Any]) -> int:
    """Images --skip-unreadable dropped from a run (0 when none, or the dataset cannot skip)."""
    return int((run.get("dataset_provenance") or {}).get("n_unreadable") or 0)


def skipped_notice(runs: Sequence[Dict[str, Any]]) -> str:
    """A visible warning above the tables when any run's n shrank because images were unreadable."""
    hit = [(r.get("run_id", "?"), _n_skipped(r)) for r in runs if _n_skipped(r)]
    if not hit:
        return ""
    items = "".join(f"<li>{_esc(rid)}: {n} image(s) skipped</li>" for rid, n in hit)
    return ("<p class='sev-warning'>Unreadable images were skipped (--skip-unreadable): n in the tables below "
            f"counts only the images that could be read.</p><ul class='notes'>{items}</ul>")


def comparisons_tables(inp: Inputs, n_boot: int = 1000) -> Tuple[Optional[Table], Optional[Table]]:
    """(headline comparisons: attacks and aggregate metrics, the rest: e.g. per corruption and severity)."""
    c = compare_models(inp, n_boot=n_boot)
    if c.empty:
        return None, None
    main = (c["benchmark"] == "adversarial") | c["metric"].isin(AGGREGATE_METRICS)
    return _comparisons_table(c[main], "Attacks and aggregate metrics"), _comparisons_table(c[~main], "Other conditions")


def _comparisons_table(c: pd.DataFrame, title: str) -> Optional[Table]:
    if c.empty:
        return None
    c = c.sort_values(["dataset", "protocol", "attack", "eps", "metric", "model_a", "model_b"], kind="stable")
    frame = pd.DataFrame({
        "dataset": c["dataset"], "protocol": c["protocol"], "attack": c["attack"],
        "eps": [eps_text(e, n) for e, n in zip(c["eps"], c["norm"])], "metric": c["metric"],
        "A": c["model_a"], "B": c["model_b"], "A value": [f"{v:.2f}" for v in c["value_a"]],
        "B value": [f"{v:.2f}" for v in c["value_b"]], "Δ B−A": [f"{d:+.2f}" for d in c["delta"]],
        "test": [t or "-" for t in c["test"]], "n": [str(n) if n else "-" for n in c["n_paired"]],
        "p": [fmt_p(p, floor=f) for p, f in zip(c["pvalue"], c["p_floor"])],
    })
    notes = sorted({n for n in c["note"] if n})
    return Table(frame.reset_index(drop=True), title,
                 ["Δ: B minus A in points; p: two-sided paired test on the same samples; * p < 0.05"] + notes)


def build_report(data: Any, title: str = "Robustness report", n_boot: int = 1000,
                 ce_baseline: Optional[str] = None, first: Sequence[str] = ()) -> str:
    """The report as one HTML string: the inputs are prepared once and every section reads them.
    ``first``: HTML sections the caller puts before the tables (``rbp.write_report`` passes a study
    folder's table with the paper beside it; the study lives above the results layer)."""
    inp = as_inputs(data, ce_baseline=ce_baseline)
    sections: List[str] = [skipped_notice(inp.runs), *first]
    try:
        paper = paper_tables(inp, n_boot=n_boot)
    except Exception as exc:  # noqa: BLE001  (e.g. nothing in paper shape: show the rest)
        paper, paper_err = [], str(exc)
    else:
        paper_err = ""
    sections.append("<h2>Paper-style table (PIDformer Table 1 shape)</h2>" +
                    (_scroll(render_html(paper)) if paper else f"<p class='muted'>{_esc(paper_err)}</p>"))
    comp, rest = comparisons_tables(inp, n_boot=n_boot)
    if comp is not None or rest is not None:
        html_ = "<h2>Model comparisons</h2>"
        if comp is not None:
            html_ += _scroll(render_html([comp]))
        if rest is not None:
            html_ += (f"<details><summary>{len(rest.frame)} more comparisons (other conditions)</summary>"
                      f"{_scroll(render_html([rest]))}</details>")
        sections.append(html_)
    wide = wide_table(inp)
    sections.append(f"<h2>All results</h2><details><summary>{len(wide.frame)} rows, one column per model"
                    f"</summary>{_scroll(render_html([wide]))}</details>")
    figs, notes = figures(inp)
    plot_html = []
    for name, fig in figs.items():
        plot_html.append(f"<figure id='plot-{_esc(name)}'>{_svg_inline(fig)}<figcaption>{_esc(name)}</figcaption></figure>")
    with tempfile.TemporaryDirectory() as tmp:
        rc, why = write_rank_collapse(inp, Path(tmp) / "rank_collapse.png")
        if rc is not None:
            plot_html.append(f"<figure id='plot-rank_collapse'><img alt='rank collapse' src='{_png_data_uri(rc)}'>"
                             f"<figcaption>rank_collapse</figcaption></figure>")
        else:
            notes.append(f"rank_collapse: skipped ({why})")
    sections.append("<h2>Plots</h2>" + "".join(plot_html) +
                    ("<ul class='notes'>" + "".join(f"<li>{_esc(n)}</li>" for n in notes) + "</ul>" if notes else ""))
    sections.append(attention_section(inp, n_boot))  # "" unless a run has attention.parquet (--analyze attention)
    diag, _ = diagnostics_section(inp)
    sections.append("<h2>Gradient-masking diagnostics</h2>" + diag)
    # the de-duplicated rows the tables show, so the evidence is of the same runs
    sections.append(evidence_section(inp.results))  # indicators of attack failure (evidence_report.py)
    sections.append(converge_section(inp.results))  # --converge: converged value, status, curve
    sections.append("<h2>Provenance</h2>" + provenance_section(inp.runs, attack_norms(inp.rows)))
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{CSS}</style></head><body>")
    intro = (f"<h1>{_esc(title)}</h1><p class='muted'>robustbench_pid {_esc(__version__)} · generated {stamp} · "
             f"{len(inp.runs)} run(s) · models: {_esc(', '.join(sorted(inp.results['model'].astype(str).unique())))}</p>")
    return head + intro + "".join(sections) + "</body></html>\n"


def write_report(data: Any, out: Union[str, Path], title: str = "Robustness report", n_boot: int = 1000,
                 ce_baseline: Optional[str] = None, first: Sequence[str] = ()) -> Path:
    p = output_file(out, "report.html")  # checked before the work, written atomically (outputs.py)
    return write_text(p, build_report(data, title=title, n_boot=n_boot, ce_baseline=ce_baseline, first=first),
                      "report.html")

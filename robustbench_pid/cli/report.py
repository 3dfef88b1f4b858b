"""``report``: one self-contained HTML page (tables, plots, provenance, diagnostics)."""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "report"
HELP = "write one static HTML report (tables, plots, provenance, gradient-masking diagnostics); viewable offline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="run folder(s) or a folder of runs")
    p.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="HTML file (default report.html)")
    p.add_argument("--title", default="Robustness report")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for mCE/AUPR (default 1000)")
    p.add_argument("--ce-baseline", metavar="MODEL",
                   help="model whose corruption errors normalize CE/mCE outside ImageNet (its runs must be among "
                        "the results; ImageNet uses AlexNet's published errors)")


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from ..results.inputs import load_inputs
    from ..results.files.outputs import output_file
    from ..studies.report import write_report

    output_file(args.output, "report.html")  # before the work: a folder as -o is one error line
    out = write_report(load_inputs(args.results, ce_baseline=args.ce_baseline), args.output, title=args.title,
                       n_boot=args.n_boot, study_dir=Path(args.results[0]) if len(args.results) == 1 else None)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB, self-contained)")
    return 0

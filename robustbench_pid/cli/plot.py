"""``plot``: write the result plots (PNG and SVG) to a folder."""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "plot"
HELP = "plots of results (accuracy vs eps, per-corruption CE, rank collapse) as PNG and SVG"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="run folder(s), a folder of runs, or a tidy results .csv")
    p.add_argument("--out", type=Path, required=True, help="folder for the image files")
    p.add_argument("--format", action="append", choices=["png", "svg"],
                   help="only this format (repeatable; default both)")
    p.add_argument("--ce-baseline", metavar="MODEL",
                   help="model whose corruption errors normalize CE/mCE outside ImageNet (its runs must be among "
                        "the results; ImageNet uses AlexNet's published errors)")


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from ..results.inputs import load_inputs
    from ..results.report.plots import write_plots

    inp = load_inputs(args.results, ce_baseline=args.ce_baseline)
    paths, notes = write_plots(inp, args.out, formats=args.format or ("png", "svg"))
    from ..results.report.attention import attention_of_runs  # runs with --analyze attention: their own figures
    from ..results.report.attention_plots import write_attention_plots

    more, why = write_attention_plots(attention_of_runs(inp.runs), args.out, formats=args.format or ("png", "svg"))
    paths, notes = paths + more, notes + (why if any((r.get("spec") or {}).get("analyze") for r in inp.runs) else [])
    for p in paths:
        print(f"wrote {p}")
    for n in notes:
        print(f"note: {n}")
    if not paths:
        print("no plots: the results hold nothing to plot")
    return 0

"""``table``: paper-style (PIDformer Table 1), long or wide tables with intervals and paired tests."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, List, Optional, Tuple

NAME = "table"
HELP = ("tables of results: --layout paper (PIDformer Table 1 shape, per-pair delta and paired p-values), "
        "long or wide; markdown, latex or csv")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="run folder(s) or a folder of runs (a tidy .csv works too, "
                                              "without paired tests)")
    p.add_argument("--layout", default="paper", choices=["paper", "long", "wide"])
    p.add_argument("--format", default="markdown", choices=["markdown", "latex", "csv"])
    p.add_argument("--models", help="comma-separated column order (default: sorted names)")
    p.add_argument("--dataset", help="paper layout: only this dataset")
    p.add_argument("--protocol", help="paper layout: only this protocol (standard or paper)")
    p.add_argument("--eps", help="paper layout: eps per attack row when several were run: one value for all "
                                 "(3/255) or per attack (pgd=4/255,fgsm=2/255)")
    p.add_argument("--no-compare", action="store_true", help="paper layout: no delta / p-value columns")
    p.add_argument("--baseline", metavar="MODEL", help="paper layout: Δ and paired p of each model against this one")
    p.add_argument("--pairs", metavar="BASELINE:MODEL,...",
                   help="paper layout: Δ (MODEL minus BASELINE) and paired p for these pairs only (default: a study "
                        "folder's [[pair]] claims; the one pair of two models; none for more, with a note)")
    p.add_argument("--width", type=int, default=None, metavar="CHARS",
                   help="markdown: no line wider than this; a wider table continues below in parts repeating its row "
                        "names (default 200 on the terminal, none with -o; 0: never wrap)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for mCE/AUPR (default 1000)")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.add_argument("--ce-baseline", metavar="MODEL",
                   help="model whose corruption errors normalize CE/mCE outside ImageNet (its runs must be among "
                        "the results; ImageNet uses AlexNet's published errors)")


def run(args: argparse.Namespace) -> int:
    from ..results.inputs import load_inputs
    from ..results.tables.render import render
    from ..results.tables.layouts import tables

    from ..results.files.outputs import output_file, write_text

    if args.output:
        output_file(args.output, "table.md")  # a folder or a blocked path: one error line before any work
    inp = load_inputs(args.results, ce_baseline=args.ce_baseline)
    kw = {}
    if args.layout == "paper":
        pairs = args.pairs if args.pairs is not None or args.baseline else study_pairs(args.results, inp)
        kw = dict(dataset=args.dataset, protocol=args.protocol, eps=args.eps, compare=not args.no_compare,
                  n_boot=args.n_boot, pairs=pairs, baseline=args.baseline)
    if args.models:
        kw["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    from ..results.tables.render import WIDTH

    width = args.width if args.width is not None else (None if args.output else WIDTH)
    text = render(tables(inp, layout=args.layout, **kw), args.format, width=width or None)
    if args.output:
        write_text(args.output, text, "table.md")
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


def study_pairs(paths: List[str], inp: Any) -> Optional[List[Tuple[str, str]]]:
    """A study folder's ``[[pair]]`` claims as (baseline, method) model labels present in the results (None when
    the results are no single study folder, or none of its pairs is there): what the study compares."""
    from ..studies.spec import parse_study
    from ..studies.table import STUDY_FILE, is_study_folder

    if len(paths) != 1 or not is_study_folder(Path(paths[0])):
        return None
    study = parse_study(Path(paths[0]) / STUDY_FILE)
    model = {c.name: c.model for c in study.columns}
    labels = set(inp.results["label"].astype(str))
    found = [(model[p.baseline], model[p.method]) for p in study.pairs
             if model.get(p.baseline) in labels and model.get(p.method) in labels]
    return list(dict.fromkeys(found)) or None

"""``robustbench-pid export RUN --robustbench DIR``: a finished run's RobustBench entry (model_info JSON, the
adversarial images as the .pt tensor of an external evaluation, the unaggregated corruption CSV)."""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "export"
HELP = ("write a finished run's RobustBench entry: model_info/<dataset>/<threat>/<id>.json, the adversarial images "
        "as the external evaluation's .pt tensor (--save-adv runs), the corruption CSV (docs/results.md)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN", help="a finished run folder (evaluate --out)")
    p.add_argument("--robustbench", metavar="DIR", help="write RobustBench's files into DIR (outside the run folder)")
    p.add_argument("--model-id", help="the entry's file name, RobustBench style <Name><Year><FirstWordOfTheTitle> "
                                      "(default: the run's model)")
    p.add_argument("--name", help="the paper's title (RobustBench's field 'name')")
    p.add_argument("--authors", help="the paper's authors, comma-separated")
    p.add_argument("--venue", help="e.g. 'NeurIPS 2025' or 'arXiv, Jun 2025'")
    p.add_argument("--link", help="the paper's URL")
    p.add_argument("--reported", metavar="ACC", help="the robust accuracy the paper reports, in percent")
    p.add_argument("--architecture", help="e.g. 'DeiT-Tiny + PID attention' (default: the run's architecture name)")
    p.add_argument("--additional-data", action="store_true", default=None,
                   help="the model was trained with data beyond the dataset's training set")
    p.add_argument("--forward-passes", type=int, metavar="N", help="forward passes per prediction (default 1)")
    p.add_argument("--eps", help="the AutoAttack eps to export when the run holds several (e.g. 4/255)")


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError
    from ..export.robustbench import export_robustbench

    if not args.robustbench:
        raise UserError("export needs a format: --robustbench DIR (RobustBench's model_info JSON, adversarial tensor "
                        "and corruption CSV)")
    got = export_robustbench(args.run_dir, args.robustbench, model_id=args.model_id, name=args.name,
                             authors=args.authors, venue=args.venue, link=args.link, reported=args.reported,
                             architecture=args.architecture, additional_data=args.additional_data,
                             forward_passes=args.forward_passes, eps=args.eps, warn=False)
    import sys

    if got.warning:
        print(f"warning: {got.warning}", file=sys.stderr)
    for note in got.notes:
        print(f"note: {note}", file=sys.stderr)
    for path in got.files:
        print(f"wrote {path}")
    return 0

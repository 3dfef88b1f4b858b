"""``check``: compare results with a committed baseline CSV (regression guard for CI)."""
from __future__ import annotations

import argparse
from typing import List, Optional

NAME = "check"
HELP = ("compare results with a baseline CSV: exit 1 with a diff (old, new, delta, interval) when a number "
        "gets worse beyond --tolerance or a row disappears; --update rewrites the baseline")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="run folder(s), a folder of runs, or a tidy results .csv")
    p.add_argument("--baseline", required=True, help="baseline CSV (e.g. results/baselines/smoke-digits.csv)")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="allowed drop in percentage points before failing (default 0: any drop fails)")
    p.add_argument("--metric", action="append", default=[],
                   help="only these metrics (repeatable or comma-separated), e.g. --metric top1")
    p.add_argument("--significant", action="store_true",
                   help="CI-aware: fail only when the worsening is also significant (95%% interval of new-old entirely "
                        "below 0 for accuracies and AUPR, above 0 for errors such as mCE)")
    p.add_argument("--update", action="store_true", help="rewrite the baseline from these results (deliberately)")
    p.add_argument("--verbose", action="store_true", help="show every compared row, not only the changes")
    p.add_argument("--ce-baseline", metavar="MODEL",
                   help="model whose corruption errors normalize CE/mCE outside ImageNet (its runs must be among "
                        "the results; ImageNet uses AlexNet's published errors)")


def _metrics(raw: List[str]) -> Optional[List[str]]:
    out = [m.strip() for part in raw for m in part.split(",") if m.strip()]
    return out or None


def run(args: argparse.Namespace) -> int:
    from ..results.ci.check import check, update

    metrics = _metrics(args.metric)
    if args.update:
        changes = update(args.results, args.baseline, metrics, ce_baseline=args.ce_baseline)
        counts = changes["status"].value_counts().to_dict()
        print(f"wrote {args.baseline}: {int((changes['status'] != 'MISSING').sum())} rows "
              f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))} against the previous baseline)")
        return 0
    res = check(args.results, args.baseline, tolerance=args.tolerance, metrics=metrics, significant=args.significant,
                ce_baseline=args.ce_baseline)
    print(res.report(verbose=args.verbose))
    return 0 if res.ok else 1

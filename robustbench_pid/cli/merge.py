"""``robustbench-pid merge RUN_DIR``: assemble a sharded run (torchrun ranks, Slurm array tasks,
``--shard i/n`` processes) into the same records and tables a single process would write.

Normally unnecessary: whichever shard finishes last assembles the run itself. Use it to check a
folder, or after shards ran on machines that could not see each other's finish.
"""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "merge"
HELP = ("check that every work unit of a sharded run is present and every (configuration, sample) appears "
        "exactly once, then write records.parquet, summary.csv and run.json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run folder all shards wrote to (--out), or a "
                                                                 "study folder (reproduce --out): all its runs")
    p.add_argument("--quiet", action="store_true", help="print only errors")


def run(args: argparse.Namespace) -> int:
    from ..results.report.report_text import format_summary
    from ..results.files.merge import merge
    from ..studies.table import is_study_folder, merge_study

    if is_study_folder(args.run_dir):  # a study folder (reproduce --out): every row's run, then the table
        table = merge_study(args.run_dir)
        if not args.quiet:
            print(table + f"\nmerged {args.run_dir}  (every row's run folder; table.md, table.csv, table.tex)")
        return 0
    summary = merge(args.run_dir)
    if not args.quiet:
        print(format_summary(summary))
        print(f"\nmerged {args.run_dir}  (records.parquet, summary.csv, run.json)")
    return 0

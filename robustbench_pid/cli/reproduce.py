"""``reproduce STUDY --model M``: run every row of a paper's table and print it with the published numbers beside."""
from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Tuple

from ..errors import UserError
from ..specs import PRECISIONS, PROTOCOLS

NAME = "reproduce"
HELP = ("run a study (a paper's table: `robustbench-pid list studies`) for one model, every row in one study "
        "folder, and print the table with the published values beside this run's")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", metavar="STUDY", help="a shipped study name (`robustbench-pid list studies`) or a .toml path")
    p.add_argument("--model", help="a zoo model (the study maps each published column to one); or --all-columns")
    p.add_argument("--all-columns", action="store_true",
                   help="run every column of the study with its own zoo model, one after another, into one study "
                        "folder (e.g. claims-digits: 13 models on the embedded weights)")
    p.add_argument("--checkpoint", help="the model's weights (as for evaluate); with --all-columns: MODEL=PATH or "
                                        "'COLUMN=PATH', repeatable (a column's own entry first, then its model's; "
                                        "columns without one use their default)",
                   action="append")
    p.add_argument("--checkpoint-dir", help="a folder holding released checkpoints by their registry file names "
                                            "(where `fetch --to DIR` put them), as for evaluate")
    p.add_argument("--allow-pickle", action="store_true", help="allow full unpickling of trusted .pth files")
    p.add_argument("--non-strict", action="store_true", help="load a checkpoint that does not fully fit (recorded)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="architecture argument (repeatable), on top of the column's own")
    p.add_argument("--as", dest="as_column", metavar="COLUMN",
                   help="compare with this published column (default: the column of --model)")
    p.add_argument("--data-root", help="folder holding imagenet/val, imagenet-a, imagenet-r, imagenet-c, imagenet-o")
    p.add_argument("--dataset-root", action="append", default=[], metavar="DATASET=PATH",
                   help="where one dataset is, when not under --data-root by its conventional name (repeatable)")
    p.add_argument("--out", help="study folder (default: results/study-<STUDY>); several models and both "
                                            "protocols can share one")
    p.add_argument("--protocol", choices=PROTOCOLS, help="default: the study's (the paper's own)")
    p.add_argument("--only", action="append", default=[], metavar="ROW", help="run only this row (repeatable)")
    p.add_argument("--skip", action="append", default=[], metavar="ROW", help="leave this row out (repeatable)")
    p.add_argument("--limit", type=int, help="first N samples per row (ImageNet-C/-O: a seeded subset of N)")
    p.add_argument("--subset", type=int, help="a fixed seeded subset of N samples per row")
    p.add_argument("--shard", help="i/n: compute only this shard's work units of every row (merge afterwards)")
    p.add_argument("--dry-run", action="store_true", help="print each row's plan and time estimate; compute nothing")
    p.add_argument("--calibration", metavar="FWD,FB", help="with --dry-run: price the plan at these images/s")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=512,
                   help="samples per work unit, as for evaluate (it seeds the units' random draws: keep one per folder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--converge", action="store_true",
                   help="also a converged standard-protocol value (evaluate --converge) for each L-inf attack row at "
                        "its eps, beside the paper-protocol value and the published one")
    p.add_argument("--converge-tol", metavar="SHARE", help="the ladder's stop share of a work unit's samples (default 0.001, at most 0.05), with --converge")
    p.add_argument("--converge-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="other ladder settings, with --converge (benchmarks/ladder/spec.py LadderSpec)")
    p.add_argument("--save-adv", action="store_true",
                   help="keep the adversarial images of every standard-protocol attack row (and of the --converge "
                        "runs), as evaluate --save-adv does; rows without images are named")


RUN_OPTIONS = ("checkpoint", "checkpoint_dir", "allow_pickle", "non_strict", "model_arg", "limit", "subset", "shard", "batch_size",
               "chunk_size", "seed", "device", "precision", "workers", "quiet", "save_adv")


def _checkpoints(args: argparse.Namespace) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """(model, column or None, checkpoint) per column to run: ``--model`` once, or every column of the study with
    --all-columns (``--checkpoint`` MODEL=PATH or COLUMN=PATH there; columns sharing a model are separately
    trained models, so they must not get one file between them)."""
    given = args.checkpoint or []
    if not args.all_columns:
        if args.model is None:
            raise UserError("reproduce needs --model MODEL (one column) or --all-columns (every column of the study)")
        if len(given) > 1:
            raise UserError(f"--checkpoint given {len(given)} times for one model; give it once "
                            f"(MODEL=PATH pairs are for --all-columns)")
        return [(args.model, args.as_column, given[0] if given else None)]
    if args.model is not None or args.as_column is not None:
        raise UserError("--all-columns runs each column with its own model: drop --model/--as, or drop --all-columns")
    from ..studies.spec import load_study

    columns = load_study(args.study).columns
    ck: Dict[str, str] = {}
    for kv in given:  # split at the last "=": a column name may hold one, a path rarely does
        if "=" not in kv:
            raise UserError(f"--checkpoint {kv!r}: with --all-columns give MODEL=PATH or 'COLUMN=PATH'")
        k, v = (t.strip() for t in kv.rsplit("=", 1))
        if k in ck:
            raise UserError(f"--checkpoint {k}=... is given twice ({ck[k]!r} and {v!r}); give each column or model "
                            f"once")
        ck[k] = v
    names = {c.name for c in columns} | {c.model for c in columns}
    unknown = sorted(set(ck) - names)
    if unknown:
        raise UserError(f"--checkpoint {unknown[0]}=...: {unknown[0]!r} is no column or column's model in study "
                        f"{args.study!r}; columns: {', '.join(repr(c.name) for c in columns)}")
    out = [(c.model, c.name, ck.get(c.name, ck.get(c.model))) for c in columns]
    by_model: Dict[Tuple[str, Optional[str]], List[str]] = {}
    for model, col, path in out:
        by_model.setdefault((model, path), []).append(str(col))
    for (model, path), cols in by_model.items():
        if len(cols) > 1:
            raise UserError(f"columns {', '.join(repr(c) for c in cols)} are separately trained models of {model!r} "
                            f"but would all load {path or 'its default weights'}: give each its own with "
                            f"--checkpoint 'COLUMN=PATH'")
    if not args.dry_run:  # a plan builds a column without weights untrained (run/plan_data.py)
        _check_weights(args.study, out)
    return out


def _check_weights(study_name: str, checkpoints: List[Tuple[str, Optional[str], Optional[str]]]) -> None:
    """Every column's model has weights for every dataset family the study uses, before any column runs."""
    from ..data import dataset_info
    from ..models.zoo import resolve_model
    from ..studies.spec import load_study

    families = sorted({dataset_info(r.dataset).family for r in load_study(study_name).rows})
    for model, col, ck in checkpoints:
        for family in families:
            try:
                resolve_model(model, family, ck)
            except UserError as exc:
                raise UserError(f"{exc} (with --all-columns: --checkpoint {model}=PATH or '{col}=PATH')") from None


def _save_adv_rows(args: argparse.Namespace, converge: bool) -> None:
    """Which rows keep images under --save-adv (standard-protocol attack rows, and every --converge run); the
    others are named, and a study where none would is refused."""
    from ..studies.spec import load_study

    study = load_study(args.study)
    protocol = args.protocol or study.protocol
    rows = [r for r in study.rows if not args.only or r.name in args.only]
    keep = [r.name for r in rows if r.attack is not None and protocol == "standard"]
    left = [r.name for r in rows if r.name not in keep]
    if not keep and not converge:
        raise UserError(f"--save-adv: no row of study {args.study!r} keeps images ({protocol} protocol"
                        f"{'' if protocol == 'standard' else ': its perturbed tensors are not images'}); add "
                        f"--protocol standard or --converge, or drop --save-adv")
    if left and not args.quiet:
        print(f"note: --save-adv: rows {', '.join(left)} keep no images (not attack rows, or the "
              f"{protocol} protocol){'; their --converge runs do' if converge else ''}")


def run(args: argparse.Namespace) -> int:
    from ..run.spec_builder import key_values
    from ..studies.reproduce import plan_study, reproduce

    if args.calibration and not args.dry_run:
        raise UserError("--calibration prices the plan of a --dry-run; add --dry-run")
    if args.out is not None and not args.out.strip():  # "" would quietly mean the default folder
        raise UserError("--out is empty; give the study folder (leave it out for results/study-<STUDY>)")
    converge = None
    if args.converge:
        converge = {"tol": args.converge_tol, "opt": key_values(args.converge_opt, "--converge-opt")}
    elif args.converge_tol is not None or args.converge_opt:
        raise UserError("--converge-tol / --converge-opt set the convergence ladder; add --converge")
    checkpoints = _checkpoints(args)
    model_arg = key_values(args.model_arg, "--model-arg")
    if args.save_adv:
        _save_adv_rows(args, converge is not None)
    if args.dry_run:  # a plan prices datasets and weights that are not on this machine (studies/dryrun.py)
        from ..studies.dryrun import dry_plan as plan_study
    plans = [(plan_study(args.study, model, data_root=args.data_root, dataset_root=args.dataset_root, out=args.out,
                         as_column=col, protocol=args.protocol, only=args.only, skip=args.skip, model_arg=model_arg), ck)
             for model, col, ck in checkpoints]  # every column's plan checked before any runs
    table = None
    for c, (plan, ck) in enumerate(plans):
        opts = {k: getattr(args, k) for k in RUN_OPTIONS}
        opts["checkpoint"] = ck
        opts["model_arg"] = model_arg
        if args.dry_run:
            from ..studies.dryrun import study_dry_run

            study_dry_run(plan, converge=converge, **opts, calibration=args.calibration)
            continue
        column = f"column {c + 1}/{len(plans)} {plan.column.name!r} ({plan.model}): " if len(plans) > 1 else ""
        table = reproduce(plan, converge=converge, column=column, first=c == 0, **opts)
    if args.dry_run:
        return 0
    plan = plans[-1][0]
    if table is None:
        print(f"\nthis shard's rows are done; results are in {plan.out}. Once every shard has finished, "
              f"`robustbench-pid merge {plan.out}` checks the runs and writes the table")
        return 0
    print("\n" + table)
    print(f"wrote {plan.out}  (table.md, table.csv, table.tex; one run folder per row)")
    return 0

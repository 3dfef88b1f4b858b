"""``reproduce --dry-run``: each row's plan, passes and time estimate, and the study's total; writes nothing.

The passes per unit come from the benchmark and the attack (``dryrun.unit_passes``), the seconds
per pass from one calibration batch per row on the row's own data (or ``--calibration FWD,FB``).
``row_passes`` gives the same pass counts per image without any data or model (docs/studies.md).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..benchmarks import get_benchmark
from ..results.files.run_files import unit_done
from ..specs import Unit
from .spec import Row, attack_settings
from ..run.dryrun import _fmt_s
from .reproduce import StudyPlan, converge_specs, report_missing, row_spec

IMAGENET_C_CONDITIONS = 75  # 15 corruptions x 5 severities, each image passes once per condition


def row_passes(row: Row) -> Tuple[float, float]:
    """(forward, forward+backward) passes per source image of a row, every sample attacked to the end:
    the clean pass, plus the attack's passes (adversarial), or one pass per ImageNet-C condition."""
    bench = row.benchmark or ("imagenet_c" if row.dataset == "imagenet-c" else
                              "adversarial" if row.attack is not None or row.dataset in ("imagenet", "digits")
                              else "restricted")
    if bench == "cost":  # one batch, per sample of it: warm-up + 3 timed passes of each kind + the counted pass
        return get_benchmark("cost").passes(None, Unit("cost", "clean", 0.0, "", "", 0, 1))
    if row.attack is None:
        return (1.0 + IMAGENET_C_CONDITIONS, 0.0) if bench == "imagenet_c" else (1.0, 0.0)
    params = attack_settings(row)
    from ..attacks import get_attack

    full = get_attack(row.attack["name"]).from_params(params).params()
    u = Unit("adversarial", row.attack["name"], float(full.get("eps", 0.0)), json.dumps(full, sort_keys=True), "", 0, 1)
    f, b = get_benchmark("adversarial").passes(None, u)
    return 1.0 + f, b


def dry_plan(study_name: str, model: str, *, data_root: Optional[str] = None, dataset_root: Sequence[str] = (),
             out: Optional[str] = None, as_column: Optional[str] = None, protocol: Optional[str] = None,
             only: Sequence[str] = (), skip: Sequence[str] = (),
             model_arg: Optional[Dict[str, Any]] = None) -> StudyPlan:
    """``plan_study`` for a dry run: the same rows, roots and checks, but a row whose dataset is not on this
    machine is no missing row: it is priced at the dataset's published size (``run/plan_data``), and the plan says
    so. A laptop plans a GPU machine's study this way."""
    from ..data import dataset_info
    from .reproduce import base_plan, find_root

    plan, needed, overrides = base_plan(study_name, model, dataset_root, out, as_column, protocol, only, skip,
                                        model_arg)
    for ds in sorted(needed):
        plan.roots[ds] = find_root(ds, data_root, overrides)[0] if dataset_info(ds).needs_root else None
    return plan


def study_dry_run(plan: StudyPlan, converge: Optional[Dict[str, Any]] = None, **opts: Any) -> float:
    """Print each row's units to do, passes and estimated seconds (this process's shard); return the total.
    ``converge`` (``reproduce --converge``): the converged runs of the eligible rows too, their settings checked
    as a real run checks them."""
    from ..run.context import prepare
    from ..run.dryrun import calibrate, unit_passes
    from ..run.plan_data import plan_notes
    from ..runtime.launcher import launch
    from ..run.plan import plan_units, shard_units

    report_missing(plan)
    rows = [r for r in plan.rows if r.name not in plan.missing]
    runs = [(r, r.name, row_spec(plan, r, **{**opts, "dry_run": True}), plan.row_dir(r)) for r in rows]
    if converge is not None:  # every setting checked before anything is printed
        runs += [(r, f"{r.name}+conv", spec, spec.out)
                 for r, spec in converge_specs(plan, rows, converge, **{**opts, "dry_run": True})]
    print(f"dry run: study {plan.study.name}, model {plan.model} as {plan.column.name!r}, {plan.protocol} protocol, "
          f"folder {plan.out}")
    print(f"{'row':20} {'dataset':12} {'samples':>8} {'units':>6} {'to do':>6} {'fwd':>12} {'f+b':>10} {'est.':>10}")
    total = 0.0
    lines: List[str] = []
    measured: Dict[Any, Tuple[float, float]] = {}
    notes: Dict[str, str] = {}
    for r, name, spec, folder in runs:
        ctx = prepare(spec)
        units = plan_units(ctx)
        launched = launch(spec.shard)
        mine = shard_units(units, launched.index, launched.count)
        if spec.calibration is not None:
            t_f, t_fb = 1.0 / spec.calibration[0], 1.0 / spec.calibration[1]
        else:  # one calibration per model, input size and batch: the rows of a study share it
            what = (ctx.model.info["arch"], json.dumps(ctx.model.info["arch_kwargs"], sort_keys=True, default=str),
                    tuple(ctx.model.info["input_size"]), min(ctx.batch_size, len(ctx.indices)), spec.precision)
            if what not in measured:
                measured[what] = calibrate(ctx)
            t_f, t_fb = measured[what]
        for note in plan_notes(ctx):
            notes.setdefault(note.split(";")[0], note)  # once per dataset (and once for the weights)
        todo = [u for u in mine if not unit_done(folder / "units", u.key)]
        f = sum(unit_passes(ctx, u)[0] * (u.stop - u.start) for u in todo)
        b = sum(unit_passes(ctx, u)[1] * (u.stop - u.start) for u in todo)
        est = f * t_f + b * t_fb
        total += est
        lines.append(f"{name[:20]:20} {r.dataset:12} {len(ctx.indices):>8} {len(mine):>6} {len(todo):>6} "
                     f"{f:>12.0f} {b:>10.0f} {_fmt_s(est):>10}")
    print("\n".join(lines))
    for note in notes.values():
        print(note)
    basis = "the given calibration" if opts.get("calibration") else \
        f"{len(measured)} calibration batch(es) on this device (one per model and input size, after a warm-up)"
    print(f"total: about {_fmt_s(total)} at {basis} (an estimate, not a bound: early stopping and samples not "
          f"attacked make it shorter, data loading longer). Nothing was computed or written.")
    return total


# docs/scaling.md's one-H100 fp32 rates for PID DeiT-tiny (issue 10's f+b figure, forward at ratio 2.0)
H100_RATES = (7882.0, 3941.0)
DOC_IMAGES = 50_000
COST_BATCH = 128  # the cost benchmark measures one batch (--batch-size, default 128), not the whole set


def studies_markdown(images: int = DOC_IMAGES, rates: Tuple[float, float] = H100_RATES) -> str:
    """docs/studies.md's generated part: each shipped study, its columns, rows, datasets and expected cost
    per model (passes per image from :func:`row_passes`, x ``images``, at ``rates`` images/s)."""
    from .spec import METRICS, load_study, row_setting, study_names

    out: List[str] = []
    for name in study_names():
        s = load_study(name)
        out += [f"### `{name}`", "", f"{s.title}. Source: {s.source}. Default protocol: `{s.protocol}`.", ""]
        out.append("Columns: " + "; ".join(f"{c.name} = `{c.model}`" + (
            " (" + ", ".join(f"{k}={v}" for k, v in c.model_args.items()) + ")" if c.model_args else "")
            for c in s.columns) + ".")
        out += ["", "| row | label | metrics | dataset and settings | fwd / img | f+b / img | est. per model |",
                "|---|---|---|---|---|---|---|"]
        total = 0.0
        for r in s.rows:
            f, b = row_passes(r)
            est = (COST_BATCH if r.benchmark == "cost" else images) * (f / rates[0] + b / rates[1])
            total += est
            out.append(f"| `{r.name}` | {r.label} | {', '.join(METRICS[m] for m in r.metrics)} | {row_setting(r)} | "
                       f"{f:g} | {b:g} | {_fmt_s(est)} |")
        datasets = ", ".join(dict.fromkeys(r.dataset for r in s.rows))
        n = f"one batch of {COST_BATCH} per row" if all(r.benchmark == "cost" for r in s.rows) else \
            f"{images:,} images per row"
        out += ["", f"Datasets: {datasets}. Expected cost: about {_fmt_s(total)} per model on one H100 (fp32) "
                f"for {n}.", ""]
    return "\n".join(out)


if __name__ == "__main__":  # python -m robustbench_pid.studies.dryrun > the generated part of docs/studies.md
    print(studies_markdown())

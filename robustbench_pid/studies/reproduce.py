"""``reproduce``: one command runs a study (a paper's table) for one model, row after row.

Each row is one ordinary run (one RunSpec through ``build_spec`` and the runner) in its own run
folder ``OUT/<model>@<column>/<protocol>/<row>/``, so resume, ``--shard i/n``, ``--limit`` /
``--subset`` and ``merge`` work on the study as they do on a run: re-running the command skips
finished work units; every shard takes its share of each row's units. Several models (one command
each), and both protocols, share one study folder; the table shows a column group per
(model, published column, protocol).

Datasets are found under one ``--data-root`` by their conventional folder names (``DATASET_DIRS``),
or given one by one (``--dataset-root imagenet-c=/path``). Rows whose dataset is missing are
reported before anything runs and left out of the run (the table says so).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import UserError
from ..results.files.run_files import atomic_write_bytes, now, read_json, write_json
from ..run.one_config import check_spec_fits_folder
from ..core.paths import slug
from .folder import ENTRY_FILE, STUDY_FILE, sha256_text
from .table import drop_study_table, is_study_folder, write_study_table
from ..specs import RunSpec
from .spec import CONVERGED_DIR, STUDIES_DIR, Column, Row, Study, attack_settings, load_study

# dataset -> folder under --data-root (imagenet: the validation images, with or without its val/ level)
DATASET_DIRS = {"imagenet": "imagenet/val", "imagenet-a": "imagenet-a", "imagenet-r": "imagenet-r",
                "imagenet-c": "imagenet-c", "imagenet-o": "imagenet-o", "imagenet-v2": "imagenet-v2",
                "imagenet-sketch": "imagenet-sketch"}
# datasets whose samples come in conditions (IN-C) or two halves (IN-O): --limit N is taken as --subset N,
# the first N samples would be one condition / one half only
LIMIT_AS_SUBSET = {"imagenet-c", "imagenet-o"}


@dataclass
class StudyPlan:
    study: Study
    column: Column
    model: str
    protocol: str
    out: Path
    rows: List[Row]
    roots: Dict[str, Optional[str]] = field(default_factory=dict)  # dataset -> root (None: needs none)
    missing: Dict[str, str] = field(default_factory=dict)  # row -> why it cannot run
    # The evaluation folder under the entry; None: the protocol's name ("paper", "standard"). Hook for
    # `reproduce --converge` (the converged-robustness issue): it runs each adversarial row again in the
    # standard protocol with the converged evaluation into variant "converged" (<entry>/converged/<row>/),
    # and the study table and the claims' pair table (studies/pairs.py) show that folder as one more
    # group beside "paper", with no change there.
    variant: Optional[str] = None

    @property
    def entry(self) -> Path:
        return self.out / slug(f"{self.model}@{self.column.name}")

    def row_dir(self, row: Row) -> Path:
        return self.entry / (self.variant or self.protocol) / row.name


def resolve_column(study: Study, model: str, as_column: Optional[str],
                   model_arg: Optional[Dict[str, Any]] = None) -> Column:
    """The published column ``model`` is compared with: ``--as COLUMN``, or the column of that model whose own
    architecture arguments are what ``--model-arg`` sets (rpc_symvit with pap_iterations=4 is the 4-iteration
    column, not the 6-iteration one: its numbers would be filed under another model)."""
    given = dict(model_arg or {})
    cols = ", ".join(f"{c.name!r} ({c.model}" + "".join(f", {k}={v}" for k, v in c.model_args.items()) + ")"
                     for c in study.columns)
    if as_column is not None:
        col = study.column(as_column)
        clash = {k: (v, given[k]) for k, v in col.model_args.items() if k in given and given[k] != v}
        if clash:
            k, (v, g) = next(iter(clash.items()))
            raise UserError(f"--model-arg {k}={g} contradicts column {col.name!r}, whose model has {k}={v}: that is "
                            f"another column's model. Drop --model-arg {k} or pick the column that has it. "
                            f"Columns: {cols}")
        return col
    mine = [c for c in study.columns if c.model == model]
    keys = {k for c in mine for k in c.model_args}  # the arguments that tell this model's columns apart
    if given.keys() & keys:
        fits = [c for c in mine if all(given.get(k, c.model_args.get(k)) == c.model_args.get(k) for k in keys)
                and all(k in given for k in c.model_args)]
        if len(fits) == 1:
            return fits[0]
        raise UserError(f"model {model!r} with --model-arg {', '.join(f'{k}={given[k]}' for k in sorted(given.keys() & keys))} "
                        f"is no single column of study {study.name!r}; pick one with --as COLUMN. Columns: {cols}")
    plain = [c for c in mine if not c.model_args]  # rpc_symvit as it comes: the column without extra arguments
    if len(mine) == 1 or len(plain) == 1:
        return mine[0] if len(mine) == 1 else plain[0]
    if not mine:
        raise UserError(f"model {model!r} is not a column of study {study.name!r}; compare it with one of them "
                        f"with --as COLUMN. Columns: {cols}")
    raise UserError(f"model {model!r} is several columns of study {study.name!r} (with different architecture "
                    f"arguments); pick one with --as COLUMN. Columns: {cols}")


def select_rows(study: Study, only: Sequence[str], skip: Sequence[str]) -> List[Row]:
    for name in [*only, *skip]:
        study.row(name)  # unknown names: refused, listing the rows
    rows = [r for r in study.rows if (not only or r.name in only) and r.name not in skip]
    if not rows:
        raise UserError(f"--only/--skip leave no row of study {study.name!r} to run")
    return rows


def parse_dataset_roots(items: Sequence[str]) -> Dict[str, str]:
    from ..data import datasets

    out: Dict[str, str] = {}
    for kv in items:
        if "=" not in kv:
            raise UserError(f"--dataset-root {kv!r}: expected DATASET=PATH, e.g. imagenet-c=/data/ImageNet-C")
        k, v = (t.strip() for t in kv.split("=", 1))
        if k not in datasets:
            raise UserError(f"--dataset-root {kv!r}: unknown dataset {k!r}; valid: {', '.join(datasets.names())}")
        if k in out:
            raise UserError(f"--dataset-root {k} is given twice ({out[k]!r} and {v!r}); give each dataset once")
        out[k] = v
    return out


def find_root(dataset: str, data_root: Optional[str], overrides: Dict[str, str]) -> Tuple[Optional[str], str]:
    """(root or None, where it was looked for)."""
    if dataset in overrides:
        p = Path(overrides[dataset])
        return (str(p) if p.is_dir() else None), f"{p} (--dataset-root {dataset}=...)"
    if dataset not in DATASET_DIRS:
        return None, f"no conventional folder: give --dataset-root {dataset}=PATH"
    if data_root is None:
        return None, f"no --data-root given (looked for DATA_ROOT/{DATASET_DIRS[dataset]})"
    p = Path(data_root) / DATASET_DIRS[dataset]
    if dataset == "imagenet" and not p.is_dir() and (p.parent / "n01440764").is_dir():
        p = p.parent  # imagenet/<wnid>/ without the val/ level
    return (str(p) if p.is_dir() else None), str(p)


def base_plan(study_name: str, model: str, dataset_root: Sequence[str], out: Optional[str], as_column: Optional[str],
              protocol: Optional[str], only: Sequence[str], skip: Sequence[str],
              model_arg: Optional[Dict[str, Any]]) -> Tuple[StudyPlan, set, Dict[str, str]]:
    """A plan without its dataset roots, the datasets its rows need, and the --dataset-root overrides: what a run's
    plan and a dry run's share (they differ in what a missing dataset means)."""
    study = load_study(study_name)
    column = resolve_column(study, model, as_column, model_arg)
    rows = select_rows(study, only, skip)
    plan = StudyPlan(study, column, model, protocol or study.protocol,
                     Path(out) if out else Path("results") / f"study-{study.name}", rows)
    needed = {r.dataset for r in rows} | ({"imagenet"} if {r.dataset for r in rows} & LIMIT_AS_SUBSET else set())
    return plan, needed, parse_dataset_roots(dataset_root)


def plan_study(study_name: str, model: str, *, data_root: Optional[str] = None, dataset_root: Sequence[str] = (),
               out: Optional[str] = None, as_column: Optional[str] = None, protocol: Optional[str] = None,
               only: Sequence[str] = (), skip: Sequence[str] = (),
               model_arg: Optional[Dict[str, Any]] = None) -> StudyPlan:
    from ..data import dataset_info

    plan, needed, overrides = base_plan(study_name, model, dataset_root, out, as_column, protocol, only, skip,
                                        model_arg)
    study, rows = plan.study, plan.rows
    where: Dict[str, str] = {}
    for ds in sorted(needed):
        if not dataset_info(ds).needs_root:
            plan.roots[ds] = None
            continue
        plan.roots[ds], where[ds] = find_root(ds, data_root, overrides)
    for r in rows:
        if dataset_info(r.dataset).needs_root and plan.roots.get(r.dataset) is None:
            plan.missing[r.name] = f"dataset {r.dataset} not found: {where[r.dataset]}"
        elif r.dataset == "imagenet-o" and plan.roots.get("imagenet") is None:
            plan.missing[r.name] = f"imagenet-o needs ImageNet val beside it (its in-distribution half): {where['imagenet']}"
    if len(plan.missing) == len(rows):
        reasons = "; ".join(dict.fromkeys(plan.missing.values()))
        raise UserError(f"no row of study {study.name} can run: {reasons}. Give --data-root DIR holding "
                        f"{', '.join(DATASET_DIRS[d] for d in sorted(needed) if d in DATASET_DIRS)}, "
                        f"or --dataset-root DATASET=PATH")
    return plan


def row_spec(plan: StudyPlan, row: Row, **opts: Any) -> RunSpec:
    """The ordinary RunSpec of one row (``opts``: the ``evaluate`` keywords the command passes on)."""
    from ..run.spec_builder import build_spec

    model_arg = {**plan.column.model_args, **dict(opts.pop("model_arg", None) or {})}
    if opts.get("save_adv") and (row.attack is None or plan.protocol != "standard"):
        opts.pop("save_adv")  # --save-adv: images exist for standard-protocol attack rows only (docs/results.md)
    limit, subset = opts.pop("limit", None), opts.pop("subset", None)
    if row.dataset in LIMIT_AS_SUBSET and limit is not None and subset is None:
        limit, subset = None, limit
    attack: Dict[str, Any] = {}
    if row.attack is not None:
        settings = attack_settings(row)
        eps = settings.pop("eps", None)
        attack = {"attack": [row.attack["name"]], "eps": None if eps is None else [eps], "param": settings}
    needs_in = row.dataset in LIMIT_AS_SUBSET
    return build_spec(plan.model, dataset=row.dataset, data_root=plan.roots.get(row.dataset),
                      imagenet_root=plan.roots.get("imagenet") if needs_in else None, benchmark=row.benchmark,
                      protocol=plan.protocol, model_arg=model_arg, limit=limit, subset=subset,
                      out=plan.row_dir(row), **attack, **opts)


CONVERGED = CONVERGED_DIR  # the entry's sub-folder of --converge runs, beside the protocol folders
MAX_PIXEL_EPS = 16 / 255  # the largest L-inf budget image benchmarks use; a row above it gets no converged column


def converge_eligible(row: Row) -> Tuple[bool, str]:
    """Whether ``row`` gets a converged column (``--converge``) and, if not, why not."""
    from ..attacks import get_attack

    if row.attack is None:
        return False, "not an attack row (clean, corruption or OOD metrics have no eps-ball to converge over)"
    cls = get_attack(row.attack["name"])
    if cls.norm != "linf":
        return False, (f"{cls.norm.upper()} attack: the study converges its L-inf rows only (the seed tables' "
                       f"converged columns)")
    if not cls.worst_case:
        return False, "random noise is not a worst-case search"
    eps = attack_settings(row).get("eps")
    if eps is None:
        return False, "no eps in the row"
    if eps > MAX_PIXEL_EPS:  # e.g. the papers' SPSA eps 0.1, a budget on the normalised tensor
        from ..core.labels import eps_text

        return False, (f"its eps {eps:g} read in pixels ({eps * 255:.3g}/255) is beyond any image threat model "
                       f"(> {eps_text(MAX_PIXEL_EPS, 'linf')}): the converged column runs at the row's eps in pixel "
                       f"units, and this row's eps only means something on the paper's normalised tensor")
    return True, ""


def converge_specs(plan: StudyPlan, rows: Sequence[Row], converge: Dict[str, Any], say: bool = True, **opts: Any
                   ) -> List[Tuple[Row, RunSpec]]:
    """One standard-protocol ``--converge`` run per eligible row, at the row's eps (pixel units), in
    ``<entry>/converged/<row>``; the others are named with the reason on the terminal (``say``: the first column
    of an --all-columns run says it for all)."""
    from ..run.spec_builder import build_spec

    out = []
    for r in rows:
        ok, why = converge_eligible(r)
        if not ok:
            if say and not opts.get("quiet"):
                print(f"converge: row {r.name!r} gets no converged value: {why}")
            continue
        settings = attack_settings(r)
        eps = settings.pop("eps")
        o = dict(opts)
        model_arg = {**plan.column.model_args, **dict(o.pop("model_arg", None) or {})}
        out.append((r, build_spec(plan.model, dataset=r.dataset, data_root=plan.roots.get(r.dataset),
                                  protocol="standard", model_arg=model_arg, attack=[r.attack["name"]], eps=[eps],
                                  param=settings, out=plan.entry / CONVERGED / r.name, converge=True,
                                  converge_tol=converge.get("tol"), converge_opt=converge.get("opt"), **o)))
    return out


def prepare_folder(plan: StudyPlan, checkpoint: Optional[str]) -> None:
    """The study copy and the entry file; a folder holding another study is refused."""
    plan.out.mkdir(parents=True, exist_ok=True)
    copy = plan.out / STUDY_FILE
    text = plan.study.path.read_text()
    if is_study_folder(plan.out) and copy.read_text() != text:
        upgrade_folder(plan, copy)
    if not copy.is_file():  # written, not copied: a symlink standing there is replaced, never written through
        atomic_write_bytes(copy, plan.study.path.read_bytes(), durable=False)
    plan.entry.mkdir(exist_ok=True)
    old = read_json(plan.entry / ENTRY_FILE)  # a damaged or edited one is rewritten (its runs are kept)
    created = old.get("created") if isinstance(old, dict) and isinstance(old.get("created"), str) else None
    # shipped and study_sha256: what the table checks the study copy against (studies/folder.py)
    write_json(plan.entry / ENTRY_FILE, {"study": plan.study.name, "model": plan.model, "column": plan.column.name,
                                         "model_args": plan.column.model_args, "checkpoint": checkpoint,
                                         "shipped": plan.study.path.resolve().parent == STUDIES_DIR,
                                         "study_sha256": sha256_text(copy), "created": created or now()})


def upgrade_folder(plan: StudyPlan, copy: Path) -> None:
    """A folder made by an earlier version of the same shipped study, which since gained rows, columns or claims
    (and changed nothing the folder holds), is brought up to the current definition: its copy is replaced and
    every entry records the new copy's sha256; its finished runs stay valid. Any other difference is refused."""
    from .folder import entries, study_difference
    from .spec import parse_study

    shipped = plan.study.path.resolve().parent == STUDIES_DIR
    diff = None
    try:
        old = parse_study(copy, name=plan.study.name)
        diff = study_difference(old, plan.study, extension=True)
    except UserError as exc:
        diff = str(exc)
    if not shipped or diff is not None:
        raise UserError(f"{plan.out} holds another study (its {STUDY_FILE} differs from {plan.study.path}"
                        f"{f' in {diff}' if diff else ''}); give another --out")
    found = entries(plan.out)
    atomic_write_bytes(copy, plan.study.path.read_bytes(), durable=False)
    for e in found:
        info = {k: v for k, v in e.items() if k != "dir"}
        write_json(e["dir"] / ENTRY_FILE, {**info, "study_sha256": sha256_text(copy)})
    print(f"note: {plan.out} was made by an earlier version of study {plan.study.name!r}; it now holds the current "
          f"one (its rows, columns and claims are a superset; the finished runs are kept)")


def report_missing(plan: StudyPlan) -> None:
    for name, why in plan.missing.items():
        print(f"missing: row {name!r} will not run: {why} (give --dataset-root DATASET=PATH, or --skip {name})")


def reproduce(plan: StudyPlan, converge: Optional[Dict[str, Any]] = None, column: str = "", first: bool = True,
              **opts: Any) -> Optional[str]:
    """Run every row of ``plan`` that can run; the table's Markdown once every row is complete, else None.
    ``converge`` ({"tol": ..., "opt": ...}): also a converged standard-protocol run per L-inf attack row.
    ``column``: which column of an --all-columns run this is, said on each row's line (no line of its own);
    ``first``: whether this column says what holds for every column (the rows that get no converged value)."""
    from ..run.context import check_arguments
    from ..run.runner import run

    report_missing(plan)
    rows = [r for r in plan.rows if r.name not in plan.missing]
    specs = [(r, row_spec(plan, r, **dict(opts))) for r in rows]  # every row's settings checked before any work
    if converge is not None:
        specs += converge_specs(plan, rows, converge, say=first, **opts)
    for r, spec in specs:  # --shard, --batch-size, --workers ...: refused before anything is written
        check_arguments(spec)
    for r, spec in specs:  # one configuration per row folder, refused before any row runs (one_config.py)
        check_spec_fits_folder(spec.out, spec.as_dict())
    prepare_folder(plan, opts.get("checkpoint"))  # only now: nothing is written for a command that is refused
    drop_study_table(plan.out)  # stale from here on; written again below once every row is complete
    for i, (r, spec) in enumerate(specs):
        if not spec.quiet:
            print(f"{column}[{i + 1}/{len(specs)}] row {r.name!r} ({r.label}): {spec.dataset}, {plan.protocol} protocol "
                  f"-> {spec.out}")
        run(spec)
    done = all((read_json(spec.out / "run.json") or {}).get("status") == "complete" for _, spec in specs)
    return write_study_table(plan.out) if done else None

"""Studies: a paper's table as data (``robustbench_pid/studies/*.toml``, or any path).

    title = "..."                      # what the table is
    source = "..."                     # paper, table, section it comes from
    protocol = "paper"                 # the protocol the paper used: the study's default
    description = "..."                # settings, readings, caveats (optional)
    [[column]]                         # one published model column
    name = "PID DeiT"                  # as the paper labels it
    model = "pid_deit"                 # the zoo model that reproduces it
    model_args = { pap_iterations = 4 }   # optional architecture arguments
    [[row]]                            # one row of the paper's table, in the paper's order
    name = "pgd"                       # what --only/--skip take
    label = "PGD"                      # as the paper labels it
    dataset = "imagenet"               # a registered dataset (its default benchmark unless `benchmark`)
    attack = { name = "pgd", eps = "3/255", steps = 20 }   # adversarial rows: one attack setting
    metrics = ["top1", "top5"]         # in the paper's order
    published."PID DeiT" = { top1 = 15.08, top5 = 39.69 }  # per column and metric; omit for none
    note = "..."                       # optional: one line the table prints (e.g. the paper's unit)
    [[pair]]                           # optional: a claim "method beats baseline", tested per row
    claim = "PID DeiT over softmax DeiT"   # what the paper claims
    source = "PIDformer Table 1"       # where it claims it
    baseline = "Softmax DeiT"          # a column name
    method = "PID DeiT"                # a column name

With pairs, the study folder also gets ``pairs.md`` / ``pairs.csv``: per pair, row and protocol,
both accuracies, the difference (method - baseline) on the same images, McNemar's exact p-value
and a 95% interval of the paired difference (``studies/pairs.py``).

A row either declares no published value (a figure without printed numbers) or one for every
column and metric. Everything is checked: an unknown key, column, dataset, benchmark, attack or
setting, a metric the row does not list, or a missing published value is refused with the file,
the key and the reason. Parsing is torch-free (the result side reads the study copy in a study
folder); :func:`check_names` looks the names up in the registries (imported inside it).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..core.paths import check_path_name, slug
from ..errors import UserError

STUDIES_DIR = Path(__file__).resolve().parent  # the *.toml files beside this module
CONVERGED_DIR = "converged"  # an entry's folder of `reproduce --converge` runs, beside the protocol folders
TOP_KEYS = {"title", "source", "protocol", "description", "column", "row", "pair"}
PAIR_KEYS = {"claim", "source", "baseline", "method"}
COLUMN_KEYS = {"name", "model", "model_args"}
ROW_KEYS = {"name", "label", "dataset", "benchmark", "attack", "metrics", "published", "note"}
# metric name -> how the paper labels it; "corrupted_top1" is 100 - mean_err (IN-C top-1 over 15 x 5),
# "params_m" the cost benchmark's "params" in millions, "gmac_per_sample" its "macs_per_sample" in 10^9
METRICS = {"top1": "Top-1 Acc (%)", "top5": "Top-5 Acc (%)", "mce": "mCE (↓)", "relative_mce": "relative mCE (↓)",
           "corrupted_top1": "Top-1 Acc (%)", "mean_err": "mean error (↓)", "aupr": "AUPR", "auroc": "AUROC",
           "fpr95": "FPR at 95% TPR (↓)", "params_m": "Parameters (M)", "flops_per_sample": "FLOPs / sample (2 per multiply-add)",
           "macs_per_sample": "MACs / sample", "gmac_per_sample": "GMAC / image",
           "sec_per_sample_train": "Sec/Sample (Training)", "sec_per_sample_test": "Sec/Sample (Test)",
           "peak_mem_train_mb": "Memory, MiB (Training)", "peak_mem_test_mb": "Memory, MiB (Test)"}
LOWER_IS_BETTER = {"mce", "relative_mce", "mean_err", "fpr95"}


@dataclass(frozen=True)
class Column:
    name: str
    model: str
    model_args: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    name: str
    label: str
    dataset: str
    metrics: List[str]
    benchmark: Optional[str] = None
    attack: Optional[Dict[str, Any]] = None  # {"name": ..., settings...} as written (eps may be "a/b")
    published: Optional[Dict[str, Dict[str, float]]] = None  # column -> metric -> value
    note: str = ""  # one line the table prints under it (e.g. how the paper's unit is read)


@dataclass(frozen=True)
class Pair:
    """A claim: ``method`` is more robust than ``baseline`` (two column names of the study)."""

    claim: str
    source: str
    baseline: str
    method: str


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    title: str
    source: str
    protocol: str
    columns: List[Column]
    rows: List[Row]
    description: str = ""
    pairs: List[Pair] = field(default_factory=list)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise UserError(f"study {self.name!r} has no column {name!r}; columns: "
                        f"{', '.join(repr(c.name) for c in self.columns)}")

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise UserError(f"study {self.name!r} has no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")


def study_names() -> List[str]:
    return sorted(p.stem for p in STUDIES_DIR.glob("*.toml"))


def find_study(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".toml" and p.is_file():
        return p
    # a shipped study is named, not reached by a path: its name is also the default folder results/study-<name>
    cand = STUDIES_DIR / f"{name}.toml"
    if "/" not in name and "\\" not in name and not name.startswith(".") and cand.is_file():
        return cand
    raise UserError(f"unknown study {name!r}: no such file, and not shipped in {STUDIES_DIR}. "
                    f"Valid studies: {', '.join(study_names()) or '(none)'} (`robustbench-pid list studies`)")


def _str(d: Dict[str, Any], key: str, where: str, required: bool = True) -> str:
    v = d.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or not v.strip():
        raise UserError(f"{where}: key {key!r} must be a non-empty string" + (" (missing)" if v is None else ""))
    return v


def _unknown(d: Dict[str, Any], valid: set, where: str) -> None:
    bad = sorted(set(d) - valid)
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(map(repr, bad))}; valid: {', '.join(sorted(valid))}")


def _tables(data: Dict[str, Any], key: str, path: Path, needs: str) -> List[Dict[str, Any]]:
    """The ``[[key]]`` array of tables, refused when absent, empty or holding anything but tables."""
    entries = data.get(key)
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{path}: key '{key}': needs at least one [[{key}]] table ({needs})")
    return entries


def _columns(data: Dict[str, Any], path: Path) -> List[Column]:
    entries = _tables(data, "column", path, "name, model")
    cols: List[Column] = []
    for i, e in enumerate(entries):
        where = f"{path} [[column]] #{i + 1}"
        _unknown(e, COLUMN_KEYS, where)
        args = e.get("model_args", {})
        if not isinstance(args, dict):
            raise UserError(f"{where}: key 'model_args' must be a table, e.g. {{ pap_iterations = 4 }}")
        cols.append(Column(_str(e, "name", where), _str(e, "model", where), dict(args)))
    names = [c.name for c in cols]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"{path}: key 'column': duplicate column name(s) {', '.join(map(repr, dup))}")
    folders: Dict[str, str] = {}
    for n in names:  # a column's runs live in <model>@<slug of its name>: two names must not share that folder
        other = folders.setdefault(slug(n), n)
        if other != n:
            raise UserError(f"{path}: key 'column': column names {other!r} and {n!r} become the same folder name "
                            f"{slug(n)!r} (characters other than letters, digits and . _ @ + - turn into '-'); "
                            f"rename one of them")
    return cols


def _published(e: Dict[str, Any], metrics: List[str], cols: List[Column], where: str) -> Optional[Dict[str, Dict[str, float]]]:
    pub = e.get("published")
    if pub is None:
        return None
    if not isinstance(pub, dict):
        raise UserError(f"{where}: key 'published' must be a table of column -> {{ metric = value }}")
    known = [c.name for c in cols]
    out: Dict[str, Dict[str, float]] = {}
    for col, vals in pub.items():
        if col not in known:
            raise UserError(f"{where}: key 'published.{col}': no such column; columns: {', '.join(map(repr, known))}")
        if not isinstance(vals, dict):
            raise UserError(f"{where}: key 'published.{col}' must be a table {{ metric = value }}")
        for m, v in vals.items():
            if m not in metrics:
                raise UserError(f"{where}: key 'published.{col}.{m}': the row's metrics are {', '.join(metrics)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise UserError(f"{where}: key 'published.{col}.{m}': {v!r} is not a finite number")
        out[col] = {m: float(v) for m, v in vals.items()}
    for c in known:
        for m in metrics:
            if m not in out.get(c, {}):
                raise UserError(f"{where}: key 'published.{c}.{m}': missing. A row with published values needs one "
                                f"for every column and metric (drop 'published' where the paper prints none)")
    return out


def _rows(data: Dict[str, Any], path: Path, cols: List[Column]) -> List[Row]:
    entries = _tables(data, "row", path, "name, label, dataset, metrics")
    rows: List[Row] = []
    for i, e in enumerate(entries):
        where = f"{path} [[row]] #{i + 1}"
        _unknown(e, ROW_KEYS, where)
        name = _str(e, "name", where)
        check_path_name(name, f"{where}: key 'name': the row name", "pgd-4")  # <entry>/<protocol>/<row>/
        where = f"{path} [[row]] {name!r}"
        metrics = e.get("metrics")
        if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
            raise UserError(f"{where}: key 'metrics' must be a non-empty list of metric names ({', '.join(METRICS)})")
        bad = [m for m in metrics if m not in METRICS]
        if bad:
            raise UserError(f"{where}: key 'metrics': unknown metric {bad[0]!r}; valid: {', '.join(METRICS)}")
        attack = e.get("attack")
        if attack is not None and (not isinstance(attack, dict) or not isinstance(attack.get("name"), str)):
            raise UserError(f"{where}: key 'attack' must be a table with a 'name', e.g. {{ name = \"pgd\", eps = \"3/255\" }}")
        rows.append(Row(name, _str(e, "label", where), _str(e, "dataset", where), list(metrics),
                        _str(e, "benchmark", where, required=False) or None, dict(attack) if attack else None,
                        _published(e, list(metrics), cols, where), _str(e, "note", where, required=False)))
    names = [r.name for r in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"{path}: key 'row': duplicate row name(s) {', '.join(map(repr, dup))}")
    return rows


def _pairs(data: Dict[str, Any], path: Path, cols: List[Column]) -> List[Pair]:
    if "pair" not in data:
        return []
    entries = _tables(data, "pair", path, "claim, source, baseline, method")
    known = [c.name for c in cols]
    pairs: List[Pair] = []
    for i, e in enumerate(entries):
        where = f"{path} [[pair]] #{i + 1}"
        _unknown(e, PAIR_KEYS, where)
        pair = Pair(*(_str(e, k, where) for k in ("claim", "source", "baseline", "method")))
        for key in ("baseline", "method"):
            if getattr(pair, key) not in known:
                raise UserError(f"{where}: key {key!r}: no column {getattr(pair, key)!r}; columns: "
                                f"{', '.join(map(repr, known))}")
        if pair.baseline == pair.method:
            raise UserError(f"{where}: baseline and method are the same column {pair.method!r}")
        pairs.append(pair)
    return pairs


def parse_study(path: Path, name: Optional[str] = None) -> Study:
    """The study in ``path``, structurally checked (torch-free; names are checked by :func:`check_names`)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text (TOML files are UTF-8); save it as UTF-8 and run again") from None
    _unknown(data, TOP_KEYS, str(path))
    protocol = _str(data, "protocol", str(path))
    if protocol not in ("standard", "paper"):
        raise UserError(f"{path}: key 'protocol': {protocol!r} is not a protocol; valid: standard, paper")
    cols = _columns(data, path)
    return Study(name or Path(path).stem, Path(path), _str(data, "title", str(path)), _str(data, "source", str(path)),
                 protocol, cols, _rows(data, path, cols), _str(data, "description", str(path), required=False),
                 _pairs(data, path, cols))


def attack_settings(row: Row) -> Dict[str, Any]:
    """The row's attack settings (eps as a number), without the name."""
    from ..core.labels import parse_eps

    out = {k: v for k, v in (row.attack or {}).items() if k != "name"}
    if "eps" in out:
        e = out["eps"]
        if isinstance(e, bool) or not isinstance(e, (str, int, float)):  # true would read as 1.0, a list crash
            raise UserError(f"row {row.name!r}: attack eps {e!r} must be one number or 'a/b' text, e.g. eps = "
                            f"\"4/255\"")
        out["eps"] = parse_eps(e) if isinstance(e, str) else parse_eps(repr(float(e)))
    return out


def check_names(study: Study) -> None:
    """Every dataset, benchmark, attack and attack setting of ``study`` is registered and valid."""
    from ..attacks import get_attack
    from ..benchmarks import benchmark_names
    from ..data import datasets
    from ..registry import UnknownNameError

    for r in study.rows:
        where = f"{study.path} [[row]] {r.name!r}"
        if r.dataset not in datasets:
            raise UserError(f"{where}: key 'dataset': unknown dataset {r.dataset!r}; valid: {', '.join(datasets.names())}")
        bench = r.benchmark or datasets.get(r.dataset).default_benchmark
        if bench not in benchmark_names():
            raise UserError(f"{where}: key 'benchmark': unknown benchmark {bench!r}; valid: {', '.join(benchmark_names())}")
        if r.attack is None:
            continue
        if bench != "adversarial":
            raise UserError(f"{where}: key 'attack': benchmark {bench!r} runs no attacks (attacks need 'adversarial')")
        try:
            cls = get_attack(r.attack["name"])
            cls.from_params(attack_settings(r), where=f"{where} key 'attack'")
        except UnknownNameError as exc:
            raise UserError(f"{where}: key 'attack.name': {exc}") from None
        except UserError as exc:
            msg = str(exc)
            raise UserError(msg if msg.startswith(str(study.path)) else f"{where}: key 'attack': {msg}") from None


def load_study(name: str) -> Study:
    """A shipped study by name, or a path to a .toml file; fully checked."""
    path = find_study(name)
    study = parse_study(path, None if Path(name).suffix == ".toml" else name)
    check_names(study)
    return study


def row_setting(row: Row) -> str:
    """What a row measures, in one line: dataset, and the attack with its settings."""
    if row.attack is None:
        return row.dataset + (f" ({row.benchmark})" if row.benchmark else "")
    settings = ", ".join(f"{k}={v}" for k, v in row.attack.items() if k != "name")
    return f"{row.dataset}: {row.attack['name']}" + (f" ({settings})" if settings else "")


def format_studies(names: Sequence[str] = ()) -> str:
    """``list studies``: one line per shipped study (a screen for all of them); ``list studies NAME``: that study's
    columns (zoo models), rows (the --only/--skip names) and claims in full."""
    out: List[str] = []
    if not names:
        found = [(name, load_study(name)) for name in study_names()]
        wide = max((len(n) for n, _ in found), default=0)
        for name, s in found:
            counts = [f"{k} {w}{'' if k == 1 else 's'}" for k, w in ((len(s.rows), "row"), (len(s.columns), "column"),
                                                                       (len(s.pairs), "claim")) if k]
            out.append(f"{name:{wide}s}  [protocol {s.protocol}]  {', '.join(counts)}: {s.title}")
        out.append("a study's columns, rows (the --only/--skip names) and claims: robustbench-pid list studies NAME")
        return "\n".join(out)
    for name in names:
        s = load_study(name)
        out.append(f"{name}  [protocol {s.protocol}]  {s.title}")
        out.append("    columns: " + ", ".join(f"{c.name} = {c.model}" + (
            "(" + ", ".join(f"{k}={v}" for k, v in c.model_args.items()) + ")" if c.model_args else "")
            for c in s.columns))
        for r in s.rows:
            pub = "published" if r.published else "no published value"
            out.append(f"    {r.name:12s} {r.label:14s} {', '.join(r.metrics):20s} {row_setting(r)}  [{pub}]")
        for pair in s.pairs:
            out.append(f"    claim: {pair.method} vs {pair.baseline} ({pair.source})")
    return "\n".join(out)

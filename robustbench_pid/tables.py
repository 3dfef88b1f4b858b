"""Tables for people: the PIDformer Table 1 shape, long and wide layouts, model comparisons.

Inputs are run folders (per-sample records: the truth, needed for paired tests), tidy DataFrames
(``load_results``) or tidy CSV files (``summary.csv``, a baseline). Every accuracy is shown with
its 95% Wilson interval; mCE and AUPR with their interval when the results carry one, else a
bootstrap interval from the records when those hold what it needs.

Paper layout (one table per dataset and protocol): rows Clean, FGSM, PGD, SPSA, SLD, Noise (top-1
and top-5), then any other attack in the results, then ImageNet-A and -R (top-1), -C (mCE) and -O
(AUPR); one column per model; for each pair of models a delta column (later minus earlier) and a
p-value column from paired tests on the same samples (McNemar exact for accuracies, paired
bootstrap for mCE and AUPR). Which eps an attack row shows: the only one present; else the one
asked for (``eps={"pgd": 3/255}`` or one value for all); else the paper's (FGSM/PGD 3/255, SPSA
0.1, SLD 10, noise 0.3) when present; else the present eps closest to the paper's, the larger one
on ties (the stronger attack). Only eps present for every compared model are candidates when
there are any.

Markdown/LaTeX/CSV are written here (a few lines) rather than through pandas' ``to_markdown``
(needs ``tabulate``) or ``to_latex`` (needs ``jinja2``): exact, dependency-free text that the
tests compare verbatim.
"""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from .errors import UserError
from .stats import average_precision, bootstrap_interval, mcnemar_exact, paired_bootstrap

LAYOUTS = ("paper", "long", "wide")
FORMATS = ("markdown", "latex", "csv")

PAPER_ATTACKS: List[Tuple[str, str]] = [("clean", "Clean"), ("fgsm", "FGSM"), ("pgd", "PGD"), ("spsa", "SPSA"),
                                        ("sld", "SLD"), ("noise", "Noise")]
PAPER_EPS: Dict[str, float] = {"fgsm": 3 / 255, "pgd": 3 / 255, "spsa": 0.1, "sld": 10.0, "noise": 0.3,
                               "worst-case": 3 / 255}  # worst case: the same L-inf grid as FGSM/PGD
EXTRA_LABELS = {"worst-case": "Worst case", "autoattack": "AutoAttack", "square": "Square", "cw": "CW-L2"}
OOD_DATASETS = ("imagenet-a", "imagenet-r", "imagenet-c", "imagenet-o")
METRIC_LABELS = {"top1": "Top-1 Acc (%)", "top5": "Top-5 Acc (%)", "mce": "mCE (↓)", "mean_err": "Mean error (↓)",
                 "aupr": "AUPR"}
CORRUPTION_METRICS = ("mce", "mean_err")  # mean_err: unnormalized, when no CE baseline exists (non-ImageNet)
AGGREGATE_METRICS = CORRUPTION_METRICS + ("aupr",)
ACCURACY_METRICS = ("top1", "top5")
OOD_LABEL_COLUMNS = ("is_ood", "ood", "out_of_distribution", "positive")
CORRUPTION_CONDITION = re.compile(r"^(?P<corruption>[a-z_]+)/(?P<severity>[1-9])$")
EPS_DECIMALS = 10
MISSING = "-"


# ----------------------------------------------------------------------------------------------
# inputs
@dataclass
class Inputs:
    """Tidy results, the per-sample records behind them (when available) and each run's run.json."""

    results: pd.DataFrame
    records: Optional[pd.DataFrame] = None
    runs: List[Dict[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def _run_dirs(p: Path) -> List[Path]:
    if (p / "run.json").is_file():
        return [p]
    return sorted(d.parent for d in p.rglob("run.json"))


def load_inputs(paths: Union[str, Path, Sequence[Union[str, Path]]]) -> Inputs:
    """Run folders (or folders of runs), ``records.parquet`` files or tidy ``.csv`` files."""
    import json

    from .results import summarize

    if isinstance(paths, (str, Path)):
        paths = [paths]
    tidy: List[pd.DataFrame] = []
    recs: List[pd.DataFrame] = []
    runs: List[Dict[str, Any]] = []
    notes: List[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UserError(f"results path not found: {p}")
        if p.is_file() and p.suffix == ".csv":
            df = pd.read_csv(p)
            missing = {"model", "attack", "eps", "metric", "value"} - set(df.columns)
            if missing:
                raise UserError(f"{p}: not a tidy results CSV (missing columns {', '.join(sorted(missing))})")
            tidy.append(df)
            continue
        if p.is_file() and p.suffix == ".parquet":
            recs.append(pd.read_parquet(p))
            continue
        if p.is_file():
            raise UserError(f"{p}: expected a run folder, a records .parquet or a tidy .csv file")
        dirs = _run_dirs(p)
        if not dirs:
            raise UserError(f"no run folders (with run.json) under {p}; run `evaluate` first or pass a "
                            f"results .csv")
        for d in dirs:
            info = json.loads((d / "run.json").read_text())
            if info.get("status") != "complete":
                notes.append(f"skipped incomplete run {d} (status {info.get('status')!r})")
                continue
            if not (d / "records.parquet").is_file():
                notes.append(f"skipped {d}: no records.parquet")
                continue
            runs.append({**info, "path": str(d)})
            recs.append(pd.read_parquet(d / "records.parquet"))
    records = pd.concat(recs, ignore_index=True) if recs else None
    if records is not None:
        tidy.insert(0, summarize(records))
    if not tidy:
        raise UserError(f"no complete runs in {', '.join(map(str, paths))}")
    return Inputs(pd.concat(tidy, ignore_index=True), records, runs, notes)


def as_inputs(data: Any, records: Optional[pd.DataFrame] = None) -> Inputs:
    """Anything a user may hand over: paths, an ``Inputs``, tidy results or per-sample records."""
    from .results import summarize

    if isinstance(data, Inputs):
        return data
    if isinstance(data, (str, Path)) or (isinstance(data, (list, tuple)) and data and
                                         all(isinstance(x, (str, Path)) for x in data)):
        return load_inputs(data)
    if isinstance(data, pd.DataFrame):
        if "sample_id" in data.columns:
            return Inputs(summarize(data), data)
        missing = {"model", "attack", "eps", "metric", "value"} - set(data.columns)
        if missing:
            raise UserError(f"not a tidy results table (missing columns {', '.join(sorted(missing))}); "
                            f"use rbp.load_results(path) or pass a results path")
        run_dir = data.attrs.get("run_dir") if records is None else None
        if run_dir and (Path(run_dir) / "records.parquet").is_file():  # rbp.evaluate(...)'s result
            records = pd.read_parquet(Path(run_dir) / "records.parquet")
        return Inputs(data.copy(), records)
    raise UserError(f"cannot make a table from {type(data).__name__}: pass a results path, "
                    f"rbp.load_results(...) or rbp.load_records(...)")


# ----------------------------------------------------------------------------------------------
# tidy helpers
def eps_text(eps: float, attack: str = "") -> str:
    """3/255-style for L-inf attacks when exact, %g otherwise (an SLD L1 eps of 2 stays '2')."""
    if eps is None or (isinstance(eps, float) and math.isnan(eps)) or eps == 0:
        return "0"
    norm = _attack_norm(attack)
    k = round(eps * 255)
    if norm in ("linf", None) and k > 0 and abs(k / 255 - eps) < 1e-9 and k < 255:
        return f"{k}/255"
    return f"{eps:g}"


def _attack_norm(attack: str) -> Optional[str]:
    try:
        from .attacks import get_attack

        return getattr(get_attack(attack), "norm", None)
    except Exception:  # noqa: BLE001  (an attack name from another installation's results)
        return None


def with_labels(results: pd.DataFrame) -> pd.DataFrame:
    """Adds ``label`` (the model name, plus the checkpoint hash when one name has several) and ``eps_key``."""
    df = results.copy()
    for col, default in (("dataset", ""), ("protocol", ""), ("benchmark", ""), ("condition", ""), ("n", np.nan),
                         ("ci_low", np.nan), ("ci_high", np.nan), ("run_id", ""), ("checkpoint_sha256", None),
                         ("settings_id", ""), ("setting", ""), ("samples_id", "")):
        if col not in df.columns:
            df[col] = default
    for col in ("settings_id", "setting", "samples_id"):  # tidy CSVs from before settings were recorded
        df[col] = df[col].astype("string").fillna("").astype(str)
    df["eps"] = pd.to_numeric(df["eps"], errors="coerce").fillna(0.0).astype(float)
    df["eps_key"] = df["eps"].round(EPS_DECIMALS)
    df["condition"] = df["condition"].astype("string").fillna("").astype(str)
    sha = df["checkpoint_sha256"].astype("string").fillna("")
    df["label"] = df["model"].astype(str)
    n_sha = sha.where(sha != "").groupby(df["model"]).transform("nunique")
    multi = (n_sha > 1) & (sha != "")  # one name, several checkpoints: tell them apart
    df.loc[multi, "label"] = df.loc[multi, "model"].astype(str) + "@" + sha[multi].str[:8]
    return df


# one cell per key: the settings are part of it, so different attacks are never merged into one cell
KEY = ["label", "dataset", "protocol", "benchmark", "attack", "eps_key", "settings_id", "metric", "condition"]


def dedupe(df: pd.DataFrame) -> Tuple[pd.DataFrame, List[str]]:
    """One row per key: when several runs hold the same condition (same settings), keep the one
    with the most samples (then the last run id), and say which run was shown and why."""
    notes: List[str] = []
    dup = df.duplicated(KEY, keep=False)
    out = (df.assign(_n=df["n"].fillna(-1)).sort_values(["_n", "run_id"], kind="stable")
           .drop_duplicates(KEY, keep="last").drop(columns="_n"))
    if dup.any():
        shown: Dict[Tuple[str, str], List[str]] = {}
        kept = out.set_index(KEY)["run_id"]
        for key, g in df[dup].groupby(KEY, sort=False, dropna=False):
            runs = sorted(set(g["run_id"].astype(str)))
            what = f"{key[0]} {key[4]}" + (f" {eps_text(key[5], key[4])}" if key[5] else "")
            pick = str(kept.loc[key]) if key in kept.index else ""
            shown.setdefault((pick, ", ".join(r for r in runs if r != pick)), []).append(what)
        for (pick, others), whats in shown.items():
            notes.append(f"{', '.join(dict.fromkeys(whats))}: identical settings in several runs; shown from "
                         f"run {pick} (most samples, then the last run id), not from {others}")
    return out, notes


def model_order(df: pd.DataFrame, models: Optional[Sequence[str]] = None) -> List[str]:
    present = sorted(df["label"].unique())
    if not models:
        return present
    unknown = [m for m in models if m not in present]
    if unknown:
        raise UserError(f"model(s) {', '.join(unknown)} not in the results; present: {', '.join(present)}")
    return list(models)


# ----------------------------------------------------------------------------------------------
# cell formatting
def fmt_value(v: float, lo: float = float("nan"), hi: float = float("nan")) -> str:
    if v is None or pd.isna(v):
        return MISSING
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return f"{v:.2f}"
    return f"{v:.2f} [{lo:.1f}, {hi:.1f}]"


def fmt_delta(d: Optional[float]) -> str:
    return MISSING if d is None or pd.isna(d) else f"{d:+.2f}"


def fmt_p(p: Optional[float], alpha: float = 0.05, floor: float = 0.0) -> str:
    """``floor``: the resolution of a bootstrap p-value (1/resamples): at the floor it reads "≤floor"."""
    if p is None or pd.isna(p):
        return "n/a"
    if floor and p <= floor:
        s = f"≤{floor:.3g}"
    else:
        s = "<0.001" if p < 0.001 else f"{p:.3f}"
    return s + (" *" if p < alpha else "")


# ----------------------------------------------------------------------------------------------
# paired tests from records
def _records_for(records: pd.DataFrame, row: Mapping[str, Any]) -> pd.DataFrame:
    """The per-sample records behind one tidy row (its run, dataset, protocol, attack, eps)."""
    m = records["run_id"] == row["run_id"]
    aggregate = row.get("metric") in AGGREGATE_METRICS  # computed over many conditions/attack labels of a run
    for col in ("model", "dataset", "protocol", "benchmark") + (() if aggregate else ("attack",)):
        if col in records.columns and col in row and row[col] != "":
            m &= records[col] == row[col]
    if "eps" in records.columns and not aggregate:
        m &= records["eps"].astype(float).round(EPS_DECIMALS) == row["eps_key"]
    if "settings_id" in records.columns and row.get("settings_id") and not aggregate:
        m &= records["settings_id"] == row["settings_id"]
    out = records[m]
    if out.empty and row.get("attack") == "worst-case":  # derived at summary time: derive it per sample too
        try:
            from .benchmarks.adversarial import worst_case_records
        except ImportError:
            return out
        run = records[records["run_id"] == row["run_id"]]
        wc = worst_case_records(run)
        if wc.empty:
            return wc
        wc = wc[wc["eps"].astype(float).round(EPS_DECIMALS) == row["eps_key"]]
        return wc[wc["settings_id"] == row["settings_id"]] if row.get("settings_id") else wc
    return out


def _paired(ra: pd.DataFrame, rb: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    a = ra[["sample_id", *cols]].drop_duplicates("sample_id")
    b = rb[["sample_id", *cols]].drop_duplicates("sample_id")
    return a.merge(b, on="sample_id", suffixes=("_a", "_b"))


def _corruptions_15() -> List[str]:
    try:
        from .imagenet_info import CORRUPTIONS_15
    except ImportError:
        return []
    return list(CORRUPTIONS_15)


def corruption_error_matrix(recs: pd.DataFrame) -> Optional[Tuple[pd.Index, List[str], np.ndarray]]:
    """(sample ids, 'corruption/severity' conditions, 0/1 top-1 error matrix) or None.

    Only the 15 corruptions that enter mCE when any of them is present (the 4 held-out ones are not
    part of mCE or of the mean error)."""
    if "condition" not in recs.columns or "correct_top1" not in recs.columns:
        return None
    r = recs[recs["condition"].astype(str).str.match(CORRUPTION_CONDITION)]
    c15 = set(_corruptions_15())
    names = r["condition"].astype(str).str.rsplit("/", n=1).str[0]
    if c15 and names.isin(c15).any():
        r = r[names.isin(c15)]
    if r.empty:
        return None
    mat = r.pivot_table(index="sample_id", columns="condition", values="correct_top1", aggfunc="first")
    mat = mat.dropna()
    return mat.index, list(mat.columns), 1.0 - mat.to_numpy(dtype=float)


def mce_statistic(conditions: Sequence[str], dataset: str, metric: str = "mce"):
    """A function of the (samples x conditions) error matrix giving mCE (AlexNet-normalized on
    ImageNet when the metric is available, else the unnormalized mean corruption error x 100), and its name."""
    corr = [CORRUPTION_CONDITION.match(c).group("corruption") for c in conditions]
    if metric == "mce" and dataset.startswith("imagenet"):
        try:
            from .metrics import mean_corruption_error  # provided by the ImageNet-C work
        except ImportError:
            mean_corruption_error = None
        if mean_corruption_error is not None:
            def stat(err: np.ndarray) -> float:
                rates = err.mean(0)
                by: Dict[str, List[float]] = {}
                for c, v in zip(corr, rates):
                    by.setdefault(c, []).append(float(v))
                return float(mean_corruption_error(by))
            return stat, "mCE (AlexNet-normalized)"

    def mean_err(err: np.ndarray) -> float:
        return 100.0 * float(err.mean())
    return mean_err, "unnormalized mean corruption error"


def ood_arrays(recs: pd.DataFrame) -> Optional[Tuple[pd.DataFrame, str]]:
    """Per-sample anomaly scores and OOD labels, when the records hold them."""
    if "score" not in recs.columns:
        return None
    for col in OOD_LABEL_COLUMNS:
        if col in recs.columns:
            return recs[["sample_id", "score", col]].dropna(), col
    return None


def _aupr(score: np.ndarray, label: np.ndarray) -> float:
    return average_precision(score, label)


@dataclass
class Comparison:
    delta: Optional[float]
    pvalue: Optional[float]
    test: str
    n: int = 0
    note: str = ""
    p_floor: float = 0.0  # bootstrap resolution (1 / resamples)


def compare_rows(ra: Mapping[str, Any], rb: Mapping[str, Any], records: Optional[pd.DataFrame],
                 n_boot: int = 1000, seed: int = 0) -> Comparison:
    """Delta (B - A) and a paired p-value for one metric of two models, on the samples both have.

    Only cells of one condition are compared (callers pass rows with equal ``settings_id``); with
    per-sample records Δ is recomputed on the shared samples, without them it is the difference
    of the two values only when both were computed on the same sample set."""
    delta: Optional[float] = float(rb["value"]) - float(ra["value"])
    metric = ra["metric"]
    same_samples = bool(ra.get("samples_id")) and ra.get("samples_id") == rb.get("samples_id")
    unknown_samples = not ra.get("samples_id") or not rb.get("samples_id")
    if records is None or _records_for(records, ra).empty or _records_for(records, rb).empty:
        if not (same_samples or unknown_samples):
            return Comparison(None, None, "", note="different sample sets and no per-sample records to pair them")
        why = "no per-sample records (pass run folders, not tidy tables)" if records is None else \
            "no per-sample records in the inputs"
        return Comparison(delta, None, "", note=why)
    rec_a, rec_b = _records_for(records, ra), _records_for(records, rb)
    if metric in ACCURACY_METRICS:
        col = f"correct_{metric}"
        if col not in rec_a.columns:
            return Comparison(delta, None, "", note=f"records have no {col}")
        pr = _paired(rec_a, rec_b, [col]).dropna()
        if pr.empty:
            return Comparison(delta, None, "", note="the two runs share no samples")
        res = mcnemar_exact(pr[f"{col}_a"].astype(bool), pr[f"{col}_b"].astype(bool))
        delta = 100.0 * (float(pr[f"{col}_b"].astype(bool).mean()) - float(pr[f"{col}_a"].astype(bool).mean()))
        return Comparison(delta, res.pvalue, "McNemar exact", len(pr))
    if metric in CORRUPTION_METRICS:
        ea, eb = corruption_error_matrix(rec_a), corruption_error_matrix(rec_b)
        if ea is None or eb is None:
            return Comparison(delta, None, "", note="mCE: no per-sample corruption records (condition "
                                                    "'corruption/severity', correct_top1)")
        ids = ea[0].intersection(eb[0])
        conds = [c for c in ea[1] if c in eb[1]]
        if len(ids) == 0 or not conds:
            return Comparison(delta, None, "", note="mCE: the two runs share no samples/conditions")
        A = pd.DataFrame(ea[2], index=ea[0], columns=ea[1]).loc[ids, conds].to_numpy()
        B = pd.DataFrame(eb[2], index=eb[0], columns=eb[1]).loc[ids, conds].to_numpy()
        stat, name = mce_statistic(conds, str(ra["dataset"]), metric)
        res = paired_bootstrap(stat, A, B, n_boot=n_boot, seed=seed)
        delta = float(stat(B)) - float(stat(A))
        return Comparison(delta, res.pvalue, f"paired bootstrap ({name})", len(ids), p_floor=1.0 / n_boot)
    if metric == "aupr":
        oa, ob = ood_arrays(rec_a), ood_arrays(rec_b)
        if oa is None or ob is None:
            return Comparison(delta, None, "", note="AUPR: records have no per-sample anomaly score and OOD "
                                                    f"label (columns 'score' and one of {', '.join(OOD_LABEL_COLUMNS)})")
        pr = oa[0].rename(columns={oa[1]: "ood"}).drop_duplicates("sample_id").merge(
            ob[0].rename(columns={ob[1]: "ood"}).drop_duplicates("sample_id"), on="sample_id", suffixes=("_a", "_b"))
        if pr.empty:
            return Comparison(delta, None, "", note="AUPR: the two runs share no samples")
        lab = pr["ood_a"].to_numpy().astype(bool)
        delta = _aupr(pr["score_b"].to_numpy(), lab) - _aupr(pr["score_a"].to_numpy(), lab)  # both in percent
        res = paired_bootstrap(_aupr, (pr["score_a"].to_numpy(), lab), (pr["score_b"].to_numpy(), lab),
                               n_boot=n_boot, seed=seed, strata=lab)
        return Comparison(delta, res.pvalue, "paired bootstrap (AUPR)", len(pr), p_floor=1.0 / n_boot)
    return Comparison(delta, None, "", note=f"no paired test for metric {metric!r}")


def interval_from_records(row: Mapping[str, Any], records: Optional[pd.DataFrame],
                          n_boot: int = 1000, seed: int = 0) -> Tuple[float, float]:
    """Bootstrap interval for an mCE or AUPR row when its records allow one."""
    nan = (float("nan"), float("nan"))
    if records is None:
        return nan
    recs = _records_for(records, row)
    if recs.empty:
        return nan
    if row["metric"] in CORRUPTION_METRICS:
        e = corruption_error_matrix(recs)
        if e is None:
            return nan
        stat, _ = mce_statistic(e[1], str(row["dataset"]), row["metric"])
        _, lo, hi = bootstrap_interval(stat, e[2], n_boot=n_boot, seed=seed)
        return lo, hi
    if row["metric"] == "aupr":
        o = ood_arrays(recs)
        if o is None:
            return nan
        lab = o[0][o[1]].to_numpy().astype(bool)
        _, lo, hi = bootstrap_interval(_aupr, (o[0]["score"].to_numpy(), lab), n_boot=n_boot, seed=seed, strata=lab)
        return lo, hi
    return nan


def compare_models(data: Any, models: Optional[Sequence[str]] = None, records: Optional[pd.DataFrame] = None,
                   n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Every metric both models of each pair have, with delta (B - A) and a paired p-value."""
    inp = as_inputs(data, records)
    df, _ = dedupe(with_labels(inp.results))
    order = model_order(df, models)
    rows = []
    cond = ["dataset", "protocol", "benchmark", "attack", "eps_key", "settings_id", "metric", "condition"]
    for a, b in combinations(order, 2):
        da = df[df["label"] == a].set_index(cond)
        db = df[df["label"] == b].set_index(cond)
        for key in da.index.intersection(db.index):
            ra, rb = da.loc[key].to_dict(), db.loc[key].to_dict()
            ra.update(dict(zip(cond, key)))
            rb.update(dict(zip(cond, key)))
            c = compare_rows(ra, rb, inp.records, n_boot=n_boot, seed=seed)
            rows.append({**dict(zip(cond, key)), "setting": ra.get("setting", ""), "model_a": a, "model_b": b,
                         "value_a": ra["value"],
                         "value_b": rb["value"], "delta": c.delta, "test": c.test, "n_paired": c.n,
                         "pvalue": c.pvalue, "p_floor": c.p_floor,
                         "significant": (c.pvalue is not None and c.pvalue < 0.05),
                         "note": c.note})
    out = pd.DataFrame(rows)
    if len(out):
        out = out.rename(columns={"eps_key": "eps"})
    return out


# ----------------------------------------------------------------------------------------------
# table object and renderers
@dataclass
class Table:
    """A rendered table: string cells plus the notes that explain them."""

    frame: pd.DataFrame
    title: str = ""
    notes: List[str] = field(default_factory=list)

    def to_markdown(self) -> str:
        return render_markdown([self])

    def to_latex(self) -> str:
        return render_latex([self])

    def to_csv(self) -> str:
        return render_csv([self])

    def __str__(self) -> str:
        return self.to_markdown()

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        return render_html([self])


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|")


def render_markdown(tables: Sequence[Table]) -> str:
    parts: List[str] = []
    for t in tables:
        lines: List[str] = []
        if t.title:
            lines += [f"### {t.title}", ""]
        cols = list(t.frame.columns)
        lines.append("| " + " | ".join(_md_escape(c) for c in cols) + " |")
        lines.append("|" + "|".join("---" for _ in cols) + "|")
        for _, r in t.frame.iterrows():
            lines.append("| " + " | ".join(_md_escape(r[c]) for c in cols) + " |")
        if t.notes:
            lines += ["", "Notes:"] + [f"- {n}" for n in t.notes]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(s: Any) -> str:
    out = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(s))
    return (out.replace("↓", r"$\downarrow$").replace("≤", r"$\leq$").replace("Δ", r"$\Delta$").replace("−", "-")
            .replace("<0.001", r"$<$0.001"))


def render_latex(tables: Sequence[Table]) -> str:
    parts: List[str] = []
    for t in tables:
        cols = list(t.frame.columns)
        lines = [f"% {t.title}" if t.title else "%", r"\begin{tabular}{" + "l" * 2 + "r" * (len(cols) - 2) + "}",
                 r"\hline", " & ".join(_tex(c) for c in cols) + r" \\", r"\hline"]
        for _, r in t.frame.iterrows():
            lines.append(" & ".join(_tex(r[c]) for c in cols) + r" \\")
        lines += [r"\hline", r"\end{tabular}"]
        lines += [f"% {_tex(n)}" for n in t.notes]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def render_csv(tables: Sequence[Table]) -> str:
    frames = []
    for t in tables:
        f = t.frame.copy()
        if len(tables) > 1 or t.title:
            f.insert(0, "table", t.title)
        frames.append(f)
    return pd.concat(frames, ignore_index=True).to_csv(index=False)


def render_html(tables: Sequence[Table]) -> str:
    parts = []
    for t in tables:
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in t.frame.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in t.frame.columns) + "</tr>"
                       for _, r in t.frame.iterrows())
        notes = ("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in t.notes) + "</ul>"
                 if t.notes else "")
        title = f"<h3>{html.escape(t.title)}</h3>" if t.title else ""
        parts.append(f"{title}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}")
    return "\n".join(parts)


def render(tables: Sequence[Table], fmt: str = "markdown") -> str:
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    return {"markdown": render_markdown, "latex": render_latex, "csv": render_csv}[fmt](tables)


# ----------------------------------------------------------------------------------------------
# layouts
def _parse_eps_choice(eps: Union[None, float, str, Mapping[str, Any]]) -> Dict[str, float]:
    """``None``, one eps for every attack (``"3/255"`` or a float, key ``*``), ``"pgd=4/255,fgsm=2/255"`` or a mapping."""
    from .attacks.base import parse_eps

    if eps is None:
        return {}
    if isinstance(eps, Mapping):
        return {str(k): (parse_eps(v) if isinstance(v, str) else float(v)) for k, v in eps.items()}
    if isinstance(eps, (int, float)):
        return {"*": float(eps)}
    out: Dict[str, float] = {}
    for part in str(eps).split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = parse_eps(v)
        else:
            out["*"] = parse_eps(part)
    return out


def choose_eps(attack: str, present_by_model: Mapping[str, Iterable[float]],
               chosen: Mapping[str, float]) -> Tuple[Optional[float], str]:
    """The eps an attack row shows, and why (see the module docstring)."""
    sets = [{round(float(e), EPS_DECIMALS) for e in v} for v in present_by_model.values() if v]
    if not sets:
        return None, ""
    common = set.intersection(*sets)
    cands = sorted(common or set.union(*sets))
    want = chosen.get(attack, chosen.get("*"))
    if want is not None:
        k = round(want, EPS_DECIMALS)
        if k not in cands:
            raise UserError(f"eps {eps_text(want, attack)} for {attack} is not in the results; present: "
                            f"{', '.join(eps_text(e, attack) for e in cands)}")
        return k, "as asked"
    if len(cands) == 1:
        return cands[0], ""
    paper = PAPER_EPS.get(attack)
    if paper is not None and round(paper, EPS_DECIMALS) in cands:
        return round(paper, EPS_DECIMALS), "the paper's eps"
    ref = paper if paper is not None else max(cands)
    best = min(cands, key=lambda e: (round(abs(e - ref), 9), -e))
    why = (f"closest to the paper's {eps_text(paper, attack)}, larger on ties" if paper is not None
           else "the largest present")
    return best, why


def _select(df: pd.DataFrame, **eq: Any) -> pd.DataFrame:
    m = pd.Series(True, index=df.index)
    for k, v in eq.items():
        m &= df[k] == v
    return df[m]


def paper_tables(data: Any, *, models: Optional[Sequence[str]] = None, dataset: Optional[str] = None,
                 protocol: Optional[str] = None, eps: Union[None, float, str, Mapping[str, Any]] = None,
                 compare: bool = True, n_boot: int = 1000, seed: int = 0,
                 records: Optional[pd.DataFrame] = None) -> List[Table]:
    """PIDformer Table 1 shape, one table per (dataset, protocol) in the results."""
    inp = as_inputs(data, records)
    df, notes0 = dedupe(with_labels(inp.results))
    order = model_order(df, models)
    df = df[df["label"].isin(order)]
    chosen = _parse_eps_choice(eps)
    base = sorted(d for d in df["dataset"].unique() if d not in OOD_DATASETS)
    if dataset is not None:
        if dataset not in base:
            raise UserError(f"dataset {dataset!r} not in the results; present: {', '.join(base) or '(none)'}")
        base = [dataset]
    if not base and set(df["dataset"]) & set(OOD_DATASETS):
        base = ["imagenet"]
    if protocol is not None and protocol not in set(df["protocol"]):
        raise UserError(f"protocol {protocol!r} not in the results; present: {', '.join(sorted(set(df['protocol'])))}")
    tables: List[Table] = []
    for ds in base:
        protos = sorted(p for p in df.loc[df["dataset"] == ds, "protocol"].unique()) or [""]
        if ds == "imagenet" and not (df["dataset"] == ds).any():
            protos = sorted(df["protocol"].unique())
        if protocol is not None:
            if protocol not in protos:
                continue
            protos = [protocol]
        for proto in protos:
            t = _paper_table(df, inp, order, ds, proto, chosen, compare, n_boot, seed, len(base) == 1)
            if t is not None:
                t.notes = inp.notes + notes0 + t.notes
                tables.append(t)
    if not tables:
        raise UserError("nothing for the paper layout in these results (no clean/attack, ImageNet-A/R/C/O, mCE "
                        "or AUPR rows" + (f" for dataset {dataset!r}" if dataset else "") +
                        (f" and protocol {protocol!r}" if protocol else "") + ")")
    return tables


def _same_protocol(sub: pd.DataFrame, proto: str, label: str, notes: List[str]) -> pd.DataFrame:
    """Rows of this protocol, else (clean evaluations: the attack protocol does not apply) any, noted."""
    if (sub["protocol"] == proto).any():
        return sub[sub["protocol"] == proto]
    others = sorted(set(sub["protocol"]) - {proto})
    if others and proto:
        notes.append(f"{label}: from {'/'.join(others)}-protocol runs (no attack involved)")
    return sub


def split_by_settings(sub: pd.DataFrame, text: str, label: str, attack: str,
                      notes: List[str]) -> List[Tuple[str, pd.DataFrame]]:
    """The rows of one attack row split by ``settings_id``: one (row label, rows) per setting.

    With one setting the label stays and ``notes`` says which settings the row shows; with
    several, each row label adds the settings that differ (e.g. ``steps 2`` / ``steps 20``)."""
    from .conditions import differing_settings, flat_settings

    ids = list(dict.fromkeys(sub["settings_id"]))
    if attack == "clean":
        return [(text, sub)]
    first = sub.drop_duplicates("settings_id").set_index("settings_id")
    if len(ids) == 1:
        setting = str(first["setting"].iloc[0])
        if setting:
            notes.append(f"{label} = {setting}")
        return [(text, sub)]
    raw = {i: str(first.loc[i, "settings"]) if "settings" in first.columns else "" for i in ids}
    differing = differing_settings(raw.values())
    out = []
    for i in ids:
        flat = flat_settings(raw[i]) or {}
        tag = ", ".join(f"{k} {flat.get(k, '(unset)')}" for k in differing) or str(first.loc[i, "setting"]) or i
        out.append((f"{text} · {tag}", sub[sub["settings_id"] == i]))
        notes.append(f"{label} · {tag} = {first.loc[i, 'setting'] or i}")
    return out


def _paper_table(df: pd.DataFrame, inp: Inputs, order: List[str], ds: str, proto: str,
                 chosen: Mapping[str, float], compare: bool, n_boot: int, seed: int,
                 only_base: bool) -> Optional[Table]:
    rows: List[Tuple[str, str, Dict[str, Dict[str, Any]]]] = []  # (row label, metric, {model: tidy row})
    notes: List[str] = []
    here = _select(df, dataset=ds, protocol=proto)
    acc = here[here["metric"].isin(ACCURACY_METRICS)]
    if (acc["benchmark"] == "adversarial").any():  # not e.g. per-corruption accuracies of `corruptions`
        acc = acc[acc["benchmark"] == "adversarial"]
    elif (acc["attack"] == "clean").any():
        acc = acc[acc["attack"] == "clean"]
    else:
        acc = acc.iloc[0:0]
    attacks_present = list(dict.fromkeys(acc["attack"]))
    known = [a for a, _ in PAPER_ATTACKS]
    extra = sorted((a for a in attacks_present if a not in known and a != "clean"),
                   key=lambda a: (a == "worst-case", a))  # the worst case over attacks comes last
    eps_notes: List[str] = []
    setting_notes: List[str] = []
    for attack, label in PAPER_ATTACKS + [(a, EXTRA_LABELS.get(a, a.upper() if len(a) <= 5 else a)) for a in extra]:
        sub = acc[acc["attack"] == attack]
        if sub.empty:
            continue
        if attack == "clean":
            if "adversarial" in set(sub["benchmark"]):
                sub = sub[sub["benchmark"] == "adversarial"]
            e = None
            text = label
        else:
            present = {m: sorted(set(g["eps_key"])) for m, g in sub.groupby("label")}
            e, why = choose_eps(attack, present, chosen)
            sub = sub[sub["eps_key"] == e]
            text = f"{label} ({eps_text(e, attack)})"
            allp = sorted(set(acc.loc[acc["attack"] == attack, "eps_key"]))
            if len(allp) > 1:
                eps_notes.append(f"{label}: eps {eps_text(e, attack)} ({why}; present: "
                                 f"{', '.join(eps_text(x, attack) for x in allp)})")
        # cells with different settings never share a row (nor a Δ): one row per setting
        for row_text, ss in split_by_settings(sub, text, label, attack, setting_notes):
            for metric in ACCURACY_METRICS:
                cells = {m: r for m, r in ((r["label"], r) for r in ss[ss["metric"] == metric].to_dict("records"))}
                if cells:
                    rows.append((row_text, metric, cells))
    # ImageNet-A/-R (top-1), -C (mCE), -O (AUPR)
    if ds == "imagenet" or only_base:
        for name, label in (("imagenet-a", "ImageNet-A"), ("imagenet-r", "ImageNet-R")):
            sub = df[(df["dataset"] == name) & (df["metric"] == "top1")]
            if (sub["attack"] == "clean").any():
                sub = sub[sub["attack"] == "clean"]
            if not sub.empty:
                sub = _same_protocol(sub, proto, label, notes)
                rows.append((label, "top1", {r["label"]: r for r in sub.to_dict("records")}))
    for metrics, label_in, label_out in ((CORRUPTION_METRICS, "ImageNet-C", f"{ds}-C"), (("aupr",), "ImageNet-O", f"{ds} OOD")):
        dsets = [ds, "imagenet-c" if "mce" in metrics else "imagenet-o"] if (ds == "imagenet" or only_base) else [ds]
        sub = df[df["metric"].isin(metrics) & df["dataset"].isin(dsets)]
        if sub.empty:
            continue
        metric = next(m for m in metrics if (sub["metric"] == m).any())  # mCE when a CE baseline exists
        sub = sub[sub["metric"] == metric]
        row_label = label_in if (ds == "imagenet" or sub["dataset"].str.startswith("imagenet").all()) else label_out
        sub = _same_protocol(sub, proto, row_label, notes)
        if sub.duplicated("label").any():  # e.g. mCE of several corruption sets: keep one per model
            sub = sub.sort_values("n", kind="stable").drop_duplicates("label", keep="last")
        is_in = ds == "imagenet" or (sub["dataset"].str.startswith("imagenet")).all()
        rows.append((label_in if is_in else label_out, metric, {r["label"]: r for r in sub.to_dict("records")}))
    if not rows:
        return None
    cols = ["Attack", "Metric"] + order
    pairs = list(combinations(order, 2)) if compare else []
    for a, b in pairs:
        cols += [f"Δ {b}−{a}", f"p {b} vs {a}"]
    out: List[Dict[str, str]] = []
    tests_used: Dict[str, List[int]] = {}
    pair_notes: List[Tuple[str, str]] = []
    prev_label = None
    for label, metric, cells in rows:
        r: Dict[str, str] = {"Attack": label if label != prev_label else "", "Metric": METRIC_LABELS.get(metric, metric)}
        prev_label = label
        for m in order:
            c = cells.get(m)
            if c is None:
                r[m] = MISSING
                continue
            lo, hi = c.get("ci_low", np.nan), c.get("ci_high", np.nan)
            if metric in AGGREGATE_METRICS and (pd.isna(lo) or pd.isna(hi)):
                lo, hi = interval_from_records(c, inp.records, n_boot=n_boot, seed=seed)
            r[m] = fmt_value(c["value"], lo, hi)
        for a, b in pairs:
            ca, cb = cells.get(a), cells.get(b)
            dcol, pcol = f"Δ {b}−{a}", f"p {b} vs {a}"
            if ca is None or cb is None:
                r[dcol], r[pcol] = MISSING, "n/a"
                continue
            comp = compare_rows(ca, cb, inp.records, n_boot=n_boot, seed=seed)
            r[dcol], r[pcol] = fmt_delta(comp.delta), fmt_p(comp.pvalue, floor=comp.p_floor)
            if comp.test and comp.n not in tests_used.setdefault(comp.test, []):
                tests_used[comp.test].append(comp.n)
            elif comp.note:
                pair_notes.append((label.split(" (")[0], comp.note))
        out.append(r)
    notes += ["cells: value [95% interval]; accuracies use the Wilson interval"]
    ns: Dict[str, List[int]] = {}
    for label, metric, cells in rows:
        for c in cells.values():
            if pd.notna(c.get("n")) and int(c["n"]) not in ns.setdefault(label.split(" (")[0], []):
                ns[label.split(" (")[0]].append(int(c["n"]))
    counts = pd.Series([n for v in ns.values() for n in v])
    if counts.nunique() > 1:
        usual = int(counts.mode().iloc[0])
        odd = [f"{lab} ({'/'.join(map(str, sorted(v)))})" for lab, v in ns.items() if v != [usual]]
        notes.append(f"n: {usual} samples per row, except {', '.join(odd)}")
    if pairs:
        notes.append("Δ: later model minus earlier, in points; p: two-sided paired test on the same samples "
                     "(" + "; ".join(f"{t}, n={'/'.join(map(str, sorted(n)))}" for t, n in tests_used.items()) +
                     "); * p < 0.05"
                     if tests_used else "Δ: later model minus earlier, in points; p: n/a (see below)")
        by_note: Dict[str, List[str]] = {}
        for lab, note in pair_notes:
            if lab not in by_note.setdefault(note, []):
                by_note[note].append(lab)
        notes += [f"p n/a for {', '.join(labs)}: {note}" for note, labs in by_note.items()]
    notes += [f"eps per attack row: {'; '.join(eps_notes)}"] if eps_notes else []
    notes += [f"settings: {'; '.join(setting_notes)}"] if setting_notes else []
    title = f"{ds} · {proto} protocol" if proto else ds
    return Table(pd.DataFrame(out, columns=cols), title, notes)


def long_table(data: Any, records: Optional[pd.DataFrame] = None) -> Table:
    """One line per (model, dataset, protocol, benchmark, attack, eps, metric)."""
    inp = as_inputs(data, records)
    df, notes = dedupe(with_labels(inp.results))
    df = df.sort_values(["label", "dataset", "protocol", "benchmark", "attack", "eps_key", "setting", "metric",
                         "condition"], kind="stable")
    out = pd.DataFrame({
        "model": df["label"], "dataset": df["dataset"], "protocol": df["protocol"], "benchmark": df["benchmark"],
        "attack": df["attack"], "eps": [eps_text(e, a) for e, a in zip(df["eps"], df["attack"])],
        "setting": df["setting"], "metric": df["metric"], "value": [fmt_value(v) for v in df["value"]],
        "ci_low": [fmt_value(v) if pd.notna(v) else "" for v in df["ci_low"]],
        "ci_high": [fmt_value(v) if pd.notna(v) else "" for v in df["ci_high"]],
        "n": [str(int(v)) if pd.notna(v) else "" for v in df["n"]],
    })
    if (df["condition"] != "").any():
        out.insert(6, "condition", df["condition"].to_numpy())
    return Table(out.reset_index(drop=True), "", inp.notes + notes)


def wide_table(data: Any, models: Optional[Sequence[str]] = None, records: Optional[pd.DataFrame] = None) -> Table:
    """One line per condition and metric, one column per model: value [95% interval]."""
    inp = as_inputs(data, records)
    df, notes = dedupe(with_labels(inp.results))
    order = model_order(df, models)
    df = df.assign(cell=[fmt_value(v, lo, hi) for v, lo, hi in zip(df["value"], df["ci_low"], df["ci_high"])])
    keys = ["dataset", "protocol", "benchmark", "attack", "eps_key", "setting", "metric", "condition"]
    wide = df.pivot_table(index=keys, columns="label", values="cell", aggfunc="first").reset_index()
    wide = wide.sort_values(keys, kind="stable")
    out = pd.DataFrame({"dataset": wide["dataset"], "protocol": wide["protocol"], "benchmark": wide["benchmark"],
                        "attack": wide["attack"],
                        "eps": [eps_text(e, a) for e, a in zip(wide["eps_key"], wide["attack"])],
                        "setting": wide["setting"], "metric": wide["metric"]})
    if (wide["condition"] != "").any():
        out["condition"] = wide["condition"].to_numpy()
    for m in order:
        out[m] = wide[m].fillna(MISSING) if m in wide.columns else MISSING
    return Table(out.reset_index(drop=True), "", inp.notes + notes + ["cells: value [95% interval]"])


def tables(data: Any, layout: str = "paper", **kw: Any) -> List[Table]:
    if layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")
    if layout == "paper":
        return paper_tables(data, **kw)
    if layout == "long":
        return [long_table(data, records=kw.get("records"))]
    return [wide_table(data, models=kw.get("models"), records=kw.get("records"))]


def table(data: Any, layout: str = "paper", format: Optional[str] = None, **kw: Any) -> Union[Table, str]:
    """Notebook entry point: a ``Table`` (one) or, with ``format``, the rendered text.

    ``data``: a results path (folder of runs: enables paired tests), ``load_results(...)``'s tidy
    DataFrame or ``load_records(...)``'s per-sample records.
    """
    ts = tables(data, layout=layout, **kw)
    if format is not None:
        return render(ts, format)
    if len(ts) == 1:
        return ts[0]
    return Table(pd.concat([t.frame.assign(**{"table": t.title}) for t in ts], ignore_index=True),
                 "", [n for t in ts for n in t.notes])

"""Tables for people: the PIDformer Table 1 shape, long and wide layouts.

Every accuracy is shown with its 95% Wilson interval; mCE and AUPR with their interval when the
results carry one, else a bootstrap interval from the records when those hold what it needs
(``comparisons``). Results come prepared from ``inputs`` (loaded, labelled, de-duplicated once).

Paper layout (one table per dataset and protocol): rows Clean, FGSM, PGD, SPSA, SLD, Noise (top-1
and top-5), then any other attack in the results, then ImageNet-A and -R (top-1), -C (mCE) and -O
(AUPR); one column per model; for each pair of models a delta column (later minus earlier) and a
p-value column from paired tests on the same samples (McNemar exact for accuracies, paired
bootstrap for mCE and AUPR). Row names are the attacks' recorded ``attack_label``. Which eps an
attack row shows: the only one present; else the one asked for (``eps={"pgd": 3/255}`` or one
value for all); else the attack's recorded ``paper_eps`` (FGSM/PGD 3/255, SPSA 0.1, SLD 10, noise
0.3) when present; else the present eps closest to it, the larger one on ties (the stronger
attack). Only eps present for every compared model are candidates when there are any.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from .comparisons import interval_from_records
from ..conditions import differing_settings, flat_settings
from ...errors import UserError
from ..stats.stats import check_n_boot
from ..inputs import (ACCURACY_METRICS, AGGREGATE_METRICS, CORRUPTION_METRICS, EPS_DECIMALS, OOD_DATASETS, Inputs, as_inputs, model_order, norm_of)
from ...core.labels import eps_text, parse_eps
from .paired import PairsArg, choose_pairs, delta_column, p_column, pair_cells, pair_legend
from .render import MISSING, Table, fmt_value, render
from .worst_case import worst_case_parts

LAYOUTS = ("paper", "long", "wide")
PAPER_ORDER = ("clean", "fgsm", "pgd", "spsa", "sld", "noise")  # the rows of PIDformer Table 1, in order
METRIC_LABELS = {"top1": "Top-1 Acc (%) [95% Wilson]", "top5": "Top-5 Acc (%) [95% Wilson]", "mce": "mCE (↓)",
                 "mean_err": "Mean error (↓)", "aupr": "AUPR"}


# ----------------------------------------------------------------------------------------------
# layouts
def _parse_eps_choice(eps: Union[None, float, str, Mapping[str, Any]]) -> Dict[str, float]:
    """``None``, one eps for every attack (``"3/255"`` or a float, key ``*``), ``"pgd=4/255,fgsm=2/255"`` or a mapping."""
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
        k, v = (t.strip() for t in part.split("=", 1)) if "=" in part else ("*", part)
        if k in out:
            raise UserError(f"--eps {eps!r}: {'the eps for every attack' if k == '*' else k} is given twice; give each "
                            f"attack one eps (e.g. pgd=4/255,fgsm=2/255)")
        out[k] = parse_eps(v)
    return out


def choose_eps(attack: str, present_by_model: Mapping[str, Iterable[float]], chosen: Mapping[str, float],
               paper_eps: Optional[float] = None, norm: str = "") -> Tuple[Optional[float], str]:
    """The eps an attack row shows, and why (see the module docstring); ``paper_eps`` and ``norm``
    are the attack's, as its rows record them."""
    sets = [{round(float(e), EPS_DECIMALS) for e in v} for v in present_by_model.values() if v]
    if not sets:
        return None, ""
    common = set.intersection(*sets)
    cands = sorted(common or set.union(*sets))
    want = chosen.get(attack, chosen.get("*"))
    if want is not None:
        k = round(want, EPS_DECIMALS)
        if k not in cands:
            raise UserError(f"eps {eps_text(want, norm)} for {attack} is not in the results; present: "
                            f"{', '.join(eps_text(e, norm) for e in cands)}")
        return k, "as asked"
    if len(cands) == 1:
        return cands[0], ""
    paper = None if paper_eps is None or pd.isna(paper_eps) else float(paper_eps)
    if paper is not None and round(paper, EPS_DECIMALS) in cands:
        return round(paper, EPS_DECIMALS), "the paper's eps"
    ref = paper if paper is not None else max(cands)
    best = min(cands, key=lambda e: (round(abs(e - ref), 9), -e))
    why = (f"closest to the paper's {eps_text(paper, norm)}, larger on ties" if paper is not None
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
                 records: Optional[pd.DataFrame] = None, ce_baseline: Optional[str] = None,
                 pairs: PairsArg = None, baseline: Optional[str] = None) -> List[Table]:
    """PIDformer Table 1 shape, one table per (dataset, protocol) in the results. Δ / p columns for ``pairs``
    (BASELINE:MODEL), each model against ``baseline``, or the one pair of two models (``paired.choose_pairs``)."""
    n_boot = check_n_boot(n_boot)
    inp = as_inputs(data, records, ce_baseline)
    df = inp.results
    order = model_order(df, models)
    df = df[df["label"].isin(order)]
    compared, pair_why = choose_pairs(order, pairs, baseline, compare)
    chosen = _parse_eps_choice(eps)
    absent = sorted(set(chosen) - {"*"} - set(df["attack"].astype(str)))
    if absent:  # a typo in an attack name must not leave the table at its default eps unnoticed
        raise UserError(f"--eps {', '.join(absent)}=...: no such attack in the results; present: "
                        f"{', '.join(sorted(set(df['attack'].astype(str)) - {'clean'}))}")
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
            t = _paper_table(df, inp, order, ds, proto, chosen, compared, n_boot, seed, len(base) == 1)
            if t is not None:
                t.notes = inp.notes + t.notes + pair_why
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
                 chosen: Mapping[str, float], pairs: List[Tuple[str, str]], n_boot: int, seed: int,
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
    extra = sorted((a for a in attacks_present if a not in PAPER_ORDER),
                   key=lambda a: (a == "worst-case", a))  # the worst case over attacks comes last
    eps_notes: List[str] = []
    setting_notes: List[str] = []
    shown: set = set()  # (attack, eps_key, settings_id) of the rows in the table
    for attack in list(PAPER_ORDER) + extra:
        sub = acc[acc["attack"] == attack]
        if sub.empty:
            continue
        label, norm = str(sub["attack_label"].iloc[0]), norm_of(sub, attack)
        if attack == "clean":
            if "adversarial" in set(sub["benchmark"]):
                sub = sub[sub["benchmark"] == "adversarial"]
            e = None
            text = label
        else:
            present = {m: sorted(set(g["eps_key"])) for m, g in sub.groupby("label")}
            e, why = choose_eps(attack, present, chosen, sub["paper_eps"].dropna().max(), norm)
            sub = sub[sub["eps_key"] == e]
            text = f"{_setting_head(sub, label)} ({eps_text(e, norm)})"
            allp = sorted(set(acc.loc[acc["attack"] == attack, "eps_key"]))
            if len(allp) > 1:
                eps_notes.append(f"{label}: eps {eps_text(e, norm)} ({why}; present: "
                                 f"{', '.join(eps_text(x, norm) for x in allp)})")
        # cells with different settings never share a row (nor a Δ): one row per setting
        for row_text, ss in split_by_settings(sub, text, label, attack, setting_notes):
            parts: List[Tuple[str, pd.DataFrame]] = []
            if attack == "worst-case":  # name what it combines, and show their rows (worst_case.py)
                row_text, parts = worst_case_parts(row_text, ss, acc, shown)
            for part_text, part in [(row_text, ss)] + parts:
                shown.update(zip(part["attack"], part["eps_key"], part["settings_id"]))
                for metric in ACCURACY_METRICS:
                    cells = {r["label"]: r for r in part[part["metric"] == metric].to_dict("records")}
                    if cells:
                        rows.append((part_text, metric, cells))
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
    for a, b in pairs:
        cols += [delta_column(a, b), p_column(a, b)]
    out: List[Dict[str, str]] = []
    tests_used: Dict[str, List[int]] = {}
    pair_notes: List[Tuple[str, str]] = []
    prev_label = None
    for label, metric, cells in rows:
        r: Dict[str, str] = {"Attack": label if label != prev_label else "", "Metric": METRIC_LABELS.get(metric, metric)}
        prev_label = label
        row_ns = {int(c["n"]) for c in cells.values() if pd.notna(c.get("n"))}
        for m in order:
            c = cells.get(m)
            if c is None:
                r[m] = MISSING
                continue
            lo, hi = c.get("ci_low", np.nan), c.get("ci_high", np.nan)
            if metric in AGGREGATE_METRICS and (pd.isna(lo) or pd.isna(hi)):
                lo, hi = interval_from_records(c, inp.records, n_boot=n_boot, seed=seed)
            r[m] = fmt_value(c["value"], lo, hi)
            if len(row_ns) > 1 and pd.notna(c.get("n")):  # cells of other sample counts never sit side by side unsaid
                r[m] += f" n={int(c['n'])}"
        r.update(pair_cells(pairs, cells, inp.records, label, n_boot, seed, tests_used, pair_notes))
        out.append(r)
    notes += ["cells: value [95% interval] (accuracies: Wilson; mCE, AUPR: bootstrap over samples); n=… in a cell "
              "where the models of a row ran on different numbers of samples"]
    attacked = {a for a, _, _ in shown if a not in ("clean", "converge")}
    if "worst_case" in acc.columns and acc[acc["attack"].isin(attacked)]["worst_case"].fillna(False).astype(bool).any():
        notes.append("attack rows: accuracy under the attacks shown, an upper bound on the model's robust accuracy "
                     "(a stronger attack may break more samples; `evaluate --converge` escalates until none does)")
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
    notes += pair_legend(pairs, tests_used, pair_notes)
    notes += [f"eps per attack row: {'; '.join(eps_notes)}"] if eps_notes else []
    notes += [f"settings: {'; '.join(setting_notes)}"] if setting_notes else []
    title = f"{ds} · {proto} protocol" if proto else ds
    glued = tuple(i for i, c in enumerate(cols) if c.startswith("p ") and cols[i - 1].startswith("Δ "))
    return Table(pd.DataFrame(out, columns=cols), title, notes, glued=glued)


def _setting_head(sub: pd.DataFrame, label: str) -> str:
    """The row's name with the attack's main setting when all its rows share one: ``PGD-20``, ``SPSA-40``."""
    settings = set(sub["setting"].astype(str)) if "setting" in sub.columns else set()
    head = next(iter(settings)).split(" (")[0] if len(settings) == 1 else ""
    return head if head.startswith(label) and head != label else label


def long_table(data: Any, records: Optional[pd.DataFrame] = None, ce_baseline: Optional[str] = None) -> Table:
    """One line per (model, dataset, protocol, benchmark, attack, eps, metric)."""
    inp = as_inputs(data, records, ce_baseline)
    df = inp.results.sort_values(["label", "dataset", "protocol", "benchmark", "attack", "eps_key", "setting",
                                  "metric", "condition"], kind="stable")
    out = pd.DataFrame({
        "model": df["label"], "dataset": df["dataset"], "protocol": df["protocol"], "benchmark": df["benchmark"],
        "attack": df["attack"], "eps": [eps_text(e, n) for e, n in zip(df["eps"], df["norm"])],
        "setting": df["setting"], "metric": df["metric"], "value": [fmt_value(v) for v in df["value"]],
        "ci_low": [fmt_value(v) if pd.notna(v) else "" for v in df["ci_low"]],
        "ci_high": [fmt_value(v) if pd.notna(v) else "" for v in df["ci_high"]],
        "n": [str(int(v)) if pd.notna(v) else "" for v in df["n"]],
    })
    if (df["condition"] != "").any():
        out.insert(6, "condition", df["condition"].to_numpy())
    units = df["value_unit"].fillna("").astype(str) if "value_unit" in df else None  # the cost benchmark's
    if units is not None and (units != "").any():
        out.insert(out.columns.get_loc("value") + 1, "unit", units.to_numpy())
    return Table(out.reset_index(drop=True), "", inp.notes, keys=len(out.columns))


def wide_table(data: Any, models: Optional[Sequence[str]] = None, records: Optional[pd.DataFrame] = None,
               ce_baseline: Optional[str] = None) -> Table:
    """One line per condition and metric, one column per model: value [95% interval]."""
    inp = as_inputs(data, records, ce_baseline)
    df = inp.results
    order = model_order(df, models)
    df = df.assign(cell=[fmt_value(v, lo, hi) for v, lo, hi in zip(df["value"], df["ci_low"], df["ci_high"])])
    keys = ["dataset", "protocol", "benchmark", "attack", "norm", "eps_key", "setting", "metric", "condition"]
    wide = df.pivot_table(index=keys, columns="label", values="cell", aggfunc="first").reset_index()
    wide = wide.sort_values(keys, kind="stable")
    out = pd.DataFrame({"dataset": wide["dataset"], "protocol": wide["protocol"], "benchmark": wide["benchmark"],
                        "attack": wide["attack"],
                        "eps": [eps_text(e, n) for e, n in zip(wide["eps_key"], wide["norm"])],
                        "setting": wide["setting"], "metric": wide["metric"]})
    if (wide["condition"] != "").any():
        out["condition"] = wide["condition"].to_numpy()
    for m in order:
        out[m] = wide[m].fillna(MISSING) if m in wide.columns else MISSING
    return Table(out.reset_index(drop=True), "", inp.notes + ["cells: value [95% interval] (accuracies: Wilson)"],
                 keys=len(out.columns) - len(order))


def tables(data: Any, layout: str = "paper", **kw: Any) -> List[Table]:
    """The tables of one layout; ``kw``: the layout's options (``records``, ``ce_baseline``, ``models``, ...)."""
    if layout not in LAYOUTS:
        raise UserError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")
    if layout == "paper":
        return paper_tables(data, **kw)
    if layout == "long":
        return [long_table(data, records=kw.get("records"), ce_baseline=kw.get("ce_baseline"))]
    return [wide_table(data, models=kw.get("models"), records=kw.get("records"), ce_baseline=kw.get("ce_baseline"))]


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

"""A condition's identity: everything that changes its number, in one canonical form.

A robustness number means something only together with the attack that produced it: PGD-20 and
PGD-2 at one eps are different measurements. Every record and tidy row therefore carries

- ``settings``: canonical JSON of what changes the number apart from eps: benchmark, attack, every
  attack setting (the same canonical params the work-unit keys hash), protocol and the attack
  precision. Settings that only trade memory for speed (``Attack.not_identity``, e.g. SPSA's
  ``max_batch``) are left out, and so are protocol and precision for clean evaluations (they do
  not touch a clean pass). Eps is left out too: it has its own column in every key, and one
  ``settings_id`` then names one attack across an eps sweep.
- ``settings_id``: the first 12 hex digits of the sha256 of ``settings``;
- ``setting``: a readable label, e.g. ``PGD-20 (step 2.5·eps/20, random start, early stop top-5)``;
- ``samples_id`` (on tidy rows): a hash of the sorted sample ids the number was computed on.

Tables pair and compare only cells with equal ``settings_id``; ``check`` names each setting that
differs from its baseline.

Records and tidy rows also carry what a reader needs to know about the attack, so that tables,
plots, ``check`` and the diagnostics never import the attack registry (and torch) to read results:
``attack_label`` (the class's ``label``: ``PGD``, ``CW-L2``; ``Clean``; ``Worst case``; a benchmark
condition keeps its own name), ``norm`` (the unit of eps: ``linf``/``l2``/``l1``; empty for clean and
benchmark conditions), ``white_box`` (the attack reads gradients), ``worst_case`` (it searches the
eps-ball for a misclassification; random noise does not) and ``paper_eps`` (the eps the papers report
the attack at; NaN when none). The runner stamps them when it writes records; records written before
they existed get them from the registry when loaded (the only registry read on the results side).
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from ..core.labels import eps_text

SETTINGS_COLUMNS = ("benchmark", "attack", "params", "protocol", "precision")
META_COLUMNS = ("attack_label", "norm", "white_box", "worst_case", "paper_eps")
# the derived condition "correct only if correct under every worst-case attack run at this (norm, eps)"
WORST_CASE = "worst-case"
DEFAULT_PRECISION = "fp32"


def _params(params: Any) -> Dict[str, Any]:
    if isinstance(params, Mapping):
        return dict(params)
    if params is None or (isinstance(params, float) and params != params) or params == "":
        return {}
    try:
        out = json.loads(params)
    except (TypeError, ValueError):
        return {"params": str(params)}
    return out if isinstance(out, dict) else {"params": out}


def _attack_class(name: str) -> Optional[type]:
    try:
        from ..attacks import get_attack

        return get_attack(name)
    except Exception:  # noqa: BLE001  (a benchmark condition family, or an attack not installed here)
        return None


def settings_dict(benchmark: str, attack: str, params: Any, protocol: str,
                  precision: Optional[str]) -> Dict[str, Any]:
    """The canonical settings of one condition (see the module docstring for what is left out)."""
    p = _params(params)
    cls = _attack_class(attack)
    for k in ("eps",) + tuple(getattr(cls, "not_identity", ()) if cls is not None else ()):
        p.pop(k, None)
    d: Dict[str, Any] = {"benchmark": str(benchmark or ""), "attack": str(attack), "params": p}
    if attack != "clean":
        d["protocol"] = str(protocol or "")
        if cls is not None:  # attack passes run at this precision; benchmark conditions do not
            d["precision"] = str(precision or DEFAULT_PRECISION)
    return d


def canonical(d: Mapping[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def setting_label(attack: str, params: Any, precision: Optional[str] = None) -> str:
    """Readable label of the settings (the attack's own ``describe``; precision when not fp32)."""
    if attack == "clean":
        return "clean"
    cls = _attack_class(attack)
    p = _params(params)
    if cls is None:
        text = attack + (f" ({', '.join(f'{k} {v}' for k, v in sorted(p.items()))})" if p else "")
    else:
        try:
            text = cls.from_params(p).describe()
        except Exception:  # noqa: BLE001  (settings of an older version of the attack)
            text = cls.label_for(p)
    if precision and precision != DEFAULT_PRECISION:
        text += f" [{precision}]"
    return text


def identity(benchmark: str, attack: str, params: Any, protocol: str, precision: Optional[str]) -> Tuple[str, str, str]:
    """(settings_id, setting label, canonical settings JSON) of one condition."""
    s = canonical(settings_dict(benchmark, attack, params, protocol, precision))
    return short_hash(s), setting_label(attack, params, precision), s


def condition_meta(name: str) -> Dict[str, Any]:
    """The metadata of a condition that is not an attack ("fog/3", "ood", a derived "mce" row):
    its own name as label, no norm, not white box, not a worst case, no paper eps."""
    return {"attack_label": str(name), "norm": "", "white_box": False, "worst_case": False, "paper_eps": math.nan}


def attack_meta(attack: str) -> Dict[str, Any]:
    """The metadata columns (``META_COLUMNS``) of one attack name, read from its class.

    Imports the attack registry (and torch): only for results written without the columns."""
    if attack == "clean":
        return {**condition_meta(attack), "attack_label": "Clean"}
    if attack == "converge":  # --converge's ladder: a worst case over L-inf attacks (benchmarks/converge.py)
        return {"attack_label": "Converged", "norm": "linf", "white_box": True, "worst_case": True,
                "paper_eps": math.nan}
    cls = _attack_class(attack)
    if cls is None:  # a benchmark condition or an attack not installed here
        return condition_meta(attack)
    paper = getattr(cls, "paper_eps", None)
    return {"attack_label": cls.label or cls.name.upper(), "norm": str(cls.norm),
            "white_box": bool(cls.uses_gradients), "worst_case": bool(cls.worst_case),
            "paper_eps": math.nan if paper is None else float(paper)}


def eps_text_of(attack: str, eps: float) -> str:
    """An eps as people read it, in the unit of ``attack``'s norm (for run-time messages, where the
    attack class is at hand; result readers use the recorded ``norm`` column instead)."""
    return eps_text(eps, attack_meta(attack)["norm"])


def worst_case_meta(combined_metas: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The metadata of a worst case over attacks with ``combined_metas`` (all of one norm): white
    box if any of them is; its paper eps is the one most of them share (the smaller on a tie)."""
    papers = pd.Series([m["paper_eps"] for m in combined_metas], dtype="float64").dropna().value_counts()
    paper = float(min(v for v, c in papers.items() if c == papers.max())) if len(papers) else math.nan
    return {"attack_label": "Worst case", "norm": str(combined_metas[0]["norm"]) if combined_metas else "",
            "white_box": any(bool(m["white_box"]) for m in combined_metas), "worst_case": True, "paper_eps": paper}


def with_attack_meta(df: pd.DataFrame, derive: Callable[[str], Dict[str, Any]] = attack_meta) -> pd.DataFrame:
    """``df`` (records or tidy rows) with every ``META_COLUMNS`` column; rows without them (the
    columns absent, or empty on rows concatenated from older results) get ``derive(attack)``, once
    per distinct attack. Returned unchanged when nothing is missing: then nothing is imported."""
    if "attack" not in df.columns or df.empty:
        return df
    if all(c in df.columns for c in META_COLUMNS) and not df["attack_label"].isna().any():
        return df
    out = df.copy()
    for col in META_COLUMNS:
        if col not in out.columns:
            out[col] = None
        out[col] = out[col].astype(object)
    todo = out["attack_label"].isna()
    # a worst-case row is described by the attacks it combined (its ``over``: "fgsm+pgd")
    over = out["over"].fillna("").astype(str) if "over" in out.columns else pd.Series("", index=out.index)
    key = out["attack"].astype(str).where(out["attack"] != WORST_CASE, WORST_CASE + ":" + over)
    metas = {}
    for k in key[todo].unique():
        metas[k] = (worst_case_meta([derive(a) for a in k.split(":", 1)[1].split("+") if a])
                    if k.startswith(WORST_CASE + ":") else derive(k))
    for col in META_COLUMNS:
        out.loc[todo, col] = key[todo].map({k: m[col] for k, m in metas.items()})
    out["norm"] = out["norm"].fillna("")  # a tidy CSV reads an empty norm back as NaN
    return out.astype({"attack_label": str, "norm": str, "white_box": bool, "worst_case": bool,
                       "paper_eps": "float64"})


def add_identity(records: pd.DataFrame, precision: Optional[str] = None) -> pd.DataFrame:
    """``records`` with ``precision``, ``settings_id``, ``setting`` and ``settings`` columns and the
    attack metadata (``META_COLUMNS``).

    Called when the runner writes a run's records and when a run folder is loaded (records of
    older versions lack some columns). Computed once per distinct condition (a handful), not per
    row; columns already present are kept as they are."""
    if records.empty:
        return records
    if "settings_id" in records.columns:
        return with_attack_meta(records)
    df = records.copy()
    if "precision" not in df.columns:
        df["precision"] = precision or DEFAULT_PRECISION
    df["precision"] = df["precision"].fillna(precision or DEFAULT_PRECISION).astype(str)
    for col in SETTINGS_COLUMNS:
        if col not in df.columns:
            df[col] = ""
    cols = list(SETTINGS_COLUMNS)
    keys = df[cols].astype(str).drop_duplicates()
    table = {tuple(k): identity(*k) for k in keys.itertuples(index=False, name=None)}
    tup = list(zip(*(df[c].astype(str) for c in cols)))
    ids = [table[t] for t in tup]
    df["settings_id"] = [i[0] for i in ids]
    df["setting"] = [i[1] for i in ids]
    df["settings"] = [i[2] for i in ids]
    return with_attack_meta(df)


def samples_id(sample_ids: Iterable[Any]) -> str:
    """Hash of the set of sample ids a number was computed on (order-free)."""
    return short_hash("\n".join(sorted({str(s) for s in sample_ids})))


def combined(ids: Iterable[str]) -> str:
    """The identity of a number derived from several conditions (a worst case, an mCE)."""
    return short_hash("+".join(sorted({str(i) for i in ids})))


def flat_settings(settings: str) -> Optional[Dict[str, str]]:
    """A canonical settings string as ``{setting name: shown value}`` (attack settings at the top
    level, beside benchmark/attack/protocol/precision), or None when it is not settings JSON."""
    try:
        d = json.loads(settings)
    except (TypeError, ValueError):
        return None
    return {k: _show(v) for k, v in _flatten(d).items()} if isinstance(d, Mapping) else None


def differing_settings(settings: Iterable[str]) -> List[str]:
    """The names of the settings whose values are not the same in all of ``settings``."""
    flats = [flat_settings(s) or {} for s in settings]
    names = sorted({k for f in flats for k in f})
    return [k for k in names if len({f.get(k, "(unset)") for f in flats}) > 1]


def settings_diff(old: str, new: str) -> List[str]:
    """Each setting that differs between two canonical settings strings, as ``name: old → new``."""
    a, b = flat_settings(old), flat_settings(new)
    if a is None or b is None:
        return [f"settings: {old} → {new}"]
    return [f"{k}: {a.get(k, '(unset)')} → {b.get(k, '(unset)')}" for k in differing_settings([old, new])]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and k == "params":
            out.update(_flatten(v, ""))
        elif isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return "none" if v is None else str(v)

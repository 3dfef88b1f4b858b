"""A run folder holds one configuration.

Re-running the same command into a folder resumes it (same plan: same work units). Another
configuration (another seed, eps list, limit, suite, attack setting, batch or chunk size: anything
that changes the plan's work units) would silently replace the folder's ``summary.csv`` and
``records.parquet`` with numbers of a different experiment, under the same name. So it is refused,
naming what differs and the commands that keep or replace the old run (another model is refused the
same way, ``provenance.check_same_model``). No torch here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from ..errors import UserError
from ..results.files.run_files import read_json
from ..specs import OMITTED_AT, RUNTIME_KEYS


def _show(v: Any) -> str:
    text = json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _unique(items: List[Any]) -> List[Any]:
    """Conditions listed twice are evaluated once (the plan de-duplicates them), so they do not differ."""
    seen, out = set(), []
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _eps_list(spec: Dict[str, Any]) -> List[Any]:
    return _unique([(a.get("attack"), (a.get("params") or {}).get("eps")) for a in spec.get("attacks") or []])


def spec_differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    """``name: old -> new`` for each setting of the two specs that differs (runtime keys left out)."""
    out = []
    old = {**OMITTED_AT, **old}  # a key a spec leaves out at its default (decode: cpu) differs from another value
    new = {**OMITTED_AT, **new}
    for k in sorted(set(old) | set(new)):
        if k in RUNTIME_KEYS or old.get(k) == new.get(k):
            continue
        if k == "attacks" and _unique(old.get(k) or []) == _unique(new.get(k) or []):
            continue
        if k == "attacks" and _eps_list(old) != _eps_list(new):
            from ..core.labels import eps_text

            def desc(s: Dict[str, Any]) -> str:
                return ",".join(f"{a} {eps_text(float(e), 'linf') if isinstance(e, (int, float)) else e}"
                                for a, e in _eps_list(s))
            out.append(f"attacks/eps: {_show(desc(old))} -> {_show(desc(new))}")
            continue
        out.append(f"{k}: {_show(old.get(k))} -> {_show(new.get(k))}")
    return out


def check_same_configuration(out: Path, provenance: Dict[str, Any], plan_hash: str) -> None:
    """Refuse to write a run into a folder whose plan (its work units) is another configuration's."""
    plan = read_json(out / "plan.json")
    if not plan or plan.get("plan_hash") in (None, plan_hash):
        return
    old_spec = (plan.get("provenance") or {}).get("spec") or {}
    diffs = spec_differences(old_spec, provenance.get("spec") or {})
    _refuse(out, "; ".join(diffs) if diffs else "its work units differ (model arguments, data or sample set)")


def check_spec_fits_folder(out: Path, spec: Dict[str, Any]) -> None:
    """The same rule from the settings alone, before any model is loaded: a command that runs several folders
    (``reproduce``: one per row) refuses at the start instead of after its first rows. Settings that name a
    place but not the weights (``checkpoint_dir``) are left out; the runner's plan check stays the final word."""
    plan = read_json(out / "plan.json")
    old_spec = ((plan or {}).get("provenance") or {}).get("spec")
    if not old_spec:
        return
    diffs = [d for d in spec_differences(old_spec, spec) if not d.startswith("checkpoint_dir:")]
    if diffs:
        _refuse(out, "; ".join(diffs))


def _refuse(out: Path, what: str) -> None:
    raise UserError(f"{out} holds a run of another configuration ({what}). One run folder holds one "
                    f"configuration: to keep that run, pass another --out (out=) for this one; to resume or extend "
                    f"it, re-run its own command (its settings are in {out / 'run.json'}); to replace it, delete "
                    f"the folder first (rm -r {out})")

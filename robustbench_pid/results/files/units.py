"""How a work unit is written down: its content hash, its plan.json form and its name in messages.

Both halves need these: the runner writes units, ``merge`` reads them back in processes that never
load torch, so they live on the result side.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict

from ...specs import Unit
from ..conditions import eps_text_of


def content_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (keys sorted): the one hash of unit keys, seeds and folders."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def unit_to_dict(u: Unit) -> Dict[str, Any]:
    return {"key": u.key, "benchmark": u.benchmark, "attack": u.attack, "eps": u.eps, "params": u.params,
            "condition": u.condition, "start": u.start, "stop": u.stop}


def unit_from_dict(d: Dict[str, Any]) -> Unit:
    return Unit(d["benchmark"], d["attack"], float(d["eps"]), d["params"], d["condition"],
                int(d["start"]), int(d["stop"]), d["key"])


def unit_label(u: Unit) -> str:
    """The unit as error messages name it: benchmark, condition, samples and key prefix."""
    what = u.attack if not u.condition else f"{u.attack} {u.condition}"
    eps = f" eps={eps_text_of(u.attack, u.eps)}" if u.eps else ""
    return f"{u.benchmark}/{what}{eps} samples [{u.start}:{u.stop}] (unit {u.key[:12]})"


def short_label(u: Unit) -> str:
    """The unit as the progress bar shows it."""
    eps = f" eps={eps_text_of(u.attack, u.eps)}" if u.eps else ""
    cond = f" {u.condition}" if u.condition else ""
    return f"{u.attack}{eps}{cond} [{u.start}:{u.stop}]"



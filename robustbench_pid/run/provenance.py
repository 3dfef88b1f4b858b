"""What a run records about itself: versions, code commit, device, model identity and settings.

Run-level provenance is the same for every shard (it goes to plan.json and run.json); facts of
one process (host, pid, device name) go to its shards/ entry.
"""
from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd
import torch

from ..core.version import __version__
from ..data.batch_decode import decode_provenance
from ..errors import UserError
from .context import Context
from .suites import leaderboard_provenance
from ..results.files.run_files import now, read_json
from ..specs import RunSpec, Unit


@functools.lru_cache(maxsize=1)
def git_commit() -> Optional[str]:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def versions() -> Dict[str, str]:
    import timm

    v = {"robustbench_pid": __version__, "torch": torch.__version__, "timm": timm.__version__,
         "numpy": np.__version__, "pandas": pd.__version__, "python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    # from the installed metadata: importing these libraries just to read a version costs seconds
    for mod, dist in (("torchattacks", "torchattacks"), ("pyautoattack", "pyautoattack"), ("sklearn", "scikit-learn")):
        try:
            v[mod] = version(dist)
        except PackageNotFoundError:
            pass
    return v


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def run_provenance(ctx: Context, spec: RunSpec, out: Path, units: List[Unit]) -> Dict[str, Any]:
    """Run-level provenance (the same for every shard of the run; per-process facts go to shards/)."""
    m = ctx.model.info
    spec_d = spec.as_dict()
    spec_d["shard"] = None
    # --suite robustbench: the leaderboard's protocol and whether this run is comparable with it
    board = leaderboard_provenance(spec, len(ctx.indices), getattr(ctx.dataset, "provenance", {}))
    return {
        "run_id": out.name, "spec": spec_d, "model": spec.model, "arch": m["arch"],
        "arch_kwargs": m["arch_kwargs"], "checkpoint": m.get("checkpoint"),
        "checkpoint_sha256": m.get("checkpoint_sha256"), "checkpoint_name": m.get("checkpoint_name") or "",
        "checkpoint_published_hash": m.get("checkpoint_published_hash") or "",
        "checkpoint_strict": m.get("strict", True),
        "checkpoint_load_problems": m.get("load_problems", []), "model_config": {
            k: m.get(k) for k in ("mean", "std", "input_size", "interpolation", "crop_pct", "crop_mode",
                                  "num_classes")},
        "dataset": spec.dataset, "split": spec.split, "data_root": spec.data_root,
        "dataset_provenance": getattr(ctx.dataset, "provenance", {}), "n_samples": len(ctx.indices),
        "decode": decode_provenance(getattr(spec, "decode", "cpu"), ctx.decoder),
        "limit": spec.limit, "protocol": spec.protocol, "benchmark": spec.benchmark,
        "attacks": [{"attack": a.attack, **a.params} for a in spec.attacks], "suite": spec.suite,
        **({"leaderboard": board} if board else {}),
        "seed": spec.seed, "device": str(ctx.device), "device_name": device_name(ctx.device),
        "precision": spec.precision, "compile": spec.compile, "batch_size": ctx.batch_size,
        "chunk_size": spec.chunk_size, "n_units": len(units), "versions": versions(), "git_commit": git_commit(),
        "started": now(),
    }


MODEL_IDENTITY = ("arch", "arch_kwargs", "checkpoint_sha256")


def check_same_model(out: Path, provenance: Dict[str, Any]) -> None:
    """Refuse to write a run of one model into a folder holding a run of another: records of two
    models must never mix (and one model's resume must never pick up another's units)."""
    old = (read_json(out / "plan.json") or {}).get("provenance")
    if not old or all(old.get(k) == provenance.get(k) for k in MODEL_IDENTITY):
        return

    def desc(p: Dict[str, Any]) -> str:
        sha = p.get("checkpoint_sha256")
        return f"{p.get('model')} ({p.get('arch')}, weights {'sha256 ' + sha[:12] if sha else 'unhashed'})"

    raise UserError(f"{out} holds a run of another model: {desc(old)}; this run evaluates {desc(provenance)}. "
                    f"One run folder holds one model: pass another out folder (--out / out=), or delete {out} "
                    f"to start over")

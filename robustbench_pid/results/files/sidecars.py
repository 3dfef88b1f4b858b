"""A unit's extra files (``--analyze``): written beside its records, checksummed, merged into the run folder.

A unit with an analysis writes ``units/<key>.<name>.parquet`` first (atomic, like its records) and records
its sha256 in the unit's ``.json`` (``sidecars: {name: sha256}``), which is written last: so the unit is
done only when its extra files are in place, and every reader verifies them as it verifies the records
(``integrity``). Finalize concatenates them, in plan order, into ``<name>.parquet`` in the run folder
with each row's condition identity (settings_id, setting, attack metadata) joined from the records by
unit key. A run without the analysis has no such file (a stale one from an earlier plan is removed).
``--save-adv`` images are a unit's extra file too, written the same way but as one safetensors file per
unit in the run folder's ``adversarial/`` (``adversarial.py``: never concatenated). Pandas only: ``merge``
never loads torch.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import pandas as pd

from ...errors import UserError
from ...specs import Unit
from .adversarial import SIDECAR as ADVERSARIAL, write_unit_images
from .integrity import sha256_bytes
from .run_files import write_parquet_atomic
from .units import unit_label

SIDECARS = ("attention",)  # every name a unit may write; the run folder gets <name>.parquet
META_KEY = "sidecars"
# the condition identity each sidecar row gets from its unit's records
IDENTITY = ("run_id", "model", "arch", "checkpoint_sha256", "dataset", "split", "protocol", "benchmark", "attack",
            "eps", "params", "settings_id", "setting", "settings", "precision", "attack_label", "norm", "white_box",
            "worst_case")


def sidecar_path(units_dir: Path, key: str, name: str) -> Path:
    return Path(units_dir) / f"{key}.{name}.parquet"


def write_sidecars(units_dir: Path, key: str, frames: Mapping[str, pd.DataFrame]) -> Dict[str, Any]:
    """Write a unit's extra frames; returns what its ``.json`` records about them ({} when none)."""
    if not frames:
        return {}
    digests = {}
    for name, df in frames.items():
        if name == ADVERSARIAL:  # --save-adv: the unit's images, in the run folder's adversarial/ (adversarial.py)
            digests[name] = write_unit_images(Path(units_dir).parent, key, df)
            continue
        if name not in SIDECARS:
            raise ValueError(f"unknown sidecar {name!r}; known: {SIDECARS + (ADVERSARIAL,)}")
        digests[name] = write_parquet_atomic(df.reset_index(drop=True), sidecar_path(units_dir, key, name))
    return {META_KEY: digests}


def read_sidecar(units_dir: Path, u: Unit, meta: Mapping[str, Any], name: str) -> pd.DataFrame:
    """One unit's frame, verified against the sha256 its ``.json`` recorded."""
    path = sidecar_path(units_dir, u.key, name)
    want = (meta.get(META_KEY) or {}).get(name)
    fix = (f"delete {units_dir / (u.key + '.json')} and re-run the evaluate command with the same --out to recompute "
           f"{unit_label(u)}")
    try:
        data = path.read_bytes()
    except OSError:
        raise UserError(f"{path} is missing although its unit is finished; {fix}") from None
    if want is None or sha256_bytes(data) != want:
        raise UserError(f"{path} does not match the sha256 recorded when it was written; {fix}")
    return pd.read_parquet(io.BytesIO(data)).assign(unit=u.key)


def merge_sidecars(out: Path, units: Sequence[Unit], metas: Sequence[Mapping[str, Any]],
                   records: pd.DataFrame) -> List[Path]:
    """Write ``<name>.parquet`` for every sidecar the units wrote (all of them or none: the unit keys
    hash the analysis); remove a stale one otherwise. Returns the files written."""
    out, written = Path(out), []
    for name in SIDECARS:
        has = [bool((m.get(META_KEY) or {}).get(name)) for m in metas]
        target = out / f"{name}.parquet"
        if not any(has):
            target.unlink(missing_ok=True)
            continue
        if not all(has):
            missing = [unit_label(u) for u, h in zip(units, has) if not h][:5]
            raise UserError(f"{out}: some units lack their {name} file ({missing}); delete the run folder's units/ "
                            f"and re-run (units of one plan share their analysis)")
        frames = [read_sidecar(out / "units", u, m, name) for u, m in zip(units, metas)]
        df = pd.concat(frames, ignore_index=True)
        ident = records.drop_duplicates("unit")[["unit", *[c for c in IDENTITY if c in records.columns]]]
        df = df.merge(ident, on="unit", how="left", validate="many_to_one")
        front = [c for c in ("run_id", "model", "attack", "eps", "settings_id", "sample_id", "layer", "metric",
                             "value") if c in df.columns]
        df = df[front + [c for c in df.columns if c not in front]]
        write_parquet_atomic(df, target)
        written.append(target)
    return written

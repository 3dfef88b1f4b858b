"""``--save-adv``: a run's adversarial images on disk, one safetensors file per work unit, keyed by sample id.

Why per unit: a unit is the run's grain of resume, sharding and checksums, so its images are written with it
(``<run>/adversarial/<unit key>.safetensors``, atomically, before the unit's ``.json``, which records the file's
sha256: a unit is done only with its images in place) and a condition on 50,000 ImageNet images never has to
sit in memory to be merged. Finalize checks every file against its unit's record and writes the list into
``run.json`` (``adversarial_sha256``: relative path -> sha256); every reader (``rbp.load_adversarial``,
``robustbench-pid export``) verifies a file against it before using it, so a damaged file is refused with
one line.

What a file holds: every sample of the unit in its order (``sample_ids`` in the metadata, JSON), the image the
verdict was given on: the attack's final point (the clean image where the sample was not attacked), or for a
``--converge`` unit the point of the rung that broke it (the clean image while it stayed robust). A sample is
stored in 8 bits (``images_u8``/``index_u8``) only where that loses nothing the verdict depends on, decided per
sample on the torch side (``benchmarks/adv_images.py``): the 8-bit image stays in the eps-ball and the model
gives it the same class and the same top-5 verdict; every other sample is float32 exactly as the attack
returned it (``images_f32``/``index_f32``). Readers get float32 in [0, 1] either way (k / 255 in float32).
Pandas/numpy only (``safetensors.numpy``): result readers never import torch.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ...errors import UserError
from ...specs import Unit
from ..report.indicators import UNCONSTRAINED  # the --indicators check run's condition: it keeps no images
from .integrity import sha256_bytes
from .run_files import atomic_write_bytes
from .units import unit_label

FORMAT = "robustbench_pid.adversarial/1"
FOLDER = "adversarial"  # in the run folder
RUN_KEY = "adversarial_sha256"  # in run.json: relative path -> sha256
SIDECAR = "adversarial"  # the name under a unit's ``sidecars`` (and in ``ctx.sidecars``)
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass
class ImageParts:
    """A unit's images as they come, batch after batch (numpy, on the host)."""

    sample_ids: List[str] = field(default_factory=list)
    u8: List[np.ndarray] = field(default_factory=list)  # per batch: (b, C, H, W) uint8 (rows used where 8-bit)
    f32: List[np.ndarray] = field(default_factory=list)  # per batch: (b, C, H, W) float32 as the attack gave them
    as_u8: List[np.ndarray] = field(default_factory=list)  # per batch: (b,) bool, stored in 8 bits

    def add(self, sample_ids: Sequence[Any], u8: np.ndarray, f32: np.ndarray, as_u8: np.ndarray) -> None:
        self.sample_ids += [str(s) for s in sample_ids]
        self.u8.append(u8)
        self.f32.append(f32)
        self.as_u8.append(np.asarray(as_u8, dtype=bool))

    def encode(self, key: str) -> bytes:
        """The safetensors bytes of the unit (both dtypes, each with the positions it holds)."""
        from safetensors.numpy import save

        u8, f32, mask = np.concatenate(self.u8), np.concatenate(self.f32), np.concatenate(self.as_u8)
        pos = np.arange(len(mask), dtype=np.int64)
        tensors = {"images_u8": np.ascontiguousarray(u8[mask]), "index_u8": pos[mask],
                   "images_f32": np.ascontiguousarray(f32[~mask].astype(np.float32)), "index_f32": pos[~mask]}
        return save(tensors, metadata={"format": FORMAT, "unit": key, "sample_ids": json.dumps(self.sample_ids)})


def wants_images(u: Unit) -> bool:
    """Does this unit keep images under --save-adv? Every attack and ladder unit; not the clean pass, not the
    unbounded check runs of --indicators (evidence about the attack, not a condition)."""
    return u.benchmark in ("adversarial", "converge") and u.attack != "clean" and u.condition != UNCONSTRAINED


def relative_path(key: str) -> str:
    if not _KEY.fullmatch(str(key)):  # a unit key is a sha256: anything else would name another file
        raise UserError(f"unit key {str(key)[:80]!r} is not a unit key (64 hex digits): the records were not "
                        f"written by this program; re-run the evaluate command into a new --out")
    return f"{FOLDER}/{key}.safetensors"


def write_unit_images(run_dir: Path, key: str, parts: ImageParts) -> str:
    """Write one unit's file atomically; returns its sha256 (what the unit's .json records)."""
    data = parts.encode(key)
    path = Path(run_dir) / relative_path(key)
    path.parent.mkdir(exist_ok=True)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def collect(out: Path, units: Sequence[Unit], metas: Sequence[Mapping[str, Any]], save_adv: bool
            ) -> Optional[Dict[str, str]]:
    """Finalize: every image file of the plan, checked against the sha256 its unit recorded -> run.json's
    ``adversarial_sha256``; None for a run without --save-adv. Files of no unit of the plan are removed."""
    out = Path(out)
    folder = out / FOLDER
    if not save_adv:
        return None
    found: Dict[str, str] = {}
    for u, m in zip(units, metas):
        if not wants_images(u):
            continue
        rel = relative_path(u.key)
        want = (m.get("sidecars") or {}).get(SIDECAR)
        fix = (f"delete {out / 'units' / (u.key + '.json')} and re-run the evaluate command with the same --out to "
               f"recompute {unit_label(u)}")
        try:
            data = (out / rel).read_bytes()
        except OSError:
            raise UserError(f"{out / rel} (the adversarial images of a finished unit) is missing; {fix}") from None
        if want is None or sha256_bytes(data) != want:
            raise UserError(f"{out / rel} does not match the sha256 recorded when it was written; {fix}")
        found[rel] = want
    if folder.is_dir():
        for stale in folder.glob("*.safetensors"):
            if f"{FOLDER}/{stale.name}" not in found:
                stale.unlink(missing_ok=True)
    return found


# --------------------------------------------------------------------------- reading


@dataclass
class RunImages:
    """One condition's images of a run, in the run's sample order (float32 in [0, 1], NCHW)."""

    images: np.ndarray
    labels: np.ndarray
    sample_ids: List[str]
    condition: Dict[str, Any]  # benchmark, attack, eps, settings_id, setting
    run_dir: Path
    stored_u8: int = 0  # how many samples the files hold in 8 bits (the rest: float32)


def _decode(path: Path, want: str) -> Tuple[List[str], np.ndarray, int]:
    """(sample ids, float32 images, how many were 8-bit) of one unit file, verified against ``want``."""
    from safetensors import safe_open
    from safetensors.numpy import load

    fix = (f"the run's images cannot be trusted: re-run its evaluate command with --save-adv into a new --out "
           f"(or restore the file from a copy)")
    try:
        data = path.read_bytes()
    except OSError:
        raise UserError(f"{path} (adversarial images recorded in run.json) is missing; {fix}") from None
    if sha256_bytes(data) != want:
        raise UserError(f"{path} does not match the sha256 recorded in run.json (changed or damaged since the run "
                        f"finished); refusing to read it: {fix}")
    try:
        tensors = load(data)
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
        ids = [str(s) for s in json.loads(meta.get("sample_ids", "null"))]
        n = len(ids)
        iu, i32 = tensors["index_u8"], tensors["index_f32"]
        u8, f32 = tensors["images_u8"], tensors["images_f32"]
        pos = np.concatenate([iu, i32])
        if meta.get("format") != FORMAT or sorted(pos.tolist()) != list(range(n)) or u8.dtype != np.uint8 \
                or f32.dtype != np.float32 or len(u8) != len(iu) or len(f32) != len(i32):
            raise ValueError("inconsistent contents")
        shape = (u8 if len(u8) else f32).shape[1:]
        images = np.empty((n, *shape), dtype=np.float32)
        images[iu] = u8.astype(np.float32) / np.float32(255)
        images[i32] = f32
    except Exception as exc:  # noqa: BLE001 - whatever a file of another program or version fails with
        raise UserError(f"{path} matches its sha256 but is not an adversarial-image file of this version "
                        f"({type(exc).__name__}); {fix}") from None
    return ids, images, int(len(iu))


def run_folder(run: Union[str, Path]) -> Tuple[Path, Dict[str, Any]]:
    """A finished run folder and its run.json, or one error line naming what it is instead and the fix."""
    from ..store import load_run_info

    d = Path(run)
    if not d.is_dir() or not (d / "run.json").is_file():
        where = "does not exist" if not d.exists() else ("is a file" if d.is_file() else "holds no run.json")
        raise UserError(f"{d} {where}: give a run folder (the --out of an evaluate run, holding run.json)")
    info = load_run_info(d)
    if info.get("status") != "complete":
        raise UserError(f"{d}: run is not complete (status {info.get('status')!r}); re-run its evaluate command "
                        f"to finish it (sharded runs: `robustbench-pid merge {d}` once every shard has finished)")
    return d, info


def verify_all(run_dir: Path, info: Dict[str, Any]) -> int:
    """Check every image file run.json lists (its path in the run's adversarial/, its sha256); returns how many.
    What an export vouches for is the whole run's evidence, not only the condition it ships."""
    recorded = info.get(RUN_KEY)
    if not isinstance(recorded, dict):
        return 0
    for rel, want in recorded.items():
        key = str(rel)[len(FOLDER) + 1:-len(".safetensors")]
        if not (_KEY.fullmatch(key) and rel == f"{FOLDER}/{key}.safetensors"):  # e.g. ../../elsewhere: never read
            raise UserError(f"{run_dir}/run.json lists {str(rel)[:80]!r} among its adversarial images, which is no "
                            f"file of the run's {FOLDER}/ folder; rebuild run.json with `robustbench-pid merge {run_dir}`")
        _decode(Path(run_dir) / rel, str(want))
    return len(recorded)


def conditions(records: Any) -> Any:
    """The records of conditions that keep images, with their identity columns."""
    keep = records["benchmark"].isin(["adversarial", "converge"]) & (records["attack"] != "clean")
    if "condition" in records.columns:
        keep &= records["condition"].fillna("").astype(str) != UNCONSTRAINED
    return records[keep]


def read_adversarial(run: Union[str, Path], attack: Optional[str] = None, eps: Optional[float] = None,
                     settings_id: Optional[str] = None) -> RunImages:
    """One condition's adversarial images of a finished ``--save-adv`` run (``attack``/``eps``/``settings_id``
    pick it when the run holds several), every file verified against run.json."""
    from ..store import load_runs

    d, info = run_folder(run)
    recorded = info.get(RUN_KEY)
    if not isinstance(recorded, dict):
        raise UserError(f"{d} was run without --save-adv, so it keeps no adversarial images; re-run its evaluate "
                        f"command with --save-adv and another --out (the setting is part of every work unit)")
    recs = conditions(load_runs(d).records)
    ids = ["benchmark", "attack", "eps", "settings_id"]
    table = recs.drop_duplicates(ids)[ids + [c for c in ("setting",) if c in recs.columns]]
    chosen = table
    if attack is not None:
        chosen = chosen[chosen["attack"] == attack]
    if eps is not None:
        chosen = chosen[np.isclose(chosen["eps"].astype(float), float(eps), rtol=0, atol=1e-9)]
    if settings_id is not None:
        chosen = chosen[chosen["settings_id"] == settings_id]
    listing = "; ".join(f"attack={r.attack} eps={r.eps:.6g} settings_id={r.settings_id}" for r in table.itertuples())
    if len(chosen) != 1:
        what = "no condition" if chosen.empty else f"{len(chosen)} conditions"
        raise UserError(f"{d}: {what} with adversarial images matches attack={attack!r} eps={eps!r} settings_id="
                        f"{settings_id!r}; its conditions: {listing or 'none'} (give attack= and eps=, or "
                        f"--attack/--eps)")
    row = chosen.iloc[0]
    rows = recs[(recs["benchmark"] == row["benchmark"]) & (recs["attack"] == row["attack"])
                & (recs["eps"] == row["eps"]) & (recs["settings_id"] == row["settings_id"])]
    parts, n_u8 = [], 0
    for key, unit_rows in rows.groupby("unit", sort=False):
        rel = relative_path(str(key))
        want = recorded.get(rel)
        if want is None:
            raise UserError(f"{d}/run.json records no images of unit {str(key)[:12]} ({rel}); the run folder was "
                            f"edited: rebuild it with `robustbench-pid merge {d}`")
        sids, images, k = _decode(d / rel, want)
        expect = unit_rows["sample_id"].astype(str).tolist()
        if sids != expect:
            raise UserError(f"{d / rel} holds other samples than its unit's records; rebuild the run folder with "
                            f"`robustbench-pid merge {d}` or re-run it")
        parts.append(images)
        n_u8 += k
    return RunImages(images=np.concatenate(parts), labels=np.array(rows["label"], dtype=np.int64),
                     sample_ids=rows["sample_id"].astype(str).tolist(),
                     condition={k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in table.columns},
                     run_dir=d, stored_u8=n_u8)

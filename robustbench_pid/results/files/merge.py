"""Check and assemble a run folder: every unit present and verified, every (configuration, sample)
exactly once, then records.parquet, summary.csv and run.json ("complete" is the last write).

Whichever process sees every unit present finalizes (under the run lock; idempotent), and
``robustbench-pid merge`` does the same by hand after sharded runs. No torch at import: ``merge``
on a machine without a GPU job (or torch) loads only what summarizing the records needs.
"""
from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd

from ..conditions import add_identity
from ...errors import UserError
from .sample_ids import SampleIds
from .integrity import BAD_META, MISMATCH, UNVERIFIED, raise_bad_unit, read_unit_bytes, sha256_bytes, warn_unverified
from .verify import EXTRA_FILES, FILES_KEY
from .units import unit_from_dict, unit_label
from ..store import summarize
from .sidecars import merge_sidecars
from .adversarial import RUN_KEY as ADV_KEY, collect as collect_images
from .trace import split_trace
from .run_files import (HOST, atomic_write_bytes, now, pid_alive, proc_start, read_json, run_lock, unit_done, write_json, write_parquet_atomic)
from ...specs import Unit


class IncompleteRun(UserError):
    """Some units of the plan are missing (a shard has not run or has not finished)."""


def load_plan(out: Path) -> Dict[str, Any]:
    out = Path(out)
    if not out.is_dir():
        raise UserError(f"run folder not found: {out}")
    plan = read_json(out / "plan.json")
    if plan is None:
        raise UserError(f"{out} has no readable plan.json: not a run folder of this version (re-run the evaluate "
                        f"command with --out {out} to (re)create it; finished units are reused)")
    return plan


def check_complete(out: Path, plan: Dict[str, Any]) -> List[Unit]:
    """The plan's units, or IncompleteRun naming the missing units and the shards that own them."""
    units = [unit_from_dict(d) for d in plan["units"]]
    units_dir = Path(out) / "units"
    missing = [(j, u) for j, u in enumerate(units) if not unit_done(units_dir, u.key)]
    if not missing:
        return units
    shard_infos = [s for s in (read_json(p) for p in sorted((Path(out) / "shards").glob("*.json"))) if s]
    counts = sorted({int(s["n_shards"]) for s in shard_infos if s.get("plan_hash") == plan["plan_hash"]}) or [1]
    lines = [f"{out}: {len(missing)} of {len(units)} work units are missing, so the run cannot be merged."]
    for n in counts:
        by_shard: Dict[int, List[Unit]] = {}
        for j, u in missing:
            by_shard.setdefault(j % n, []).append(u)
        for i, us in sorted(by_shard.items()):
            tries = sorted((s for s in shard_infos if s.get("shard") == i and s.get("n_shards") == n
                            and s.get("plan_hash") == plan["plan_hash"]), key=lambda s: float(s.get("t_started", 0)))
            st = tries[-1] if tries else None
            gone = (st is not None and st.get("status") == "running" and st.get("host") == HOST
                    and not pid_alive(int(st.get("pid", -1))))
            state = ("never started" if st is None else
                     f"{'died while running' if gone else st.get('status')} on {st.get('host')} "
                     f"(pid {st.get('pid')}, started {st.get('started')})")
            lines.append(f"  shard {i}/{n}: {len(us)} unit(s) missing; that shard {state}")
    for _, u in missing[:10]:
        lines.append(f"  missing: {unit_label(u)}")
    if len(missing) > 10:
        lines.append(f"  ... and {len(missing) - 10} more")
    lines.append("Run the missing shard(s) with the same command (--shard i/n, or the same torchrun/Slurm "
                 "launch), then merge again.")
    raise IncompleteRun("\n".join(lines))


def check_records(units: Sequence[Unit], frames: Sequence[pd.DataFrame], sample_ids: Sequence[Any]) -> None:
    """Every (configuration, sample) exactly once: each unit holds exactly its own samples (each
    with the same number of rows), the units of one configuration cover disjoint sample ranges,
    and the sample ids are unique. Cheap enough for millions of records (no per-sample dicts).

    ``sample_ids``: plan.json's (``sample_ids.pack``'s entries, or an old plan's list of strings); the ids of
    one unit are generated for that unit only, and duplicates are found from the runs, not from all ids."""
    problems: List[str] = []
    ids = sample_ids if isinstance(sample_ids, SampleIds) else SampleIds(sample_ids)
    dup = ids.duplicates(5)
    if dup:
        problems.append(f"the dataset repeats sample ids {dup}: records could not be told apart")
    spans: Dict[Tuple[Any, ...], List[Tuple[int, int, str]]] = {}
    for u, df in zip(units, frames):
        expected = ids.slice(u.start, u.stop)
        if "unit" in df.columns and (df["unit"] != u.key).any():
            problems.append(f"{unit_label(u)}: its file holds records of another unit")
            continue
        counts = df["sample_id"].astype(str).value_counts()
        if len(counts) != len(expected) or not counts.index.isin(expected).all():
            got = set(counts.index)
            lost = sorted(set(expected) - got)[:5]
            extra = sorted(got - set(expected))[:5]
            problems.append(f"{unit_label(u)}: samples missing {lost} / unexpected {extra}")
            continue
        if counts.nunique() != 1:
            problems.append(f"{unit_label(u)}: samples {list(counts[counts > counts.min()].index[:5])} "
                            f"appear more often than the others")
            continue
        spans.setdefault((u.benchmark, u.attack, u.eps, u.params, u.condition), []).append((u.start, u.stop, u.key))
    for cfg, sp in spans.items():
        sp.sort()
        for (s0, e0, k0), (s1, e1, k1) in zip(sp, sp[1:]):
            if s1 < e0:
                problems.append(f"units {k0[:12]} and {k1[:12]} of {cfg[1]} overlap on samples [{s1}:{min(e0, e1)}]")
    if problems:
        raise UserError("records fail the exactly-once check:\n  " + "\n  ".join(problems[:20]) +
                        "\nDelete the named units' files under units/ and re-run the command to recompute them.")


def finalize_run(out: Path, expected_plan: Optional[str] = None) -> pd.DataFrame:
    """Check and assemble a run folder whose units are all present: records, summary, run.json.

    Idempotent and safe to call from several processes at once (file lock + atomic writes);
    the records are in plan order, so they do not depend on how the work was sharded.
    """
    out = Path(out)
    with run_lock(out):
        plan = load_plan(out)
        if expected_plan is not None and plan["plan_hash"] != expected_plan:
            raise UserError(f"{out}/plan.json was replaced by a run with different settings while this one "
                            f"ran; use one --out folder per configuration")
        units = check_complete(out, plan)
        units_dir = out / "units"
        frames, metas, unverified = [], [], 0
        for u in units:
            state, data, meta = read_unit_bytes(units_dir, u.key)
            if state in (MISMATCH, BAD_META):
                raise_bad_unit(state, units_dir, u.key, unit_label(u))
            unverified += state == UNVERIFIED
            try:
                frames.append(pd.read_parquet(io.BytesIO(data)))
            except Exception as exc:  # noqa: BLE001 - name the unreadable file, whatever pyarrow raises
                raise UserError(f"{units_dir / (u.key + '.parquet')} is unreadable ({exc}); delete it and its "
                                f".json and re-run the command to recompute {unit_label(u)}") from None
            metas.append(meta or {})
        warn_unverified(unverified, out)
        check_records(units, frames, plan["sample_ids"])
        records = split_trace(pd.concat(frames, ignore_index=True), out)  # --trace: losses to trace.parquet
        if "run_id" in records.columns:  # units finished in a folder since copied or renamed: the run is this one
            records["run_id"] = out.name
        # each record says what was measured: precision and the condition's identity (conditions.py)
        records = add_identity(records.assign(precision=str(plan["provenance"].get("precision") or "fp32")))
        summary = summarize(records)
        merge_sidecars(out, units, metas, records)  # e.g. attention.parquet (--analyze), before "complete"
        images = collect_images(out, units, metas, bool((plan["provenance"].get("spec") or {}).get("save_adv")))
        shards = [mark_dead(s) for s in (read_json(p) for p in sorted((out / "shards").glob("*.json")))
                  if s and s.get("plan_hash") == plan["plan_hash"]]
        prov = dict(plan["provenance"])
        devices = sorted({s["device"] for s in shards if s.get("device")})
        names = sorted({s["device_name"] for s in shards if s.get("device_name")})
        if devices:
            prov["device"] = devices[0] if len(devices) == 1 else devices
        if names:
            prov["device_name"] = names[0] if len(names) == 1 else names
        starts = [s["started"] for s in shards if s.get("started")]
        if starts:
            prov["started"] = min(starts)
        t_start = min((float(s["t_started"]) for s in shards if s.get("t_started")), default=None)
        # Tables first, run.json's "complete" last: a failure at any write (disk full, kill) leaves
        # a folder that is not marked complete, and the next run/merge writes everything again.
        records_sha = write_parquet_atomic(records, out / "records.parquet")
        summary_bytes = summary.to_csv(index=False).encode()
        atomic_write_bytes(out / "summary.csv", summary_bytes)
        write_json(out / "run.json", {
            **prov, "plan_hash": plan["plan_hash"], "status": "complete",
            "wall_seconds": round(time.time() - t_start, 2) if t_start else None,
            "compute_seconds": round(sum(float(m.get("seconds", 0)) for m in metas), 2),
            "n_records": len(records), "units_unverified": unverified, "shards": shards, "finished": now(),
            # what every reader verifies before trusting them (verify.py)
            FILES_KEY: {"records.parquet": records_sha, "summary.csv": sha256_bytes(summary_bytes),
                        **{n: sha256_bytes((out / n).read_bytes()) for n in EXTRA_FILES if (out / n).is_file()}},
            **({ADV_KEY: images} if images is not None else {}),  # --save-adv: every image file, verified on read
            "finalized_by": {"host": HOST, "pid": os.getpid()}})
    return summary


def mark_dead(shard: Dict[str, Any]) -> Dict[str, Any]:
    """A shard entry still ``running`` whose process is gone (same host: pid dead or recycled)
    becomes ``died``; entries of other hosts cannot be checked and are left as they are."""
    if shard.get("status") != "running" or shard.get("host") != HOST:
        return shard
    pid = int(shard.get("pid", -1))
    start = shard.get("pid_start")
    recycled = start is not None and proc_start(pid) not in (None, start)
    if pid_alive(pid) and not recycled:
        return shard
    return {**shard, "status": "died"}


def merge(out: Path) -> pd.DataFrame:
    """``robustbench-pid merge``: check a (sharded) run folder and write its tables."""
    return finalize_run(Path(out))

"""The batch runner: spec -> model + data -> work units -> per-sample records -> run folder.

Work units (benchmark x attack x eps x chunk of samples) are keyed by a content hash of
everything that determines their records (``plan``). The run folder::

    plan.json                 every unit of the run (keys, settings, sample ranges) + sample ids
                              (runs of numbered ids, ``results/files/sample_ids``)
    units/<key>.parquet/.json a finished unit: records, then metadata with the records' sha256
                              (each temp file + rename; the checksum is verified on every read)
    units/<key>.claim         "a live process is computing this unit" (``claims``)
    shards/<i>-of-<n>_*.json  one per process: which shard, where, when, with which plan
    records.parquet, summary.csv, run.json   written by ``merge.finalize_run`` once every unit is
                              present, in this order: run.json's status "complete" is the last write

Why it is built this way:
- Exact resume. A unit is done exactly when both its parquet and json exist; both are written
  to a temp file, fsync'ed and renamed, parquet first (``run_files``), so a ``kill -9`` at any
  moment leaves either a finished unit or nothing. Randomness is seeded per unit from its key
  (``run_context.unit_rng``), so which process computes a unit, and in which order, does not
  change its records.
- Decode once, keep the device busy. Work runs chunk-major: the units are grouped by their
  sample range (chunk); a chunk's images are read and transformed once, held on the device, and
  every unit of the chunk (the clean pass first, then each condition in plan order) runs on
  them, the adversarial ones reusing the clean logits. A chunk of ``--chunk-size`` images sits
  on the device (512 ImageNet images at 224 px: 0.3 GB in fp32); each shard decodes the chunks
  its own units need. One DataLoader pass covers all the chunks of a process
  (``Context.chunks``); with ``--workers N`` a thread drains it up to one chunk ahead
  (``read_ahead``), so the next chunk is decoded (into pinned memory on CUDA) while this one is
  attacked, and a chunk's first unit computes on its first batches while the rest arrive: no
  drain and restart per unit or per chunk. Records are gathered on the
  device and copied to the host once per unit. The unit is still the unit of resume, claims,
  sharding and checksums (same keys): a chunk is done when all its units are written, and a
  killed run resumes at unit granularity (re-decoding a chunk only for its missing units).
  One exception: ``corruptions`` with ``--workers`` corrupts in the loader workers, so it reads
  each image once per corruption (there the corruption, not the decode, is the CPU cost).
- Concurrency without a coordinator: O_EXCL claim files with heartbeats (``claims``).
- Sharding on existing launchers, no collectives (``launcher``): a shard takes every n-th unit of
  the plan. No DistributedSampler (it pads with duplicated samples, pytorch#25162) and no process
  group: shards share nothing but the folder. Under torchrun rank 0 waits for the others and
  finalizes; otherwise whichever process sees every unit present finalizes (under a file lock,
  idempotent), and ``robustbench-pid merge`` does the same by hand (``merge``), checking every
  (configuration, sample) appears exactly once.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pandas as pd
import torch

from ..benchmarks import get_benchmark
from .claims import Claims, wait_for_units
from .dryrun import dry_run, unit_passes
from ..results.files.integrity import (BAD_META, CHECKSUM_KEY, MISMATCH, UNVERIFIED, problem, read_unit_bytes, warn, warn_unverified)
from ..runtime.launcher import TORCHRUN, Launch, launch
from .one_config import check_same_configuration
from ..results.files.merge import finalize_run
from ..results.files.sample_ids import pack
from ..results.files.sidecars import write_sidecars
from ..results.files.units import short_label, unit_label, unit_to_dict
from .plan import PLAN_VERSION, plan_hash, plan_units, shard_units
from .provenance import check_same_model, device_name, run_provenance
from .context import Context, prepare, unit_rng, unit_seed
from ..runtime.progress import FB_COST, work_of  # noqa: F401 (FB_COST: tests)
from ..results.files.run_files import (HOST, check_writable, clean_stale_temps, default_out, make_out_dir, now, proc_start, read_json, run_lock, unit_done, write_json, write_parquet_atomic)
from ..specs import RunSpec, Unit

RECORD_ID_COLS = ("run_id", "model", "arch", "checkpoint_sha256", "checkpoint_name", "checkpoint_published_hash",
                  "dataset", "split", "protocol")


def run(spec: RunSpec, model: Optional[torch.nn.Module] = None, data: Any = None) -> Path:
    """Evaluate ``spec`` (this process's shard of it); returns the run folder.

    The folder is complete (``run.json`` status ``complete``) when every unit is present after
    this process's work; otherwise (other shards still to run) it is left for them or ``merge``.
    ``model``/``data``: objects instead of the spec's names (see :func:`prepare`).
    """
    t0 = time.time()
    identity = {k: v for k, v in (("model", getattr(model, "info", {}).get("checkpoint_sha256")),
                                  ("data", getattr(data, "content_sha256", None))) if v}
    out = Path(spec.out) if spec.out else default_out(spec, identity)
    if not spec.dry_run:
        check_writable(out)
    ctx = prepare(spec, model, data)
    units = plan_units(ctx)
    launched = launch(spec.shard)
    shard_i, shard_n = launched.index, launched.count
    mine = shard_units(units, shard_i, shard_n)
    ctx.ids["run_id"] = out.name
    if spec.dry_run:
        if not (launched.kind == TORCHRUN and shard_i != 0):  # one plan per torchrun job
            dry_run(ctx, out, units, mine, (shard_i, shard_n))
        return out
    make_out_dir(out)
    units_dir = out / "units"
    units_dir.mkdir(exist_ok=True)
    (out / "shards").mkdir(exist_ok=True)
    clean_stale_temps(units_dir)
    clean_stale_temps(out)
    provenance = run_provenance(ctx, spec, out, units)
    check_same_model(out, provenance)
    phash = plan_hash(units)
    check_same_configuration(out, provenance, phash)  # one configuration per folder (one_config.py)
    write_json(out / "plan.json", {
        "version": PLAN_VERSION, "plan_hash": phash, "run_id": out.name, "n_units": len(units),
        "units": [unit_to_dict(u) for u in units],
        "sample_ids": pack(ctx.dataset.sample_ids[i] for i in ctx.indices),  # runs, not a string per sample
        "provenance": provenance,
    })
    with run_lock(out):
        info = read_json(out / "run.json") or {}
        if not (info.get("status") == "complete" and info.get("plan_hash") == phash):
            # A previous summary must not survive into a run that may die before writing a new one.
            for stale in ("summary.csv", "records.parquet"):
                (out / stale).unlink(missing_ok=True)
            write_json(out / "run.json", {**provenance, "plan_hash": phash, "status": "running"})
    shard_file = out / "shards" / f"{shard_i}-of-{shard_n}_{HOST}_{os.getpid()}_{uuid.uuid4().hex[:6]}.json"
    me = {"shard": shard_i, "n_shards": shard_n, "plan_hash": phash, "host": HOST, "pid": os.getpid(),
          "device": str(ctx.device), "device_name": device_name(ctx.device), "batch_size": ctx.batch_size,
          "precision": spec.precision, "units_assigned": len(mine), "started": now(), "t_started": time.time(),
          "status": "running", "pid_start": proc_start(os.getpid())}
    write_json(shard_file, me)
    try:
        with _sigterm_as_interrupt():
            computed, seconds = _work(ctx, out, mine, launched)
    except BaseException as exc:
        # the process itself records why its shard stopped (kill -9 is caught by mark_dead instead)
        stopped = "interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "failed"
        with contextlib.suppress(Exception):
            write_json(shard_file, {**me, "status": stopped, "finished": now(), "t_finished": time.time(),
                                    "error": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    write_json(shard_file, {**me, "status": "done", "finished": now(), "t_finished": time.time(),
                            "units_computed": computed, "compute_seconds": round(seconds, 3),
                            "wall_seconds": round(time.time() - t0, 3)})
    if launched.is_torchrun:
        # torchrun stops every rank when one fails, so rank 0 can wait for the others' units and
        # be the one that writes the tables (and prints them); the other ranks just leave.
        if shard_i != 0:
            return out
        wait_for_units(units_dir, units, quiet=spec.quiet)
    if all(unit_done(units_dir, u.key) for u in units):
        finalize_run(out, expected_plan=phash)
    elif shard_n == 1:
        missing = [u for u in units if not unit_done(units_dir, u.key)]
        raise RuntimeError(f"{len(missing)} work units are missing after the run")
    return out


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's or torchrun's stop) raises KeyboardInterrupt, so the shard entry is
    written as ``interrupted`` and finished units are flushed. Main thread only (signal rules)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _work(ctx: Context, out: Path, mine: List[Unit], launched: Launch) -> Tuple[int, float]:
    """Compute this process's units not done yet; wait for those other live processes hold."""
    from tqdm.auto import tqdm

    spec = ctx.spec
    units_dir = out / "units"
    bench = get_benchmark(spec.benchmark)
    verify_done_units(units_dir, mine)
    work = {u.key: (u.stop - u.start) * unit_weight(ctx, u) for u in mine}
    total = sum(work.values())
    done0 = sum(work[u.key] for u in mine if unit_done(units_dir, u.key))
    desc = f"{spec.model} {spec.benchmark}" + (f" {out.name}" if spec.out else "") + (
        f" [shard {launched.index}/{launched.count}]" if launched.count > 1 else "")  # a study's row: its folder
    tty = sys.stderr.isatty()
    # under torchrun one bar per node is enough (shards are balanced, so its ETA stands for all)
    show = not spec.quiet and launched.leads_node
    computed, seconds = 0, 0.0
    # Unit files are written by one background thread while the next unit computes (a unit's
    # parquet + json + fsync cost ~10-20 ms: a third of a 512-image clean unit on a GPU). At most
    # one write is in flight; a unit's claim is released only once its files are in place.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unit-writer")
    inflight: List[Future] = []
    from ..runtime.progress import LogLines

    with Claims(units_dir) as claims, tqdm(total=total, initial=done0, unit=" passes", unit_scale=True,
                                           disable=not show, desc=desc, dynamic_ncols=True,
                                           file=sys.stderr if tty else LogLines(sys.stderr),
                                           mininterval=0.1 if tty else 30.0) as bar:
        ctx.progress = bar
        try:
            pending = [u for u in mine if not unit_done(units_dir, u.key)]
            wait = 0.2
            while pending:
                progressed, held = False, []
                by_span = _by_span(pending)
                # chunk-major: a chunk is decoded once, then every unit of it runs while it is held
                for span, _ in ctx.chunks(list(by_span)):
                    for u in by_span[span]:
                        if unit_done(units_dir, u.key):
                            bar.update(work[u.key])
                            continue
                        if not claims.try_claim(u.key):
                            held.append(u)
                            continue
                        try:
                            if unit_done(units_dir, u.key):  # finished by another process meanwhile
                                claims.release(u.key)
                                bar.update(work[u.key])
                                continue
                            bar.set_postfix_str(short_label(u), refresh=tty)  # a log file: every 30 s
                            start = bar.n
                            ctx.weight, ctx.unit_end = unit_weight(ctx, u), start + work[u.key]
                            tu = time.time()
                            recs = _compute_records(ctx, bench, u)
                            dt = time.time() - tu
                            bar.update(max(0.0, ctx.unit_end - bar.n))  # a unit that advanced less (or not at all)
                        except BaseException:
                            claims.release(u.key)
                            raise
                        while inflight:  # backpressure, and a failed write stops the run here
                            inflight.pop(0).result()
                        inflight.append(writer.submit(_write_unit, ctx, u, recs, units_dir, dt, claims))
                        computed += 1
                        seconds += dt
                        progressed = True
                while inflight:
                    inflight.pop(0).result()
                pending = [u for u in held if not unit_done(units_dir, u.key)]
                if pending and not progressed:
                    bar.set_postfix_str(f"waiting for {len(pending)} unit(s) held by other processes")
                    time.sleep(wait)
                    wait = min(5.0, wait * 1.5)
        finally:
            # finished units are saved even when the run stops with an error or Ctrl-C
            for f in inflight:
                try:
                    f.result()
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    pass
            writer.shutdown(wait=True)
            ctx.progress, ctx.weight, ctx.unit_end = None, 1.0, None
    return computed, seconds




def unit_weight(ctx: Context, u: Unit) -> float:
    """Forward-pass equivalents per sample of a unit, as the dry run counts its passes: the bar's unit of work, so
    its ETA after the clean pass (1 per image) does not promise PGD-20 (2 + 20 x 3) at the clean pass's pace."""
    try:
        f, b = unit_passes(ctx, u)
    except Exception:  # noqa: BLE001 - a benchmark that cannot count its passes still runs: one per sample
        return 1.0
    return max(1.0, work_of(float(f), float(b)))


def _by_span(units: Sequence[Unit]) -> Dict[Tuple[int, int], List[Unit]]:
    """Units grouped by their sample range, ranges in order of first appearance, units in plan
    order within a range (so a chunk's clean unit runs before its attacks)."""
    out: Dict[Tuple[int, int], List[Unit]] = {}
    for u in units:
        out.setdefault((u.start, u.stop), []).append(u)
    return out


def verify_done_units(units_dir: Path, units: Sequence[Unit]) -> int:
    """On resume: recompute (delete, with a warning) finished units whose file fails its checksum;
    returns how many carry no checksum (written by an older version: used unverified, warned)."""
    unverified = 0
    for u in units:
        if not unit_done(units_dir, u.key):
            continue
        state, _, _ = read_unit_bytes(units_dir, u.key)
        if state in (MISMATCH, BAD_META):
            warn(f"{problem(state, units_dir, u.key)}; recomputing {unit_label(u)}")
            for suffix in (".json", ".parquet"):  # json first: the unit stops counting as done at once
                (units_dir / f"{u.key}{suffix}").unlink(missing_ok=True)
        elif state == UNVERIFIED:
            unverified += 1
    warn_unverified(unverified, units_dir.parent)
    return unverified


def _compute_records(ctx: Context, bench: Any, u: Unit) -> pd.DataFrame:
    if u.benchmark != bench.name:  # a unit another benchmark plans into this run (--converge's ladder)
        bench = get_benchmark(u.benchmark)
    with unit_rng(unit_seed(u, ctx.spec.seed), ctx.device):
        recs = bench.run_unit(ctx, u)
    return _stamp(recs.reset_index(drop=True), ctx, u)


def _write_unit(ctx: Context, u: Unit, recs: pd.DataFrame, units_dir: Path, seconds: float,
                claims: Optional[Claims] = None) -> None:
    """Records, then metadata (each atomic and fsync'ed): the unit is done once both exist."""
    try:
        sides = write_sidecars(units_dir, u.key, ctx.sidecars.pop(u.key, {}))  # before the unit counts as done
        digest = write_parquet_atomic(recs, units_dir / f"{u.key}.parquet")
        write_json(units_dir / f"{u.key}.json", durable=True, obj={
            **unit_to_dict(u), CHECKSUM_KEY: digest, **sides, "n": len(recs), "n_samples": int(recs["sample_id"].nunique()),
            "seconds": round(seconds, 3), "device": str(ctx.device), "host": HOST, "pid": os.getpid(),
            "batch_size": ctx.batch_size, "finished": now()})
    finally:
        if claims is not None:
            claims.release(u.key)


def _stamp(recs: pd.DataFrame, ctx: Context, u: Unit) -> pd.DataFrame:
    front = {k: ctx.ids[k] for k in RECORD_ID_COLS}
    front.update({"benchmark": u.benchmark, "attack": u.attack, "eps": float(u.eps), "params": u.params,
                  "condition": u.condition, "unit": u.key})
    for k, v in reversed(list(front.items())):
        recs.insert(0, k, v)
    n_skipped = getattr(ctx.dataset, "n_unreadable", None)
    if n_skipped is not None and "skipped_unreadable" not in recs.columns:
        recs["skipped_unreadable"] = int(n_skipped)  # what shrank n, on every benchmark's records
    return recs

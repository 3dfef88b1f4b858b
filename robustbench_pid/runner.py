"""The batch runner: spec -> model + data -> work units -> per-sample records -> run folder.

Work units (benchmark x attack x eps x chunk of samples) are keyed by a content hash of
everything that determines their records. The run folder::

    plan.json                 every unit of the run (keys, settings, sample ranges) + sample ids
    units/<key>.parquet/.json a finished unit: records, then metadata with the records' sha256
                              (each temp file + rename; the checksum is verified on every read)
    units/<key>.claim         "a live process is computing this unit" (O_EXCL create)
    shards/<i>-of-<n>_*.json  one per process: which shard, where, when, with which plan
    records.parquet, summary.csv, run.json   written by finalize once every unit is present, in this
                              order: run.json's status "complete" is the last write

Why it is built this way:
- Exact resume. A unit is done exactly when both its parquet and json exist; both are written
  to a temp file, fsync'ed and renamed, parquet first, so a ``kill -9`` at any moment leaves
  either a finished unit or nothing. Randomness is seeded per unit from its key (a generator
  handed to the attack, plus the global torch/numpy/random RNGs forked, seeded and restored
  around the unit, because libraries such as AutoAttack reseed or draw from the global RNG),
  so which process computes a unit, and in which order, does not change its records.
- Concurrency without a coordinator. A unit is claimed by creating ``<key>.claim`` with
  O_EXCL (atomic on local disks and NFS v3+). A claim whose process is gone (same host: the pid
  is dead or was reused; any host: no heartbeat for ``ROBUSTBENCH_PID_CLAIM_TIMEOUT`` seconds,
  default 600; a background thread refreshes it every ~minute) is taken over. Claims only
  avoid duplicate work: correctness rests on the atomic writes, and two processes that do
  compute one unit write identical records.
- Sharding on existing launchers, no collectives. A shard takes every n-th unit of the plan
  (``--shard i/n``, torchrun's RANK/WORLD_SIZE, a Slurm array). No DistributedSampler (it pads
  with duplicated samples, pytorch#25162) and no process group: shards share nothing but the
  folder. Under torchrun rank 0 waits for the others and finalizes; otherwise whichever process
  sees every unit present finalizes (under a file lock, idempotent), and
  ``robustbench-pid merge`` does the same by hand, checking every (configuration, sample)
  appears exactly once.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader

from . import __version__
from .benchmarks import Unit, check_options, get_benchmark
from .conditions import add_identity
from .data import dataset_info, load_dataset
from .device import attack_precision, check_precision, find_batch_size, pick_device, wants_channels_last
from .errors import UserError, without_worker_traceback, write_error
from .integrity import (BAD_META, CHECKSUM_KEY, MISMATCH, UNVERIFIED, problem, raise_bad_unit, read_unit_bytes,
                        sha256_bytes, warn, warn_unverified)
from .models import load_model
from .results import summarize
from .specs import PROTOCOLS, RunSpec

RECORD_ID_COLS = ("run_id", "model", "arch", "checkpoint_sha256", "dataset", "split", "protocol")
CONFIG_COLS = ("benchmark", "attack", "eps", "params", "condition")
PLAN_VERSION = 1
_HOST = socket.gethostname()


class _BatchPlan:
    """A batch sampler whose batches are set per unit, so one DataLoader (and its persistent
    workers) serves every unit instead of starting workers per unit."""

    def __init__(self) -> None:
        self.batches: List[List[int]] = []

    def __iter__(self) -> Iterator[List[int]]:
        return iter(list(self.batches))

    def __len__(self) -> int:
        return len(self.batches)


@dataclass
class Context:
    spec: RunSpec
    model: torch.nn.Module
    dataset: Any
    indices: List[int]
    device: torch.device
    ids: Dict[str, Any]
    progress: Any = None
    eval_model: Optional[torch.nn.Module] = None  # compiled model when --compile (clean/verdict passes)
    attack_model: Optional[torch.nn.Module] = None  # compiled model for attacks when --compile
    attack_net: Optional[torch.nn.Module] = None  # compiled ``model.net`` (paper protocol) when --compile
    batch_size: int = 0
    channels_last: bool = False
    _plan: _BatchPlan = field(default_factory=_BatchPlan, repr=False)
    _loader: Optional[DataLoader] = field(default=None, repr=False)
    _heartbeat: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.batch_size:
            self.batch_size = self.spec.batch_size

    def loader(self) -> DataLoader:
        if self._loader is None:
            w = self.spec.num_workers
            self._loader = DataLoader(
                self.dataset, batch_sampler=self._plan, num_workers=w,
                pin_memory=self.device.type == "cuda", persistent_workers=w > 0,
                prefetch_factor=4 if w > 0 else None,
            )
        return self._loader

    def batches(self, unit: Unit) -> Iterator[Tuple[torch.Tensor, torch.Tensor, List[str]]]:
        """(x, y, sample_ids) batches of the unit's samples, on the device (loading overlaps
        compute when --workers > 0; host->device copies are asynchronous from pinned memory)."""
        idx = self.indices[unit.start:unit.stop]
        bs = self.batch_size
        self._plan.batches = [idx[i:i + bs] for i in range(0, len(idx), bs)]
        pos = 0
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        for x, y in without_worker_traceback(self.loader()):  # a bad image in a worker: one-line error
            n = len(y)
            sids = [self.dataset.sample_ids[i] for i in idx[pos:pos + n]]
            pos += n
            x = x.to(self.device, non_blocking=True).float().contiguous(memory_format=fmt)
            yield x, y.to(self.device, non_blocking=True).long(), sids
        if pos != len(idx):
            raise RuntimeError(f"data loader returned {pos} of {len(idx)} samples for unit {unit.key[:12]}")

    def generator(self, unit: Unit) -> torch.Generator:
        """The unit's generator: on the CPU whatever the run's device (attacks draw on it and move
        the numbers to the device), so CPU and GPU runs draw the same random starts."""
        return torch.Generator().manual_seed(unit_seed(unit, self.spec.seed))

    # A compiled module must never be tested for truth (``a or b``): torch's OptimizedModule
    # forwards ``len()`` to the wrapped module, which has none. These pick it explicitly.
    def verdict_model(self) -> torch.nn.Module:
        """The model for clean and verdict passes (compiled when --compile)."""
        return self.eval_model if self.eval_model is not None else self.model

    def attacked_model(self) -> torch.nn.Module:
        """The model attacks differentiate in the standard protocol (compiled when --compile)."""
        return self.attack_model if self.attack_model is not None else self.model

    def attacked_net(self) -> torch.nn.Module:
        """The network without normalization, which the paper protocol attacks and scores."""
        return self.attack_net if self.attack_net is not None else self.model.net

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.update(n)


def unit_seed(unit: Unit, seed: int) -> int:
    """The seed of a unit's generator and global RNGs: a hash of what the unit does (benchmark,
    attack, its settings, condition, sample range) and the run's ``--seed``.

    Not of the model: two models evaluated with one command draw the same random starts on the
    same samples (common random numbers, which make their paired comparison sharper), and
    ``rbp.attack(..., seed=s)`` on the first n samples draws exactly what a run's first unit does.
    """
    h = _hash({"benchmark": unit.benchmark, "attack": unit.attack, "eps": float(unit.eps), "params": unit.params,
               "condition": unit.condition, "start": unit.start, "stop": unit.stop, "seed": int(seed)})
    return int(h[:15], 16)


@contextlib.contextmanager
def unit_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Global torch/CUDA/numpy/random RNGs seeded from the unit for its duration, then restored.

    Attacks get their own generator; this covers library code that draws from (or reseeds) the
    global RNG, so a unit's records never depend on what ran before it in the process.
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % (2 ** 32))
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@functools.lru_cache(maxsize=1)
def _git_commit() -> Optional[str]:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def _versions() -> Dict[str, str]:
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


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def default_out(spec: RunSpec, identity: Optional[Dict[str, Any]] = None) -> Path:
    """``identity``: content hashes of model/data objects, so different objects get different folders."""
    names = sorted({a.attack for a in spec.attacks})
    what = (Path(spec.suite).stem if spec.suite else
            "-".join(names) if names and spec.benchmark == "adversarial" else spec.benchmark)
    tag = _hash({**{k: v for k, v in spec.as_dict().items()
                    if k not in ("out", "quiet", "num_workers", "shard", "dry_run")},
                 **({"objects": identity} if identity else {})})[:8]
    safe_model = spec.model.replace(":", "-").replace("/", "-")
    return Path("results") / f"{safe_model}_{spec.dataset}_{what}_{spec.protocol}_{tag}"


def check_writable(out: Path) -> None:
    """Fail before any work if ``out`` cannot be created/written; creates nothing itself."""
    probe_dir = out
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir() or not os.access(probe_dir, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to output folder {out}: {probe_dir} is not a writable folder. "
                        f"Choose another with --out DIR")


def make_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-probe-{_HOST}-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write to output folder {out}: {exc.strerror or exc}. "
                        f"Choose another with --out DIR") from None


# --- atomic files --------------------------------------------------------------------------------
def _tmp_path(path: Path) -> Path:
    # host + pid + random: unique even for processes on different nodes sharing one folder
    return path.with_name(f".{path.name}.{_HOST}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    Temp file + rename is what makes a ``kill -9`` harmless; ``durable`` adds an fsync of the
    data before the rename, so a unit also survives a machine crash (the page cache is lost).
    Status files skip it: they are rewritten by the next run anyway.
    """
    tmp = _tmp_path(path)
    try:
        _write_file(tmp, data, durable)
        os.replace(tmp, path)
    except OSError as exc:  # disk full / permission lost: one line naming the file, not a traceback
        err = write_error(exc, path)
        if err is None:
            raise
        raise err from None
    finally:
        with contextlib.suppress(OSError):
            if tmp.exists():
                tmp.unlink()


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _write_file(tmp: Path, data: bytes, durable: bool) -> None:
    """The one place bytes reach the disk (tests inject disk-full / permission faults here)."""
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> str:
    """Write ``df`` atomically; returns the sha256 of the bytes written (recorded for units)."""
    data = parquet_bytes(df)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def _write_json(path: Path, obj: Dict[str, Any], durable: bool = False) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode(), durable=durable)


def _read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def unit_done(units_dir: Path, key: str) -> bool:
    return (units_dir / f"{key}.parquet").is_file() and (units_dir / f"{key}.json").is_file()


def clean_stale_temps(d: Path, min_age: float = 3600.0) -> int:
    """Remove temp files that no live writer can own (same host, dead pid; or older than min_age)."""
    n = 0
    for p in d.glob(".*.tmp"):
        parts = p.name.rsplit(".", 4)  # .<name>.<host>.<pid>.<rand>.tmp
        try:
            host, pid = parts[-4], int(parts[-3])
            dead = host == _HOST and not _pid_alive(pid)
            if dead or time.time() - p.stat().st_mtime > min_age:
                p.unlink()
                n += 1
        except (ValueError, IndexError, OSError):
            continue
    return n


# --- claims ----------------------------------------------------------------------------------------
def _proc_start(pid: int) -> Optional[str]:
    """Start time of ``pid`` (Linux), to tell a live claimant from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def claim_timeout() -> float:
    try:
        return float(os.environ.get("ROBUSTBENCH_PID_CLAIM_TIMEOUT", "600"))
    except ValueError:
        raise UserError("ROBUSTBENCH_PID_CLAIM_TIMEOUT must be a number of seconds") from None


_ACTIVE_TOKENS: set = set()  # claim tokens of runs alive in this process


class Claims:
    """O_EXCL claim files with heartbeat and stale-claim takeover (see module docstring)."""

    def __init__(self, units_dir: Path, timeout: Optional[float] = None) -> None:
        self.dir = units_dir
        self.timeout = claim_timeout() if timeout is None else timeout
        self.token = uuid.uuid4().hex
        _ACTIVE_TOKENS.add(self.token)
        self.me = {"host": _HOST, "pid": os.getpid(), "pid_start": _proc_start(os.getpid()), "token": self.token}
        self.held: Dict[str, Path] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.claim"

    def holder(self, key: str) -> Optional[Dict[str, Any]]:
        return _read_json(self.path(key))

    def is_stale(self, p: Path) -> bool:
        try:
            age = time.time() - p.stat().st_mtime
        except FileNotFoundError:
            return True
        info = _read_json(p)
        if not info:  # being written right now, or garbage left by a crash
            return age > 30
        if info.get("host") == _HOST:
            pid = int(info.get("pid", -1))
            if pid == os.getpid():
                return info.get("token") not in _ACTIVE_TOKENS  # left by an earlier run in this process
            if not _pid_alive(pid):
                return True
            start = info.get("pid_start")
            if start is not None and _proc_start(pid) not in (None, start):
                return True  # pid recycled by another process
        return age > self.timeout

    def try_claim(self, key: str) -> bool:
        p = self.path(key)
        for _ in range(3):
            try:
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self.is_stale(p):
                    return False
                # Move the stale claim aside atomically: of several processes judging it stale,
                # exactly one rename succeeds; the rest retry the O_EXCL create and lose to it.
                try:
                    os.replace(p, p.with_name(f".{p.name}.stale.{self.token[:8]}"))
                    p.with_name(f".{p.name}.stale.{self.token[:8]}").unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({**self.me, "time": time.time()}, f)
            with self._lock:
                self.held[key] = p
            return True
        return False

    def release(self, key: str) -> None:
        with self._lock:
            p = self.held.pop(key, None)
        if p is not None:
            info = _read_json(p)
            if info is None or info.get("token") == self.token:
                p.unlink(missing_ok=True)

    def release_all(self) -> None:
        for key in list(self.held):
            self.release(key)

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                paths = list(self.held.values())
            for p in paths:
                try:
                    os.utime(p)
                except OSError:
                    pass

    def __enter__(self) -> "Claims":
        every = max(0.5, min(60.0, self.timeout / 5))
        self._thread = threading.Thread(target=self._beat, args=(every,), daemon=True, name="claim-heartbeat")
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.release_all()
        _ACTIVE_TOKENS.discard(self.token)


def _run_lock(out: Path) -> Any:
    """An inter-process lock for run-level state (run.json, finalize). Falls back to no lock on
    file systems without flock support: finalize is idempotent and every write is atomic."""
    from filelock import FileLock

    lock = FileLock(str(out / ".run.lock"), timeout=600)
    try:
        lock.acquire()
    except (OSError, NotImplementedError):
        return contextlib.nullcontext()
    lock.release()
    return lock


# --- sharding -------------------------------------------------------------------------------------
def shard_of(spec: RunSpec) -> Tuple[int, int]:
    """(index, count) from --shard, torchrun (RANK/WORLD_SIZE) or a Slurm array; (0, 1) otherwise."""
    if spec.shard:
        try:
            i, n = (int(t) for t in str(spec.shard).split("/"))
        except ValueError:
            raise UserError(f"--shard must look like i/n (e.g. 0/4), got {spec.shard!r}") from None
        if not (n >= 1 and 0 <= i < n):
            raise UserError(f"--shard {spec.shard}: need 0 <= i < n")
        return i, n
    env = os.environ
    if "WORLD_SIZE" in env and "RANK" in env:
        i, n = int(env["RANK"]), int(env["WORLD_SIZE"])
        where = "torchrun RANK/WORLD_SIZE"
    elif "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        lo = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        i, n = int(env["SLURM_ARRAY_TASK_ID"]) - lo, int(env["SLURM_ARRAY_TASK_COUNT"])
        where = "Slurm array (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT)"
    else:
        return 0, 1
    if not (n >= 1 and 0 <= i < n):
        raise UserError(f"{where} gives shard {i} of {n}; array ids must be contiguous (e.g. --array=0-7), "
                        f"or pass --shard i/n explicitly")
    return i, n


def shard_units(units: Sequence[Unit], i: int, n: int) -> List[Unit]:
    """Every n-th unit: each shard gets a mix of clean (cheap) and attack (costly) units."""
    return [u for j, u in enumerate(units) if j % n == i]


# --- preparation ----------------------------------------------------------------------------------
def prepare(spec: RunSpec, model: Optional[torch.nn.Module] = None, data: Any = None) -> Context:
    """Validate the spec, load model and data (everything that can fail fast fails here).

    ``model``/``data``: objects already made the runner's own (``objects.wrap_model`` /
    ``objects.as_data``: copies, never the caller's) used instead of the spec's names.
    """
    if spec.protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {spec.protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if spec.batch_size < 0 or spec.chunk_size < 1:
        raise UserError("--batch-size must be >= 1 (or 0: find automatically on GPU) and --chunk-size >= 1")
    if spec.num_workers < 0:
        raise UserError(f"--workers must be >= 0, got {spec.num_workers}")
    if spec.limit is not None and spec.limit < 1:
        raise UserError(f"--limit must be >= 1, got {spec.limit}")
    shard_of(spec)  # malformed --shard / environment -> clear error before loading anything
    get_benchmark(spec.benchmark)  # unknown benchmark -> clear error
    check_options(spec.benchmark, spec.benchmark_options)  # unknown --bench-opt key -> clear error
    info = dataset_info(spec.dataset) if data is None else None
    device = pick_device(spec.device)
    check_precision(device, spec.precision)
    if spec.batch_size == 0 and device.type != "cuda":
        raise UserError("--batch-size 0 (find automatically) needs a GPU; on CPU give a number, e.g. --batch-size 64")
    if model is None:
        model = load_model(spec.model, spec.checkpoint, spec.dataset, allow_pickle=spec.allow_pickle,
                           strict=spec.strict, **spec.arch_kwargs)
    model = model.to(device)  # the runner's own object (loaded here, or a copy of the caller's)
    channels_last = wants_channels_last(model, device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    ds_opts: Dict[str, Any] = dict(spec.benchmark_options.get("dataset", {}))
    if spec.subset is not None:
        ds_opts.update(subset=spec.subset, subset_seed=spec.seed)
    if spec.skip_unreadable:
        ds_opts["skip_unreadable"] = True
    if data is None:
        ds = load_dataset(spec.dataset, spec.split, spec.data_root, **ds_opts,
                          model_info={k: v for k, v in model.info.items() if v is not None})
    else:
        ds = data
    if model.info.get("num_classes") is None or model.info.get("input_size") is None:
        from .objects import complete_info

        complete_info(model, ds[0][0], device)
    n = len(ds) if spec.limit is None else min(spec.limit, len(ds))
    if n == 0:
        raise UserError(f"dataset {spec.dataset!r} ({spec.split}) is empty")
    ids = {
        "model": spec.model, "arch": model.info["arch"], "checkpoint_sha256": model.info.get("checkpoint_sha256"),
        "dataset": spec.dataset, "split": spec.split, "protocol": spec.protocol,
    }
    batch_size = spec.batch_size
    if batch_size == 0:
        batch_size = find_batch_size(model, tuple(model.info["input_size"]), device, spec.precision)
    ctx = Context(spec, model, ds, list(range(n)), device, ids, batch_size=batch_size, channels_last=channels_last)
    if spec.compile:
        # Compiled once here, on the run's own model object, and reused by every unit (compilation
        # happens lazily at the first call; batch-size changes trigger one dynamic recompile).
        compiled = torch.compile(model)
        ctx.eval_model = compiled
        ctx.attack_model = compiled
        ctx.attack_net = torch.compile(model.net)
    classes = model.info["num_classes"]
    if info is not None and info.num_classes != classes:
        raise UserError(f"the model outputs {classes} classes but dataset {spec.dataset!r} has {info.num_classes}; "
                        f"give a model for this dataset (or num_classes= / a matching head)")
    if data is not None and getattr(data, "max_label", -1) >= classes:
        raise UserError(f"data= has labels up to {data.max_label} but the model outputs {classes} classes; "
                        f"labels must be 0..{classes - 1}")
    return ctx


def unit_key(ctx: Context, u: Unit) -> str:
    m = ctx.model.info
    return _hash({
        "v": 1, "benchmark": u.benchmark, "attack": u.attack, "eps": u.eps, "params": u.params,
        "condition": u.condition, "samples": ctx.dataset.sample_ids[ctx.indices[u.start]] if u.stop > u.start else None,
        "start": u.start, "stop": u.stop, "n_total": len(ctx.indices),
        "arch": m["arch"], "arch_kwargs": m["arch_kwargs"], "checkpoint_sha256": m.get("checkpoint_sha256"),
        "dataset": ctx.spec.dataset, "split": ctx.spec.split, "protocol": ctx.spec.protocol,
        "seed": ctx.spec.seed, "batch_size": ctx.batch_size, "precision": ctx.spec.precision,
        "bench_opts": ctx.spec.benchmark_options,
        # data objects (rbp.evaluate(data=...)) are known by their content, not by a name
        **({"data_sha256": ctx.dataset.content_sha256} if getattr(ctx.dataset, "content_sha256", None) else {}),
    })


def plan_units(ctx: Context) -> List[Unit]:
    units = get_benchmark(ctx.spec.benchmark).plan(ctx)
    units = [replace(u, key=unit_key(ctx, u)) for u in units]
    seen: Dict[str, Unit] = {}
    for u in units:
        if u.key in seen:
            raise RuntimeError(f"benchmark {ctx.spec.benchmark!r} planned the same work unit twice: {u}")
        seen[u.key] = u
    return units


def chunks(n: int, size: int) -> List[Tuple[int, int]]:
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _unit_dict(u: Unit) -> Dict[str, Any]:
    return {"key": u.key, "benchmark": u.benchmark, "attack": u.attack, "eps": u.eps, "params": u.params,
            "condition": u.condition, "start": u.start, "stop": u.stop}


def _unit_from(d: Dict[str, Any]) -> Unit:
    return Unit(d["benchmark"], d["attack"], float(d["eps"]), d["params"], d["condition"],
                int(d["start"]), int(d["stop"]), d["key"])


def plan_hash(units: Sequence[Unit]) -> str:
    return _hash([u.key for u in units])


def unit_label(u: Unit) -> str:
    what = u.attack if not u.condition else f"{u.attack} {u.condition}"
    from .report_text import eps_label

    eps = f" eps={eps_label(u.eps)}" if u.eps else ""
    return f"{u.benchmark}/{what}{eps} samples [{u.start}:{u.stop}] (unit {u.key[:12]})"


# --- the run --------------------------------------------------------------------------------------
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
    shard_i, shard_n = shard_of(spec)
    mine = shard_units(units, shard_i, shard_n)
    ctx.ids["run_id"] = out.name
    if spec.dry_run:
        if not (spec.shard is None and "RANK" in os.environ and shard_i != 0):  # one plan per torchrun job
            dry_run(ctx, out, units, mine, (shard_i, shard_n))
        return out
    make_out_dir(out)
    units_dir = out / "units"
    units_dir.mkdir(exist_ok=True)
    (out / "shards").mkdir(exist_ok=True)
    clean_stale_temps(units_dir)
    clean_stale_temps(out)
    provenance = _provenance(ctx, spec, out, units)
    check_same_model(out, provenance)
    phash = plan_hash(units)
    _write_json(out / "plan.json", {
        "version": PLAN_VERSION, "plan_hash": phash, "run_id": out.name, "n_units": len(units),
        "units": [_unit_dict(u) for u in units],
        "sample_ids": [str(ctx.dataset.sample_ids[i]) for i in ctx.indices],
        "provenance": provenance,
    })
    with _run_lock(out):
        info = _read_json(out / "run.json") or {}
        if not (info.get("status") == "complete" and info.get("plan_hash") == phash):
            # A previous summary must not survive into a run that may die before writing a new one.
            for stale in ("summary.csv", "records.parquet"):
                (out / stale).unlink(missing_ok=True)
            _write_json(out / "run.json", {**provenance, "plan_hash": phash, "status": "running"})
    shard_file = out / "shards" / f"{shard_i}-of-{shard_n}_{_HOST}_{os.getpid()}_{uuid.uuid4().hex[:6]}.json"
    me = {"shard": shard_i, "n_shards": shard_n, "plan_hash": phash, "host": _HOST, "pid": os.getpid(),
          "device": str(ctx.device), "device_name": _device_name(ctx.device), "batch_size": ctx.batch_size,
          "precision": spec.precision, "units_assigned": len(mine), "started": _now(), "t_started": time.time(), "status": "running",
          "pid_start": _proc_start(os.getpid())}
    _write_json(shard_file, me)
    try:
        with _sigterm_as_interrupt():
            computed, seconds = _work(ctx, out, mine, (shard_i, shard_n))
    except BaseException as exc:
        # the process itself records why its shard stopped (kill -9 is caught by mark_dead instead)
        stopped = "interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "failed"
        with contextlib.suppress(Exception):
            _write_json(shard_file, {**me, "status": stopped, "finished": _now(), "t_finished": time.time(),
                                     "error": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    _write_json(shard_file, {**me, "status": "done", "finished": _now(), "t_finished": time.time(), "units_computed": computed,
                             "compute_seconds": round(seconds, 3), "wall_seconds": round(time.time() - t0, 3)})
    torchrun = not spec.shard and "RANK" in os.environ and "WORLD_SIZE" in os.environ and shard_n > 1
    if torchrun:
        # torchrun stops every rank when one fails, so rank 0 can wait for the others' units and
        # be the one that writes the tables (and prints them); the other ranks just leave.
        if shard_i != 0:
            return out
        _wait_for_units(units_dir, units, quiet=spec.quiet)
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


MODEL_IDENTITY = ("arch", "arch_kwargs", "checkpoint_sha256")


def check_same_model(out: Path, provenance: Dict[str, Any]) -> None:
    """Refuse to write a run of one model into a folder holding a run of another: records of two
    models must never mix (and one model's resume must never pick up another's units)."""
    old = (_read_json(out / "plan.json") or {}).get("provenance")
    if not old or all(old.get(k) == provenance.get(k) for k in MODEL_IDENTITY):
        return

    def desc(p: Dict[str, Any]) -> str:
        sha = p.get("checkpoint_sha256")
        return f"{p.get('model')} ({p.get('arch')}, weights {'sha256 ' + sha[:12] if sha else 'unhashed'})"

    raise UserError(f"{out} holds a run of another model: {desc(old)}; this run evaluates {desc(provenance)}. "
                    f"One run folder holds one model: pass another out folder (--out / out=), or delete {out} "
                    f"to start over")


def _work(ctx: Context, out: Path, mine: List[Unit], shard: Tuple[int, int]) -> Tuple[int, float]:
    """Compute this process's units not done yet; wait for those other live processes hold."""
    from tqdm.auto import tqdm

    spec = ctx.spec
    units_dir = out / "units"
    bench = get_benchmark(spec.benchmark)
    verify_done_units(units_dir, mine)
    total = sum(u.stop - u.start for u in mine)
    done0 = sum(u.stop - u.start for u in mine if unit_done(units_dir, u.key))
    desc = f"{spec.model} {spec.benchmark}" + (f" [shard {shard[0]}/{shard[1]}]" if shard[1] > 1 else "")
    tty = sys.stderr.isatty()
    # under torchrun one bar per node is enough (shards are balanced, so its ETA stands for all)
    show = not spec.quiet and os.environ.get("LOCAL_RANK", "0") == "0"
    computed, seconds = 0, 0.0
    # Unit files are written by one background thread while the next unit computes (a unit's
    # parquet + json + fsync cost ~10-20 ms: a third of a 512-image clean unit on a GPU). At most
    # one write is in flight; a unit's claim is released only once its files are in place.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unit-writer")
    inflight: List[Future] = []
    with Claims(units_dir) as claims, tqdm(total=total, initial=done0, unit="img", disable=not show, desc=desc,
                                           dynamic_ncols=True, mininterval=0.1 if tty else 30.0) as bar:
        ctx.progress = bar
        try:
            pending = [u for u in mine if not unit_done(units_dir, u.key)]
            wait = 0.2
            while pending:
                progressed, held = False, []
                for u in pending:
                    if unit_done(units_dir, u.key):
                        bar.update(u.stop - u.start)
                        continue
                    if not claims.try_claim(u.key):
                        held.append(u)
                        continue
                    try:
                        if unit_done(units_dir, u.key):  # finished by another process meanwhile
                            claims.release(u.key)
                            bar.update(u.stop - u.start)
                            continue
                        bar.set_postfix_str(_short(u))
                        tu = time.time()
                        recs = _compute_records(ctx, bench, u)
                        dt = time.time() - tu
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
            ctx.progress = None
    return computed, seconds


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


def _fresh_claims(units_dir: Path, within: float) -> bool:
    now = time.time()
    for p in units_dir.glob("*.claim"):
        try:
            if now - p.stat().st_mtime < within:
                return True
        except FileNotFoundError:
            continue
    return False


def _wait_for_units(units_dir: Path, units: Sequence[Unit], quiet: bool) -> None:
    """Poll until every unit is done, or until for the claim timeout no unit has finished and no
    claim has a fresh heartbeat (a rank that hangs): then return and leave the run to ``merge``."""
    last_n, last_t, wait, said = -1, time.time(), 0.5, 0.0
    while True:
        n = sum(unit_done(units_dir, u.key) for u in units)
        if n == len(units):
            return
        if n != last_n:
            last_n, last_t = n, time.time()
            if not quiet and time.time() - said > 60:
                said = time.time()
                print(f"rank 0: waiting for the other ranks ({len(units) - n} units to go)", file=sys.stderr)
        elif time.time() - last_t > claim_timeout() and not _fresh_claims(units_dir, claim_timeout()):
            print(f"rank 0: no unit finished for {claim_timeout():.0f} s; leaving the run for "
                  f"`robustbench-pid merge`", file=sys.stderr)
            return
        time.sleep(wait)
        wait = min(5.0, wait * 1.5)


def _compute_records(ctx: Context, bench: Any, u: Unit) -> pd.DataFrame:
    with unit_rng(unit_seed(u, ctx.spec.seed), ctx.device):
        recs = bench.run_unit(ctx, u)
    return _stamp(recs.reset_index(drop=True), ctx, u)


def _write_unit(ctx: Context, u: Unit, recs: pd.DataFrame, units_dir: Path, seconds: float,
                claims: Optional["Claims"] = None) -> None:
    """Records, then metadata (each atomic and fsync'ed): the unit is done once both exist."""
    try:
        digest = write_parquet_atomic(recs, units_dir / f"{u.key}.parquet")
        _write_json(units_dir / f"{u.key}.json", durable=True, obj={
            **_unit_dict(u), CHECKSUM_KEY: digest, "n": len(recs), "n_samples": int(recs["sample_id"].nunique()),
            "seconds": round(seconds, 3), "device": str(ctx.device), "host": _HOST, "pid": os.getpid(),
            "batch_size": ctx.batch_size, "finished": _now()})
    finally:
        if claims is not None:
            claims.release(u.key)


# --- merge / finalize ---------------------------------------------------------------------------
class IncompleteRun(UserError):
    """Some units of the plan are missing (a shard has not run or has not finished)."""


def load_plan(out: Path) -> Dict[str, Any]:
    out = Path(out)
    if not out.is_dir():
        raise UserError(f"run folder not found: {out}")
    plan = _read_json(out / "plan.json")
    if plan is None:
        raise UserError(f"{out} has no readable plan.json: not a run folder of this version (re-run the evaluate "
                        f"command with --out {out} to (re)create it; finished units are reused)")
    return plan


def check_complete(out: Path, plan: Dict[str, Any]) -> List[Unit]:
    """The plan's units, or IncompleteRun naming the missing units and the shards that own them."""
    units = [_unit_from(d) for d in plan["units"]]
    units_dir = Path(out) / "units"
    missing = [(j, u) for j, u in enumerate(units) if not unit_done(units_dir, u.key)]
    if not missing:
        return units
    shard_infos = [s for s in (_read_json(p) for p in sorted((Path(out) / "shards").glob("*.json"))) if s]
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
            gone = (st is not None and st.get("status") == "running" and st.get("host") == _HOST
                    and not _pid_alive(int(st.get("pid", -1))))
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


def check_records(units: Sequence[Unit], frames: Sequence[pd.DataFrame], sample_ids: Sequence[str]) -> None:
    """Every (configuration, sample) exactly once: each unit holds exactly its own samples (each
    with the same number of rows), the units of one configuration cover disjoint sample ranges,
    and the sample ids are unique. Cheap enough for millions of records (no per-sample dicts)."""
    problems: List[str] = []
    ids = [str(s) for s in sample_ids]
    if len(set(ids)) != len(ids):
        dup = pd.Series(ids)[pd.Series(ids).duplicated()].unique()[:5]
        problems.append(f"the dataset repeats sample ids {list(dup)}: records could not be told apart")
    spans: Dict[Tuple[Any, ...], List[Tuple[int, int, str]]] = {}
    for u, df in zip(units, frames):
        expected = ids[u.start:u.stop]
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
    with _run_lock(out):
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
        records = pd.concat(frames, ignore_index=True)
        # each record says what was measured: precision and the condition's identity (conditions.py)
        records = add_identity(records.assign(precision=str(plan["provenance"].get("precision") or "fp32")))
        summary = summarize(records)
        shards = [mark_dead(s) for s in (_read_json(p) for p in sorted((out / "shards").glob("*.json")))
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
        write_parquet_atomic(records, out / "records.parquet")
        atomic_write_bytes(out / "summary.csv", summary.to_csv(index=False).encode())
        _write_json(out / "run.json", {
            **prov, "plan_hash": plan["plan_hash"], "status": "complete",
            "wall_seconds": round(time.time() - t_start, 2) if t_start else None,
            "compute_seconds": round(sum(float(m.get("seconds", 0)) for m in metas), 2),
            "n_records": len(records), "units_unverified": unverified, "shards": shards, "finished": _now(),
            "finalized_by": {"host": _HOST, "pid": os.getpid()}})
    return summary


def mark_dead(shard: Dict[str, Any]) -> Dict[str, Any]:
    """A shard entry still ``running`` whose process is gone (same host: pid dead or recycled)
    becomes ``died``; entries of other hosts cannot be checked and are left as they are."""
    if shard.get("status") != "running" or shard.get("host") != _HOST:
        return shard
    pid = int(shard.get("pid", -1))
    start = shard.get("pid_start")
    recycled = start is not None and _proc_start(pid) not in (None, start)
    if _pid_alive(pid) and not recycled:
        return shard
    return {**shard, "status": "died"}


def merge(out: Path) -> pd.DataFrame:
    """``robustbench-pid merge``: check a (sharded) run folder and write its tables."""
    return finalize_run(Path(out))


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


def _short(u: Unit) -> str:
    from .report_text import eps_label

    eps = f" eps={eps_label(u.eps)}" if u.eps else ""
    cond = f" {u.condition}" if u.condition else ""
    return f"{u.attack}{eps}{cond} [{u.start}:{u.stop}]"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _provenance(ctx: Context, spec: RunSpec, out: Path, units: List[Unit]) -> Dict[str, Any]:
    """Run-level provenance (the same for every shard of the run; per-process facts go to shards/)."""
    m = ctx.model.info
    spec_d = spec.as_dict()
    spec_d["shard"] = None
    return {
        "run_id": out.name, "spec": spec_d, "model": spec.model, "arch": m["arch"],
        "arch_kwargs": m["arch_kwargs"], "checkpoint": m.get("checkpoint"),
        "checkpoint_sha256": m.get("checkpoint_sha256"), "checkpoint_strict": m.get("strict", True),
        "checkpoint_load_problems": m.get("load_problems", []), "model_config": {
            k: m[k] for k in ("mean", "std", "input_size", "interpolation", "crop_pct", "num_classes")},
        "dataset": spec.dataset, "split": spec.split, "data_root": spec.data_root,
        "dataset_provenance": getattr(ctx.dataset, "provenance", {}), "n_samples": len(ctx.indices),
        "limit": spec.limit, "protocol": spec.protocol, "benchmark": spec.benchmark,
        "attacks": [{"attack": a.attack, **a.params} for a in spec.attacks], "suite": spec.suite,
        "seed": spec.seed, "device": str(ctx.device), "device_name": _device_name(ctx.device),
        "precision": spec.precision, "compile": spec.compile, "batch_size": ctx.batch_size,
        "chunk_size": spec.chunk_size, "n_units": len(units), "versions": _versions(), "git_commit": _git_commit(),
        "started": _now(),
    }


# --- dry run ----------------------------------------------------------------------------------------
def unit_passes(ctx: Context, u: Unit) -> Tuple[float, float]:
    """(forward-only, forward+backward) passes per sample for a unit if every sample is attacked to
    the end (early stopping and skipped samples lower it). Attacks or benchmarks may define ``passes()``."""
    bench = get_benchmark(u.benchmark)
    if hasattr(bench, "passes"):
        return tuple(bench.passes(ctx, u))  # type: ignore[return-value]
    if u.benchmark != "adversarial":
        return 1.0, 0.0
    if u.attack == "clean":
        return 1.0, 0.0
    from .attacks import make_attack

    attack = make_attack(u.attack, **json.loads(u.params))
    fwd, fb = 2.0, 0.0  # clean pass + verdict pass
    if hasattr(attack, "passes"):
        a_fwd, a_fb = attack.passes()
        return fwd + a_fwd, fb + a_fb
    p = attack.params()
    known = {  # worst cases of the attacks shipped with the package (every sample survives to the end)
        "cw": lambda: (0, p["steps"] * p["search_steps"]),
        "spsa": lambda: (p["iterations"] * 2 * p["n_samples"], 0),  # +d and -d probe per direction
        "square": lambda: (p["n_queries"] * max(1, p.get("restarts", 1)), 0),
        # standard AutoAttack: APGD-CE 100 + APGD-T 9 x 100 + FAB-T 9 x 100 steps, Square 5000 queries
        "autoattack": lambda: (5000, 100 + 900 + 900),
    }
    if u.attack in known:
        try:
            a_fwd, a_fb = known[u.attack]()
            return fwd + a_fwd, fb + a_fb
        except (KeyError, TypeError):
            pass
    restarts = max(1, int(p.get("restarts", 1) or 1))
    steps = p.get("steps", p.get("iterations"))
    if not attack.uses_gradients:
        n = int(steps or 0) * max(1, int(p.get("n_samples", 1) or 1))
        return fwd + restarts * n, fb
    return fwd, fb + restarts * (int(steps) if steps is not None else 1)


def calibrate(ctx: Context, reps: int = 3) -> Tuple[float, float]:
    """Seconds per image of one forward and of one forward+backward-to-input pass, measured on
    one batch of the run's own data, model, device and precision (median of ``reps``)."""
    u = Unit("calibration", "clean", 0.0, "{}", "", 0, min(len(ctx.indices), ctx.batch_size), "0" * 64)
    x, y, _ = next(ctx.batches(u))
    model = ctx.verdict_model()
    amodel = ctx.attacked_model()

    def sync() -> None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    def fwd() -> None:
        with torch.inference_mode():
            model(x)

    def fb() -> None:
        xr = x.detach().clone().requires_grad_(True)
        with torch.enable_grad(), attack_precision(ctx.device, ctx.spec.precision):
            loss = torch.nn.functional.cross_entropy(amodel(xr).float(), y, reduction="sum")
        torch.autograd.grad(loss, xr)

    out = []
    for fn in (fwd, fb):
        fn()
        sync()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        out.append(float(np.median(times)) / len(y))
    return out[0], out[1]


def dry_run(ctx: Context, out: Path, units: List[Unit], mine: List[Unit], shard: Tuple[int, int]) -> None:
    """Print the plan, passes per unit and an estimated time; write nothing."""
    from .report_text import eps_label

    t_f, t_fb = calibrate(ctx)
    units_dir = out / "units"
    i, n = shard
    mine_keys = {u.key for u in mine}
    spec = ctx.spec
    print(f"dry run: {spec.model} on {spec.dataset} ({spec.split}), {len(ctx.indices)} samples, protocol "
          f"{spec.protocol}, benchmark {spec.benchmark}; run folder {out}")
    print(f"calibration on {ctx.device} ({_device_name(ctx.device)}), batch {ctx.batch_size}, precision "
          f"{spec.precision}: forward {1e3 * t_f:.3f} ms/img, forward+backward {1e3 * t_fb:.3f} ms/img")
    hdr = f"{'unit':12}  {'shard':>5}  {'attack':14} {'eps':>8}  {'condition':14} {'samples':>13}  " \
          f"{'fwd/img':>8} {'f+b/img':>8}  {'status':6} {'est. s':>9}"
    print(hdr)
    tot = {"f": 0.0, "fb": 0.0, "est": 0.0, "todo": 0}
    mine_tot = {"f": 0.0, "fb": 0.0, "est": 0.0, "todo": 0}
    for j, u in enumerate(units):
        f, b = unit_passes(ctx, u)
        m = u.stop - u.start
        est = m * (f * t_f + b * t_fb)
        done = unit_done(units_dir, u.key)
        status = "done" if done else "todo"
        for acc, on in ((tot, True), (mine_tot, u.key in mine_keys)):
            if on and not done:
                acc["f"] += f * m
                acc["fb"] += b * m
                acc["est"] += est
                acc["todo"] += 1
        eps = eps_label(u.eps) if u.eps else "-"
        print(f"{u.key[:12]:12}  {j % n:>5}  {u.attack[:14]:14} {eps:>8}  {(u.condition or '-')[:14]:14} "
              f"{f'{u.start}:{u.stop}':>13}  {f:>8g} {b:>8g}  {status:6} {est:>9.1f}")
    print(f"total: {len(units)} units, {tot['todo']} to do: {tot['f']:.0f} forward and {tot['fb']:.0f} "
          f"forward+backward image-passes, about {_fmt_s(tot['est'])} on one {ctx.device.type} device like this one")
    if n > 1:
        print(f"this shard ({i}/{n}): {len(mine)} units, {mine_tot['todo']} to do, about {_fmt_s(mine_tot['est'])}")
    print("this is an estimate from one calibration batch, not a bound: early stopping and samples not attacked "
          "make a run shorter, per-unit overheads and data loading make it longer (measured error on real runs: "
          "docs/performance.md). Nothing was computed or written.")


def _fmt_s(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"

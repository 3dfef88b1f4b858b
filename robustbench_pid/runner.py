"""The batch runner: spec -> model + data -> work units -> per-sample records -> run folder.

Work units (benchmark x attack x eps x chunk of samples) are keyed by a content hash of
everything that determines their records; each is written atomically (temp file + rename,
records then metadata), so re-running the same command skips finished units and an interrupted
run resumes exactly. Randomness is seeded per unit from its key, so the order or the process
that computes a unit does not change its records.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pandas as pd
import torch
from torch.utils.data import DataLoader, Subset

from . import __version__
from .benchmarks import Unit, get_benchmark
from .data import dataset_info, load_dataset
from .device import pick_device
from .errors import UserError
from .models import load_model
from .results import summarize
from .specs import PROTOCOLS, RunSpec

RECORD_ID_COLS = ("run_id", "model", "arch", "checkpoint_sha256", "dataset", "split", "protocol")


@dataclass
class Context:
    spec: RunSpec
    model: torch.nn.Module
    dataset: Any
    indices: List[int]
    device: torch.device
    ids: Dict[str, Any]
    progress: Any = None
    eval_model: Optional[torch.nn.Module] = None  # compiled model when --compile

    def batches(self, unit: Unit) -> Iterator[Tuple[torch.Tensor, torch.Tensor, List[str]]]:
        """(x, y, sample_ids) batches of the unit's samples, on the device."""
        idx = self.indices[unit.start:unit.stop]
        loader = DataLoader(
            Subset(self.dataset, idx), batch_size=self.spec.batch_size, shuffle=False,
            num_workers=self.spec.num_workers, pin_memory=self.device.type == "cuda",
            persistent_workers=False,
        )
        pos = unit.start
        for x, y in loader:
            n = len(y)
            sids = [self.dataset.sample_ids[i] for i in self.indices[pos:pos + n]]
            pos += n
            yield x.to(self.device, non_blocking=True).float(), y.to(self.device, non_blocking=True).long(), sids

    def generator(self, unit: Unit) -> torch.Generator:
        seed = (int(unit.key[:15], 16) + self.spec.seed) % (2 ** 63)
        return torch.Generator(device=self.device).manual_seed(seed)

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.update(n)


def _git_commit() -> Optional[str]:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def _versions() -> Dict[str, str]:
    import numpy
    import timm

    v = {"robustbench_pid": __version__, "torch": torch.__version__, "timm": timm.__version__,
         "numpy": numpy.__version__, "pandas": pd.__version__, "python": platform.python_version()}
    for mod in ("torchattacks", "pyautoattack", "sklearn"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return v


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def default_out(spec: RunSpec) -> Path:
    names = sorted({a.attack for a in spec.attacks})
    what = (Path(spec.suite).stem if spec.suite else
            "-".join(names) if names and spec.benchmark == "adversarial" else spec.benchmark)
    tag = _hash({k: v for k, v in spec.as_dict().items() if k not in ("out", "quiet", "num_workers", "shard")})[:8]
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
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write to output folder {out}: {exc.strerror or exc}. "
                        f"Choose another with --out DIR") from None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def unit_done(units_dir: Path, key: str) -> bool:
    return (units_dir / f"{key}.parquet").is_file() and (units_dir / f"{key}.json").is_file()


def shard_of(spec: RunSpec) -> Tuple[int, int]:
    """(index, count) from --shard, torchrun (RANK/WORLD_SIZE) or a Slurm array; (0, 1) otherwise."""
    if spec.shard:
        try:
            i, n = (int(t) for t in spec.shard.split("/"))
        except ValueError:
            raise UserError(f"--shard must look like i/n (e.g. 0/4), got {spec.shard!r}") from None
        if not (n >= 1 and 0 <= i < n):
            raise UserError(f"--shard {spec.shard}: need 0 <= i < n")
        return i, n
    env = os.environ
    if "WORLD_SIZE" in env and "RANK" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        lo = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        return int(env["SLURM_ARRAY_TASK_ID"]) - lo, int(env["SLURM_ARRAY_TASK_COUNT"])
    return 0, 1


def prepare(spec: RunSpec) -> Context:
    """Validate the spec, load model and data (everything that can fail fast fails here)."""
    if spec.protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {spec.protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if spec.batch_size < 1 or spec.chunk_size < 1:
        raise UserError("--batch-size and --chunk-size must be >= 1")
    if spec.limit is not None and spec.limit < 1:
        raise UserError(f"--limit must be >= 1, got {spec.limit}")
    get_benchmark(spec.benchmark)  # unknown benchmark -> clear error
    info = dataset_info(spec.dataset)
    device = pick_device(spec.device)
    if spec.device == "auto" and device.type == "cuda" and "LOCAL_RANK" in os.environ:
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
    model = load_model(spec.model, spec.checkpoint, spec.dataset, allow_pickle=spec.allow_pickle,
                       strict=spec.strict, **spec.arch_kwargs).to(device)
    ds_opts: Dict[str, Any] = dict(spec.benchmark_options.get("dataset", {}))
    if spec.subset is not None:
        ds_opts.update(subset=spec.subset, subset_seed=spec.seed)
    if spec.skip_unreadable:
        ds_opts["skip_unreadable"] = True
    ds = load_dataset(spec.dataset, spec.split, spec.data_root, model_info=model.info, **ds_opts)
    n = len(ds) if spec.limit is None else min(spec.limit, len(ds))
    if n == 0:
        raise UserError(f"dataset {spec.dataset!r} ({spec.split}) is empty")
    ids = {
        "model": spec.model, "arch": model.info["arch"], "checkpoint_sha256": model.info.get("checkpoint_sha256"),
        "dataset": spec.dataset, "split": spec.split, "protocol": spec.protocol,
    }
    ctx = Context(spec, model, ds, list(range(n)), device, ids)
    if spec.compile:
        ctx.eval_model = torch.compile(model)
    assert info.num_classes == model.info["num_classes"]
    return ctx


def unit_key(ctx: Context, u: Unit) -> str:
    m = ctx.model.info
    return _hash({
        "v": 1, "benchmark": u.benchmark, "attack": u.attack, "eps": u.eps, "params": u.params,
        "condition": u.condition, "samples": ctx.dataset.sample_ids[ctx.indices[u.start]] if u.stop > u.start else None,
        "start": u.start, "stop": u.stop, "n_total": len(ctx.indices),
        "arch": m["arch"], "arch_kwargs": m["arch_kwargs"], "checkpoint_sha256": m.get("checkpoint_sha256"),
        "dataset": ctx.spec.dataset, "split": ctx.spec.split, "protocol": ctx.spec.protocol,
        "seed": ctx.spec.seed, "batch_size": ctx.spec.batch_size, "precision": ctx.spec.precision,
        "bench_opts": ctx.spec.benchmark_options,
    })


def plan_units(ctx: Context) -> List[Unit]:
    units = get_benchmark(ctx.spec.benchmark).plan(ctx)
    return [replace(u, key=unit_key(ctx, u)) for u in units]


def chunks(n: int, size: int) -> List[Tuple[int, int]]:
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def run(spec: RunSpec) -> Path:
    """Evaluate ``spec``; returns the run folder (complete, or raises)."""
    t0 = time.time()
    out = Path(spec.out) if spec.out else default_out(spec)
    check_writable(out)
    ctx = prepare(spec)
    make_out_dir(out)
    units = plan_units(ctx)
    units_dir = out / "units"
    units_dir.mkdir(exist_ok=True)
    run_id = out.name
    ctx.ids["run_id"] = run_id
    shard_i, shard_n = shard_of(spec)
    mine = [u for j, u in enumerate(units) if j % shard_n == shard_i]
    # A previous summary must not survive into a run that may die before writing a new one.
    if shard_n == 1:
        for stale in ("summary.csv", "records.parquet"):
            (out / stale).unlink(missing_ok=True)
    provenance = _provenance(ctx, spec, out, units)
    if shard_n == 1 or shard_i == 0:
        _write_json(out / "run.json", {**provenance, "status": "running"})
    todo = [u for u in mine if not unit_done(units_dir, u.key)]
    from tqdm.auto import tqdm

    total = sum(u.stop - u.start for u in todo)
    bench = get_benchmark(spec.benchmark)
    with tqdm(total=total, unit="img", disable=spec.quiet, desc=f"{spec.model} {spec.benchmark}",
              dynamic_ncols=True) as bar:
        ctx.progress = bar
        for u in todo:
            if unit_done(units_dir, u.key):  # another process finished it meanwhile
                bar.update(u.stop - u.start)
                continue
            bar.set_postfix_str(f"{u.attack} eps={u.eps:.4g} {u.condition} [{u.start}:{u.stop}]")
            tu = time.time()
            recs = bench.run_unit(ctx, u)
            recs = _stamp(recs, ctx, u)
            write_parquet_atomic(recs, units_dir / f"{u.key}.parquet")
            atomic_write_bytes(units_dir / f"{u.key}.json", json.dumps(
                {"key": u.key, "benchmark": u.benchmark, "attack": u.attack, "eps": u.eps, "params": u.params,
                 "condition": u.condition, "start": u.start, "stop": u.stop, "n": len(recs),
                 "seconds": round(time.time() - tu, 3), "device": str(ctx.device)}).encode())
    missing = [u for u in units if not unit_done(units_dir, u.key)]
    if missing:
        if shard_n > 1:
            return out  # other shards still running; `robustbench-pid merge` assembles the run
        raise RuntimeError(f"{len(missing)} work units are missing after the run")
    finalize(out, units, provenance, wall=time.time() - t0)
    return out


def finalize(out: Path, units: List[Unit], provenance: Dict[str, Any], wall: float) -> pd.DataFrame:
    units_dir = out / "units"
    frames = [pd.read_parquet(units_dir / f"{u.key}.parquet") for u in units]
    records = pd.concat(frames, ignore_index=True)
    write_parquet_atomic(records, out / "records.parquet")
    summary = summarize(records)
    tmp = out / ".summary.csv.tmp"
    summary.to_csv(tmp, index=False)
    _write_json(out / "run.json", {**provenance, "status": "complete", "wall_seconds": round(wall, 2),
                                   "n_records": len(records), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    os.replace(tmp, out / "summary.csv")
    return summary


def _stamp(recs: pd.DataFrame, ctx: Context, u: Unit) -> pd.DataFrame:
    front = {k: ctx.ids[k] for k in RECORD_ID_COLS}
    front.update({"benchmark": u.benchmark, "attack": u.attack, "eps": float(u.eps), "params": u.params,
                  "condition": u.condition, "unit": u.key})
    for k, v in reversed(list(front.items())):
        recs.insert(0, k, v)
    return recs


def _provenance(ctx: Context, spec: RunSpec, out: Path, units: List[Unit]) -> Dict[str, Any]:
    m = ctx.model.info
    return {
        "run_id": out.name, "spec": spec.as_dict(), "model": spec.model, "arch": m["arch"],
        "arch_kwargs": m["arch_kwargs"], "checkpoint": m.get("checkpoint"),
        "checkpoint_sha256": m.get("checkpoint_sha256"), "checkpoint_strict": m.get("strict", True),
        "checkpoint_load_problems": m.get("load_problems", []), "model_config": {
            k: m[k] for k in ("mean", "std", "input_size", "interpolation", "crop_pct", "num_classes")},
        "dataset": spec.dataset, "split": spec.split, "data_root": spec.data_root,
        "dataset_provenance": getattr(ctx.dataset, "provenance", {}), "n_samples": len(ctx.indices),
        "limit": spec.limit, "protocol": spec.protocol, "benchmark": spec.benchmark,
        "attacks": [{"attack": a.attack, **a.params} for a in spec.attacks], "suite": spec.suite,
        "seed": spec.seed, "device": str(ctx.device),
        "device_name": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else platform.processor() or platform.machine(),
        "precision": spec.precision, "compile": spec.compile, "batch_size": spec.batch_size,
        "n_units": len(units), "versions": _versions(), "git_commit": _git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _write_json(path: Path, obj: Dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())

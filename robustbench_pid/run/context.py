"""A run's context (spec, model, data, device, batches) and what makes a unit's records reproducible.

``prepare`` validates the spec and loads model and data, so everything that can fail fast fails
before any work. Randomness is seeded per unit from what the unit does (:func:`unit_seed`): a
generator handed to the attack, plus the global torch/numpy/random RNGs forked, seeded and
restored around the unit (:func:`unit_rng`), because libraries such as AutoAttack reseed or draw
from the global RNG. So which process computes a unit, and in which order, does not change its
records.
"""
from __future__ import annotations

import contextlib
import random
from functools import partial
from itertools import count
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..benchmarks import Batch, check_options, get_benchmark
from ..data import dataset_info, load_dataset
from ..data.batch_decode import BatchDecoder, EncodedFiles, check_decode, collate_encoded
from ..runtime.device import check_precision, find_batch_size, pick_device, wants_channels_last
from ..errors import UserError, without_worker_traceback
from ..runtime.launcher import launch
from ..models import load_model
from ..results.files.units import content_hash
from .read_ahead import read_ahead
from ..specs import PROTOCOLS, RunSpec, Unit


class _BatchPlan:
    """A batch sampler whose batches are set before each pass, so one DataLoader (and its
    persistent workers) serves the whole run instead of starting workers per unit."""

    def __init__(self) -> None:
        self.batches: List[Sequence[int]] = []  # ranges of dataset indices (no int object per sample held)

    def __iter__(self) -> Iterator[List[int]]:
        return (list(b) for b in list(self.batches))  # each a list, as torch's BatchSampler yields them

    def __len__(self) -> int:
        return len(self.batches)


Span = Tuple[int, int]  # sample positions [start, stop) within the evaluated set


@dataclass
class Context:
    spec: RunSpec
    model: torch.nn.Module
    dataset: Any
    indices: Sequence[int]  # dataset positions evaluated: a range (a benchmark may narrow it to a list)
    device: torch.device
    ids: Dict[str, Any]
    progress: Any = None
    # the bar counts image-passes (runner.unit_weight): a unit's images advance it by this weight each, up to
    # unit_end, so its ETA is priced from the work left rather than from how fast the cheap clean pass went
    weight: float = 1.0
    unit_end: Optional[float] = None
    eval_model: Optional[torch.nn.Module] = None  # compiled model when --compile (clean/verdict passes)
    attack_model: Optional[torch.nn.Module] = None  # compiled model for attacks when --compile
    attack_net: Optional[torch.nn.Module] = None  # compiled ``model.net`` (paper protocol) when --compile
    batch_size: int = 0
    channels_last: bool = False
    decoder: Any = None  # --decode gpu: data/batch_decode.BatchDecoder (the loader then yields file bytes)
    _plan: _BatchPlan = field(default_factory=_BatchPlan, repr=False)
    _loader: Optional[DataLoader] = field(default=None, repr=False)
    _held: Dict[Span, List[Batch]] = field(default_factory=dict, repr=False)  # the chunk on the device
    _streaming: bool = field(default=False, repr=False)
    # unit key -> {name: frame}: a unit's extra files (e.g. ``attention``), written beside its records
    sidecars: Dict[str, Dict[str, Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.batch_size:
            self.batch_size = self.spec.batch_size

    def loader(self) -> DataLoader:
        if self._loader is None:
            w = self.spec.num_workers
            encoded = self.decoder is not None
            self._loader = DataLoader(
                EncodedFiles(self.dataset) if encoded else self.dataset, batch_sampler=self._plan, num_workers=w,
                pin_memory=self.device.type == "cuda", persistent_workers=w > 0,
                prefetch_factor=4 if w > 0 else None, **({"collate_fn": collate_encoded} if encoded else {}),
            )
        return self._loader

    def batches(self, unit: Unit) -> Iterator[Batch]:
        """(x, y, sample_ids) batches of the unit's samples, on the device: the held chunk's
        (:meth:`chunks`: decoded once for all its units) or, outside a run, decoded for this call."""
        held = self._held.get((unit.start, unit.stop))
        if held is not None:
            return iter(held)
        if self._streaming:  # the loader is mid-pass over the run's chunks: a new pass would reset it
            raise RuntimeError(f"unit {unit.key[:12]} asked for samples [{unit.start}:{unit.stop}] outside the "
                               f"chunk on the device")
        return (b for _, got in self._decode([(unit.start, unit.stop)]) for b in got)

    def chunks(self, spans: Sequence[Span]) -> Iterator[Tuple[Span, "HeldChunk"]]:
        """Each span's batches on the device, span after span (one loader pass over all spans:
        no drain and restart between them). While a span is yielded it is held: :meth:`batches`
        serves it to every unit of that span, its first unit reading it from the loader as it
        computes, the others from the device.

        With --workers a thread drains the pass up to one span ahead (:mod:`read_ahead`), so the
        workers decode the next span while this one is computed. Without workers a span is read
        whole before its units run: the dataset then runs in this process, and a transform drawing
        from the global RNG inside a unit's RNG scope would make that unit's records depend on
        whether it was the first of its span (the workers' RNGs are their own)."""
        self._streaming = True
        decoded = self._decode(spans)
        try:
            for span, got in decoded:
                self._held = {span: got}
                yield span, got
                self._held = {}
        finally:
            decoded.close()  # joins the reading thread now, not whenever the generator is collected
            self._held, self._streaming = {}, False

    def _decode(self, spans: Sequence[Span]) -> Iterator[Tuple[Span, "HeldChunk"]]:
        """One loader pass over the spans' samples; host->device copies are asynchronous from
        pinned memory."""
        bs = self.batch_size
        per_span = []
        plan: List[Sequence[int]] = []
        for s, e in spans:
            idx = self.indices[s:e]
            batches = [idx[i:i + bs] for i in range(0, len(idx), bs)]
            per_span.append(len(batches))
            plan += batches
        self._plan.batches = plan
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        # iter() on this thread: starting a pass draws the loader's base seed from the global RNG
        loaded = without_worker_traceback(iter(self.loader()))  # a bad image in a worker: one-line error
        # map, not a generator or zip: those keep the batch they last produced until asked for the next one, so a
        # chunk's last batch would stay alive (on the device) while the next chunk is read
        from .input_checks import check_batch

        check = partial(check_batch, self.dataset, self.spec.dataset)
        host: Iterator[HostBatch] = map(check, count(1), plan, loaded)
        workers = self.spec.num_workers > 0
        if workers:
            host = read_ahead(host, depth=max(per_span, default=1), name="chunk-reader")
        on_device = map(partial(self._to_device, fmt), host)
        try:
            for span, n_batches in zip(spans, per_span):
                chunk = HeldChunk(span, n_batches, on_device)
                if not workers:
                    chunk.fill()
                yield span, chunk
                chunk.fill()  # batches no unit asked for: the pass moves on to the next span
                chunk.release()  # its batches go before the next span is read, whoever still holds the chunk
        finally:
            if isinstance(host, read_ahead):
                host.close()  # stops and joins the reading thread before the loader can be reused

    def _to_device(self, fmt: torch.memory_format, batch: HostBatch) -> Batch:
        idx, x, y = batch
        return Batch(self._images(x).contiguous(memory_format=fmt), y.to(self.device, non_blocking=True).long(),
                     [self.dataset.sample_ids[i] for i in idx], {})

    def _images(self, x: Any) -> torch.Tensor:
        """A host batch as float images on the device: copied, or (--decode gpu) decoded there from file bytes."""
        if self.decoder is not None:
            return self.decoder(x)
        return x.to(self.device, non_blocking=True).float()

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
            step = n * self.weight
            if self.unit_end is not None:
                step = max(0.0, min(step, self.unit_end - self.progress.n))
            self.progress.update(step)

    def spend(self, work: float) -> None:
        """Advance the bar by ``work`` forward-pass equivalents a unit actually spent (a ladder rung's batch), never
        past the unit's end: a unit whose work is decided as it runs (``--converge``) moves the bar as it goes."""
        if self.progress is None or work <= 0:
            return
        step = float(work)
        if self.unit_end is not None:
            step = max(0.0, min(step, self.unit_end - self.progress.n))
        self.progress.update(step)

    def reserve(self, work: float) -> None:
        """Make room for ``work`` more forward-pass equivalents in the running unit (a ladder round decided at run
        time): where less than that is left of the unit, its end and the bar's total grow by the difference, so the
        bar never sits at its end while work it did not plan for goes on."""
        bar = self.progress
        if bar is None or self.unit_end is None or work <= 0:
            return
        short = bar.n + float(work) - self.unit_end
        if short > 0:
            self.unit_end += short
            bar.total = (bar.total or 0) + short
            bar.refresh()

    def note(self, text: str) -> None:
        """What the unit is doing now, on the progress bar's line (a long phase inside one unit, such as a ladder
        rung, would otherwise sit silent behind a bar that no longer moves)."""
        bar = self.progress
        if bar is None or not hasattr(bar, "set_postfix_str"):
            return
        import time

        bar.set_postfix_str(text, refresh=False)
        now = time.time()  # redrawn at the bar's own pace (every 0.1 s on a terminal, 30 s in a log file)
        if now - getattr(self, "_noted", 0.0) >= float(getattr(bar, "mininterval", 0.1) or 0.1):
            self._noted = now
            bar.refresh()


HostBatch = Tuple[Sequence[int], torch.Tensor, torch.Tensor]  # (dataset indices, images, labels) in host memory


class HeldChunk:
    """A span's batches on the device: read from the pass the first time they are iterated (so
    the first unit computes while the rest of the span is still arriving), kept for the span's
    other units."""

    def __init__(self, span: Span, n_batches: int, source: Iterator[Batch]) -> None:
        self.span, self.n_batches, self._source = span, n_batches, source
        self._got: List[Batch] = []
        self._released = False

    def __iter__(self) -> Iterator[Batch]:
        if self._released:
            raise RuntimeError(f"the batches of [{self.span[0]}:{self.span[1]}] were released: the pass has moved on")
        for i in range(self.n_batches):
            if i == len(self._got):
                b = next(self._source, None)
                if b is None:
                    s, e = self.span
                    raise RuntimeError(f"data loader returned {len(self._got)} of {self.n_batches} batches of [{s}:{e}]")
                self._got.append(b)
            yield self._got[i]

    def fill(self) -> None:
        for _ in self:
            pass

    def release(self) -> None:
        """Drop the batches (on the device: a whole chunk) once every unit of the span has run."""
        self._got, self._released = [], True


def unit_seed(unit: Unit, seed: int) -> int:
    """The seed of a unit's generator and global RNGs: a hash of what the unit does (benchmark,
    attack, its settings, condition, sample range) and the run's ``--seed``.

    Not of the model: two models evaluated with one command draw the same random starts on the
    same samples (common random numbers, which make their paired comparison sharper), and
    ``rbp.attack(..., seed=s)`` on the first n samples draws exactly what a run's first unit does.
    """
    h = content_hash({"benchmark": unit.benchmark, "attack": unit.attack, "eps": float(unit.eps), "params": unit.params,
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


def check_arguments(spec: RunSpec, data: Any = None) -> torch.device:
    """The spec's arguments, checked without loading anything or writing anything (``reproduce`` checks
    every row this way before it writes its folder); the device they run on."""
    if spec.protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {spec.protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if spec.batch_size < 0 or spec.chunk_size < 1:
        raise UserError("--batch-size must be >= 1 (or 0: find automatically on GPU) and --chunk-size >= 1")
    if spec.num_workers < 0:
        raise UserError(f"--workers must be >= 0, got {spec.num_workers}")
    if spec.limit is not None and spec.limit < 1:
        raise UserError(f"--limit must be >= 1, got {spec.limit}")
    if spec.subset is not None and spec.subset < 1:
        raise UserError(f"--subset must be >= 1 (reproduce's --limit on ImageNet-C/-O rows is a subset), "
                        f"got {spec.subset}")
    launch(spec.shard)  # malformed --shard / environment -> clear error before loading anything
    get_benchmark(spec.benchmark)  # unknown benchmark -> clear error
    check_options(spec.benchmark, spec.benchmark_options)  # unknown --bench-opt key -> clear error
    if data is None:
        dataset_info(spec.dataset)  # unknown dataset -> clear error
    device = pick_device(spec.device)
    check_precision(device, spec.precision)
    check_decode(getattr(spec, "decode", "cpu"), spec.dataset if data is None else None, spec.benchmark,
                 device.type, data_object=data is not None)
    if spec.batch_size == 0 and device.type != "cuda":
        raise UserError("--batch-size 0 (find automatically) needs a GPU; on CPU give a number, e.g. --batch-size 64")
    return device


def prepare(spec: RunSpec, model: Optional[torch.nn.Module] = None, data: Any = None) -> Context:
    """Validate the spec, load model and data (everything that can fail fast fails here).

    ``model``/``data``: objects already made the runner's own (``objects.wrap_model`` /
    ``objects.as_data``: copies, never the caller's) used instead of the spec's names.
    """
    device = check_arguments(spec, data)
    info = dataset_info(spec.dataset) if data is None else None
    if model is None and spec.dry_run:  # a plan needs no weights (plan_data)
        from .plan_data import plan_model

        model = plan_model(spec)
    elif model is None:
        model = load_model(spec.model, spec.checkpoint, spec.dataset, allow_pickle=spec.allow_pickle,
                           strict=spec.strict, checkpoint_dir=spec.checkpoint_dir, **spec.arch_kwargs)
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
        minfo = {k: v for k, v in model.info.items() if v is not None}
        if spec.dry_run:  # a plan needs no data: a dataset not here is priced at its published size (plan_data)
            from .plan_data import plan_dataset

            ds = plan_dataset(spec, ds_opts, minfo)
        else:
            ds = load_dataset(spec.dataset, spec.split, spec.data_root, **ds_opts, model_info=minfo)
    else:
        ds = data
    from .objects import complete_info, is_object

    if is_object(model) or data is not None:  # a caller's module or data: one probe on two samples (input_checks)
        complete_info(model, ds[0][0], device, need_grad=_gradient_attacks(spec), second=ds[min(1, len(ds) - 1)][0])
    elif model.info.get("num_classes") is None or model.info.get("input_size") is None:
        complete_info(model, ds[0][0], device)
    n = len(ds) if spec.limit is None else min(spec.limit, len(ds))
    if n == 0:
        raise UserError(f"dataset {spec.dataset!r} ({spec.split}) is empty")
    ids = {
        "model": spec.model, "arch": model.info["arch"], "checkpoint_sha256": model.info.get("checkpoint_sha256"),
        "checkpoint_name": model.info.get("checkpoint_name") or "",
        "checkpoint_published_hash": model.info.get("checkpoint_published_hash") or "",
        "dataset": spec.dataset, "split": spec.split, "protocol": spec.protocol,
    }
    batch_size = spec.batch_size
    if batch_size == 0:
        batch_size = find_batch_size(model, tuple(model.info["input_size"]), device, spec.precision)
    ctx = Context(spec, model, ds, range(n), device, ids, batch_size=batch_size, channels_last=channels_last)
    if getattr(spec, "decode", "cpu") == "gpu" and hasattr(ds, "encoded"):  # a dry run without data reads no files
        ctx.decoder = BatchDecoder({k: v for k, v in model.info.items() if v is not None}, device)
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
                        f"labels must be class indices 0..{classes - 1}: give labels for this model's classes, or "
                        f"a model with a matching head")
    return ctx


def _gradient_attacks(spec: RunSpec) -> bool:
    """Does the run differentiate the model (so a model object must keep a gradient path)?"""
    from ..attacks import get_attack

    return spec.benchmark == "adversarial" and any(get_attack(a.attack).uses_gradients for a in spec.attacks)

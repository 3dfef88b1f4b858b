"""Device selection, mixed precision, memory format and automatic batch size.

Precision trade-off. On CUDA, ``precision="bf16"`` (or ``"fp16"``) runs the *attack's*
forward/backward passes under autocast: matmuls and fused attention run in half precision,
about 1.5-2x the throughput of fp32 on Ampere/Hopper. The verdicts (the clean and adversarial
predictions that are scored) are always computed in fp32 outside autocast, so a half-precision
attack can only be *weaker* (noisier gradients: bf16 keeps 8 bits of mantissa, so loss
differences below ~0.4% vanish and the sign of small gradient components flips), never score
a sample wrongly. fp32 is the reference and the default; use bf16 for planning sweeps and
fp32 for the numbers you publish. fp16 needs no loss scaling here because we differentiate
w.r.t. the input of a single summed loss, but it can overflow on large logits: prefer bf16.

torchrun: ``LOCAL_RANK`` picks ``cuda:LOCAL_RANK`` (one process per GPU; no DataParallel, whose
scatter/gather would serialise the attack's many small forward/backward passes).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch

from ..errors import UserError
from ..specs import PRECISIONS


def pick_device(name: str = "auto") -> torch.device:
    """``auto`` -> ``cuda:LOCAL_RANK`` under torchrun, else ``cuda`` if available, else ``cpu``."""
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return _local_cuda(None)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):  # mps, meta, xpu...: the runner is built for CPU and CUDA
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        return _local_cuda(dev.index)
    return dev


def _local_cuda(index: Optional[int]) -> torch.device:
    """The GPU of this process: the explicit index, else the launcher's (``launcher.local_gpu``),
    else the current one."""
    count = torch.cuda.device_count()
    if index is None:
        from .launcher import local_gpu  # the launcher reads its environment once per process

        index = local_gpu(count)
    if index is None:
        index = torch.cuda.current_device()
    if not 0 <= index < count:
        raise UserError(f"GPU {index} requested (LOCAL_RANK or --device) but this machine has {count}; "
                        f"start at most {count} processes per node (torchrun --nproc_per_node {count})")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def check_precision(device: torch.device, precision: str) -> None:
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; use fp32, bf16 or fp16")
    if precision == "fp16" and device.type != "cuda":
        raise UserError("--precision fp16 needs a CUDA device (CPU autocast has no fast fp16 path); "
                        "on CPU use bf16 or fp32")
    if precision != "fp32" and device.type not in ("cuda", "cpu"):
        raise UserError(f"--precision {precision} runs on CUDA or CPU, not on {device.type}; use fp32")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--precision bf16: this GPU has no bf16 support; use fp16 or fp32")


@contextlib.contextmanager
def attack_precision(device: torch.device, precision: str) -> Iterator[None]:
    """Autocast for the attack's passes (the caller scores verdicts outside this context, in fp32)."""
    if precision == "fp32":
        yield
        return
    check_precision(device, precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    # CPU autocast (bf16) runs the same code path as CUDA's, so CI exercises it on every machine
    # no weight cache: the parameters never require grad here, and the cache would keep the first
    # half-precision copy of an input leaf that requires grad (CW's paper-protocol Adam variable, each step's
    # input) for the whole context: a leaf changed in place would not be seen again, and memory would grow
    with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
        yield


def wants_channels_last(model: torch.nn.Module, device: torch.device) -> bool:
    """channels_last helps convolution-heavy models on CUDA (tensor-core conv kernels take NHWC).

    A ViT has one convolution (the patch embedding) and gains nothing measurable; on CPU the
    oneDNN kernels choose their own layout. So: CUDA and more than one Conv2d.
    """
    if device.type != "cuda":
        return False
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) > 1


def find_batch_size(model: torch.nn.Module, sample_shape: Sequence[int], device: torch.device,
                    precision: str = "fp32", start: int = 16, limit: int = 1024, headroom: float = 0.8) -> int:
    """Largest power-of-two batch whose forward+backward to the input fits in GPU memory.

    Why forward+backward: attacks are the memory peak (activations kept for the input gradient),
    so a batch that fits an attack step fits a clean pass. ``headroom`` leaves room for the
    allocator's fragmentation and the attack's own tensors. CUDA only.
    """
    if device.type != "cuda":
        raise UserError("--batch-size 0 (find automatically) needs a GPU; on CPU give a number, e.g. --batch-size 64")
    best = 0
    bs = start
    num_classes = int(getattr(model, "num_classes", 2) or 2)
    while bs <= limit:
        try:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            x = torch.rand((bs, *sample_shape), device=device, requires_grad=True)
            y = torch.zeros(bs, dtype=torch.long, device=device) % num_classes
            with attack_precision(device, precision):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            torch.autograd.grad(loss, x)
            peak = torch.cuda.max_memory_allocated(device)
            total = torch.cuda.get_device_properties(device).total_memory
            best = bs
            del x, y, loss
            if peak * 2 > total * headroom:  # the next doubling would not fit
                break
            bs *= 2
        except torch.cuda.OutOfMemoryError:
            break
    torch.cuda.empty_cache()
    if best == 0:
        raise UserError(f"even a batch of {start} does not fit on {device}; give a smaller --batch-size")
    return best

"""Doctor's environment rows: versions, the device, bf16, ``torch.compile``, cores and workers."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any, Dict

import torch

from .base import Outcome, Settings


def versions(s: Settings, state: Dict[str, Any]) -> Outcome:
    import platform

    import numpy
    import timm
    import torchvision

    from ..core.version import __version__

    v = {"robustbench_pid": __version__, "python": platform.python_version(), "torch": torch.__version__,
         "timm": timm.__version__, "torchvision": torchvision.__version__, "numpy": numpy.__version__,
         "cuda_build": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
         "driver": _driver()}
    state.setdefault("environment", {})["versions"] = v
    cuda = f"CUDA build {v['cuda_build'] or 'none'}, driver {v['driver'] or '-'}"
    return "PASS", (f"robustbench_pid {v['robustbench_pid']}, torch {v['torch']}, timm {v['timm']}, "
                    f"torchvision {v['torchvision']}, python {v['python']}; {cuda}"), v


def _driver() -> Any:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def device(s: Settings, state: Dict[str, Any]) -> Outcome:
    from ..run.speed import cpu_model, host_memory_bytes

    d = s.device
    if d.type == "cuda":
        p = torch.cuda.get_device_properties(d)
        info = {"type": "cuda", "name": p.name, "memory_gib": round(p.total_memory / 2 ** 30, 1),
                "capability": f"{p.major}.{p.minor}", "count": torch.cuda.device_count()}
        line = f"{d}: {p.name}, {info['memory_gib']} GiB, compute capability {info['capability']}"
    else:
        info = {"type": d.type, "name": cpu_model(), "memory_gib": round(host_memory_bytes() / 2 ** 30, 1),
                "cuda_visible": torch.cuda.is_available()}
        line = f"{d}: {info['name']}, {info['memory_gib']} GiB available" + \
               ("" if torch.cuda.is_available() else "; no CUDA device visible")
    state.setdefault("environment", {})["device"] = info
    return "PASS", line, info


def bf16(s: Settings, state: Dict[str, Any]) -> Outcome:
    """bf16 autocast runs here and its matmul is within bf16's precision of fp32; on CPU, whether the
    hardware has native bf16 (without it autocast emulates it and is slower than fp32)."""
    from ..runtime.device import attack_precision

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(64, 64, generator=g).to(s.device) for _ in range(2))
    with attack_precision(s.device, "bf16"):
        c = a @ b
    err = float(((c.float() - a @ b).abs().max() / (a @ b).abs().max()).item())
    data: Dict[str, Any] = {"autocast_dtype": str(c.dtype), "rel_err": err}
    if c.dtype != torch.bfloat16 or err > 2e-2:
        return "FAIL", f"bf16 autocast gave {c.dtype}, relative error {err:.1e} (bf16: < 2e-2); use fp32", data
    if s.device.type == "cuda":
        native = bool(torch.cuda.is_bf16_supported())
    else:
        native = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    data["native"] = native
    state.setdefault("environment", {})["bf16"] = data
    if not native:
        return "WARN", (f"bf16 autocast works (matmul rel. error {err:.1e}) but the hardware has no native bf16: "
                        f"emulated, expect it slower than fp32 (see the speed rows)"), data
    return "PASS", f"bf16 autocast works, native support (matmul rel. error {err:.1e}); --precision bf16 is open", data


def compile_works(s: Settings, state: Dict[str, Any]) -> Outcome:
    """A tiny ``torch.compile`` (inductor, the backend ``--compile`` uses) in a thread, against eager;
    WARN when it has not finished within ``compile_timeout_s`` (a slow compiler, not a broken one)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(s.device).eval()
    x = torch.randn(4, 16, device=s.device)
    box: Dict[str, Any] = {}

    def work() -> None:
        try:
            with torch.inference_mode():
                box["out"] = torch.compile(m)(x)
        except Exception as exc:  # noqa: BLE001 - reported as the row's FAIL
            box["error"] = exc

    t = time.perf_counter()
    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(s.compile_timeout_s)
    sec = time.perf_counter() - t
    data: Dict[str, Any] = {"seconds": round(sec, 2)}
    state.setdefault("environment", {})["compile"] = data
    if th.is_alive():
        data["works"] = None
        return "WARN", f"a tiny torch.compile had not finished after {s.compile_timeout_s:.0f} s: --compile would " \
                       f"spend minutes compiling here", data
    if "error" in box:
        data["works"] = False
        err = str(box["error"]).strip().splitlines()
        return "FAIL", (f"torch.compile fails here ({type(box['error']).__name__}: {err[0] if err else ''}); "
                        f"run without --compile"), data
    with torch.inference_mode():
        diff = float((box["out"] - m(x)).abs().max().item())
    data.update(works=diff < 1e-3, max_abs_diff=diff)
    if diff >= 1e-3:
        return "FAIL", f"torch.compile output differs from eager by {diff:.1e} (tolerance 1e-3); run without --compile", data
    return "PASS", f"torch.compile (inductor) works: a tiny model compiled in {sec:.1f} s, max |diff| to eager {diff:.1e}", data


def cores(s: Settings, state: Dict[str, Any]) -> Outcome:
    from ..data.generators.jpeg_tree import sensible_workers

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = torch.get_num_threads()
    workers = sensible_workers(n)
    data = {"cpu_count": os.cpu_count(), "usable_cores": n, "torch_threads": threads,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "suggested_workers": workers}
    state.setdefault("environment", {})["cpu"] = data
    line = (f"{n} usable cores ({os.cpu_count()} in the machine), torch threads {threads}, OMP_NUM_THREADS="
            f"{data['omp_num_threads'] or '(unset)'}; --workers {workers} makes sense here"
            + (" (decoding in the main process: <= 2 cores)" if workers == 0 else ""))
    if threads > n:
        return "WARN", line + f"; {threads} threads on {n} cores oversubscribe: set OMP_NUM_THREADS={n}", data
    return "PASS", line, data


CHECKS = [("environment", "versions", versions), ("environment", "device", device), ("environment", "bf16", bf16),
          ("environment", "torch.compile", compile_works), ("environment", "cores & workers", cores)]

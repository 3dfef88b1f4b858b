"""Doctor's speed rows, random-init DeiT-tiny and PID DeiT-tiny at 224 px side by side, every figure
from ``robustbench_pid.run.speed`` / ``robustbench_pid.data.generators.jpeg_tree`` (the benchmark scripts' own code).

Speed rows WARN (never FAIL: a slow machine still runs the harness right) where a setting does not
pay here (bf16 or compile slower than fp32 eager, PGD above 1.05 bare passes, PID above 1.10x
softmax, decoding slower than the model); the largest batch FAILs when not even one sample fits.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from .base import Outcome, Settings
from ..run import speed

MODELS = {"DeiT-tiny": "deit_tiny_patch16_224", "PID DeiT-tiny": "pid_deit_tiny_patch16_224"}
PID = "PID DeiT-tiny"


def _models(s: Settings, state: Dict[str, Any]) -> Dict[str, torch.nn.Module]:
    if "models" not in state:
        m = {k: speed.random_model(arch, s.device) for k, arch in MODELS.items()}
        m[PID].load_state_dict(m["DeiT-tiny"].state_dict())  # same weights: only the attention differs
        state["models"] = m
    return state["models"]


def _batch(s: Settings, state: Dict[str, Any]) -> Any:
    bs = s.speed_batch
    fit = state.get("speed", {}).get("largest_batch", {}).get("batch")
    if fit:
        bs = min(bs, fit)
    if state.get("xy") is None or len(state["xy"][0]) != bs:
        state["xy"] = speed.random_batch(bs, s.device)
    return state["xy"]


def largest(s: Settings, state: Dict[str, Any]) -> Outcome:
    r = speed.largest_batch(_models(s, state)[PID], s.device, "fp32", memory_bytes=s.memory_bytes)
    state.setdefault("speed", {})["largest_batch"] = r
    if r["batch"] == 0:
        return "FAIL", f"PID DeiT-tiny 224 px: not even a batch of 1 fits a forward+backward ({r['how']})", r
    return "PASS", f"PID DeiT-tiny 224 px, fp32 forward+backward: batch {r['batch']} fits ({r['how']})", r


def _rates(s: Settings, state: Dict[str, Any], key: str, precision: str, compiled: bool = False) -> Outcome:
    models = _models(s, state)
    if compiled:
        # Normalized.forward is one code object for every wrapped model: without a reset, the models
        # compiled before (the smoke rows') use up dynamo's recompile limit and it falls back to eager
        torch._dynamo.reset()
        models = {k: torch.compile(m) for k, m in models.items()}
    x, y = _batch(s, state)
    r = speed.pass_rates(models, x, y, precision, reps=s.reps, warmup=1)
    r = {k: {n: round(v, 5) for n, v in d.items()} for k, d in r.items()}
    state.setdefault("speed", {})[key] = {"batch": len(x), "precision": precision, "compiled": compiled, **r}
    ratio = r[PID]["fb_s"] / r["DeiT-tiny"]["fb_s"]
    line = f"batch {len(x)}: {speed.summary_line(r, list(MODELS))}; PID/softmax f+b {ratio:.2f}"
    base = state["speed"].get("fp32 eager")
    if base is not None and key != "fp32 eager":
        gain = r[PID]["fb"] / base[PID]["fb"]
        line += f"; PID f+b x{gain:.2f} of fp32 eager"
        if gain < 1.0:
            return "WARN", line + f" (slower: {key} does not pay on this device)", r
    if ratio > 1.10:
        return "WARN", line + " (PID above 1.10x softmax)", r
    return "PASS", line, r


def fp32(s: Settings, state: Dict[str, Any]) -> Outcome:
    return _rates(s, state, "fp32 eager", "fp32")


def bf16(s: Settings, state: Dict[str, Any]) -> Outcome:
    return _rates(s, state, "bf16 eager", "bf16")


def compiled(s: Settings, state: Dict[str, Any]) -> Outcome:
    fast = "bf16" if s.device.type == "cuda" else "fp32"
    if s.quick:
        return "SKIP", "not in --quick: it compiles two 224 px models", {}
    return _rates(s, state, f"{fast} compiled", fast, compiled=True)


PGD_PASS = 1.05  # the harness may add at most 5% to the bare passes it is made of


def pgd(s: Settings, state: Dict[str, Any]) -> Outcome:
    x, y = _batch(s, state)
    r = speed.pgd_ratio(_models(s, state)[PID], x, y, s.pgd_steps, reps=s.reps)
    state.setdefault("speed", {})["pgd"] = {"steps": s.pgd_steps, "batch": len(x), **r}
    line = (f"PID DeiT-tiny, batch {len(x)}: harness PGD-{s.pgd_steps} {r['harness_s']:.3f} s / {s.pgd_steps} bare "
            f"forward+backward {r['bare_s']:.3f} s = {r['ratio']:.3f} (1.0: no overhead; PASS up to {PGD_PASS})")
    return ("PASS" if r["ratio"] <= PGD_PASS else "WARN"), line, r


def decode(s: Settings, state: Dict[str, Any]) -> Outcome:
    from ..data.generators.jpeg_tree import build_tree, decode_rate, sensible_workers, tree_stats

    tree = s.tmp / "jpeg_tree"
    build_tree(tree, s.tree_images)
    st = tree_stats(tree)
    cores = state.get("environment", {}).get("cpu", {}).get("usable_cores", 1)
    counts = [0] if s.quick else sorted({0, max(1, sensible_workers(cores))})
    runs = {w: decode_rate(tree, w, batch=min(32, s.tree_images), pin_memory=s.device.type == "cuda") for w in counts}
    best = max(runs.values(), key=lambda r: r["img_s"])
    data = {"images": st["images"], "mean_kb": round(st["mean_kb"], 1), "rates": {str(w): r for w, r in runs.items()},
            "best_workers": best["workers"], "best_img_s": best["img_s"], "best_decode": "cpu"}
    line = (f"{st['images']} JPEGs ({st['mean_kb']:.0f} KB) through the imagenet dataset: "
            + ", ".join(f"{w} worker{'' if w == 1 else 's'} {r['img_s']:.0f} img/s" for w, r in runs.items()))
    if s.device.type == "cuda":  # --decode gpu: the workers read bytes, the GPU decodes (data/batch_decode.py)
        w = max(counts)
        gpu = decode_rate(tree, w, batch=min(256, s.tree_images), decode="gpu", device=str(s.device))
        data["gpu_rates"] = {str(w): gpu}
        line += f"; --decode gpu, {w} worker{'' if w == 1 else 's'}: {gpu['img_s']:.0f} img/s"
        if gpu["img_s"] > best["img_s"]:
            best = gpu
            data["best_decode"] = "gpu"
    state.setdefault("speed", {})["decode"] = data
    fwd = state["speed"].get("fp32 eager", {}).get(PID, {}).get("fwd")
    if fwd and best["img_s"] < fwd:
        return "WARN", line + f"; below PID DeiT-tiny's {fwd:.0f} fwd img/s: clean passes wait on decoding", data
    return "PASS", line, data


def calibration(s: Settings, state: Dict[str, Any]) -> Outcome:
    """The ``--calibration FWD,FB`` pair of PID DeiT-tiny at the measured settings, each priced as
    ``evaluate --dry-run --calibration`` prices Table 1's attack rows on 50,000 images."""
    sp = state.get("speed", {})
    settings = {k: sp[k][PID] for k in ("fp32 eager", "bf16 eager", "fp32 compiled", "bf16 compiled") if k in sp}
    if not settings:
        return "FAIL", "no throughput measured (the rate rows failed)", {}
    out: Dict[str, Any] = {}
    for k, r in settings.items():
        fwd, fb = speed.calibration_pair(r)
        est = speed.table1_estimate(fwd, fb)
        out[k] = {"fwd": fwd, "fb": fb, "table1_seconds": est["seconds"], "table1_images": est["images"],
                  "passes_per_image": [est["fwd_passes"], est["fb_passes"]]}
    best = min(out, key=lambda k: out[k]["table1_seconds"])
    b = out[best]
    state["calibration"] = {"setting": best, "pair": f"{b['fwd']:g},{b['fb']:g}", "all": out}
    others = "; ".join(f"{k} {v['fwd']:g},{v['fb']:g} -> {speed.fmt_hours(v['table1_seconds'])}"
                       for k, v in out.items() if k != best)
    line = (f"--calibration {b['fwd']:g},{b['fb']:g} ({best}) prices {speed.TABLE1_WHAT} on {b['table1_images']:,} "
            f"images ({b['passes_per_image'][0]:.0f} fwd + {b['passes_per_image'][1]:.0f} f+b per image) at "
            f"~{speed.fmt_hours(b['table1_seconds'])} on one such device" + (f"; {others}" if others else ""))
    if s.device.type != "cuda":  # a CPU's figure is true but useless: say what the pair is for
        line += ("; a CPU is not what Table 1 runs on: run doctor on the GPU you will use, or price a plan with that "
                 "GPU's pair (evaluate --dry-run --calibration FWD,FB)")
        state["calibration"]["note"] = "cpu: not a device Table 1 runs on"
    return "PASS", line, state["calibration"]


CHECKS = [("speed", "largest batch", largest), ("speed", "fp32 eager", fp32), ("speed", "bf16 eager", bf16),
          ("speed", "compiled", compiled), ("speed", "PGD vs bare passes", pgd), ("speed", "decode", decode),
          ("speed", "calibration", calibration)]

"""Doctor's correctness rows: the embedded models' smoke evaluation on the device against the CPU,
bf16 and ``--compile`` against fp32, and resume after an interrupted unit.

What is compared with what (stated in each row):
  - logits: a plain forward of the model on the device against one on the CPU, within
    ``atol + rtol * |cpu logit|`` (CPU device: 1e-5 + 1e-5, two runs must agree; CUDA: 1e-2 + 1e-2,
    TF32 convolutions and other kernels round differently);
  - clean verdicts: the harness's clean predictions against the argmax of the CPU logits
    (an independent plain evaluation; all must agree);
  - attack verdicts: the harness's PGD run on the device against the same run on the CPU (on a
    CPU-only machine: a second run, which must agree on every sample; on a GPU at least 97%
    (PASS) / 90% (WARN), since an attack amplifies rounding differences into other perturbations).
bf16 and ``--compile`` runs are compared with the fp32 eager run on the same device: clean
verdicts must agree (they are scored in fp32), attack verdicts PASS from 90% (bf16) / 97% (compile).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

from .base import Outcome, Settings

KEY = ["attack", "eps", "sample_id"]
COLS = KEY + ["clean_pred", "pred", "correct_top1", "correct_top5"]


def _model(s: Settings, name: str) -> torch.nn.Module:
    if s.model_factory is not None:
        return s.model_factory(name)
    from ..models.zoo import load_model

    return load_model(name)


def _digits(n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    from ..data import load_dataset

    ds = load_dataset("digits", "test")
    return ds.images[:n].clone(), ds.labels[:n].clone()


def harness_records(s: Settings, model: torch.nn.Module, device: torch.device, tag: str, **kw: Any) -> Any:
    """The harness's records of a clean pass + PGD on the first ``smoke_n`` digits (``rbp.evaluate``
    with the model object: the runner's whole path), sorted by condition and sample."""
    import pandas as pd

    from ..api import evaluate

    x, y = _digits(s.smoke_n)
    out = s.tmp / f"smoke_{tag}"
    shutil.rmtree(out, ignore_errors=True)
    evaluate(model, attack="pgd", eps=s.smoke_eps, steps=s.smoke_steps, data=(x, y), name=tag, device=str(device),
             out=out, batch_size=16, quiet=True, **kw)
    rec = pd.read_parquet(out / "records.parquet")
    return rec[COLS].sort_values(KEY).reset_index(drop=True)


def plain_logits(model: torch.nn.Module, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    m = model.to(device).eval()
    with torch.inference_mode():
        return m(x.to(device)).float().cpu()


def _attack_rows(rec: Any) -> Any:
    return rec[rec.attack != "clean"]


def agreement(a: Any, b: Any, col: str = "pred") -> Tuple[int, int]:
    """(samples whose ``col`` agrees, samples compared), matched on (attack, eps, sample)."""
    m = a.merge(b, on=KEY, suffixes=("_a", "_b"))
    if len(m) != len(a) or len(m) != len(b):
        raise RuntimeError(f"the two runs hold different samples ({len(a)} and {len(b)} records, {len(m)} shared)")
    return int((m[f"{col}_a"] == m[f"{col}_b"]).sum()), len(m)


def smoke_fp32(s: Settings, state: Dict[str, Any]) -> Outcome:
    cpu = torch.device("cpu")
    cuda = s.device.type == "cuda"
    atol = rtol = 1e-2 if cuda else 1e-5
    x, _ = _digits(s.smoke_n)
    parts: List[str] = []
    verdict = "PASS"
    data: Dict[str, Any] = {"tolerance": {"atol": atol, "rtol": rtol}, "models": {}}
    for name in s.smoke_models:
        model = _model(s, name)
        l_ref = plain_logits(model, x, cpu)
        l_dev = plain_logits(model, x, s.device)
        diff = (l_dev - l_ref).abs()
        over = int((diff > atol + rtol * l_ref.abs()).sum())
        rec = harness_records(s, model, s.device, f"{name}_fp32")
        rec_ref = harness_records(s, model, cpu, f"{name}_fp32_cpu")
        clean = rec[rec.attack == "clean"].sort_values("sample_id")
        ref_pred = l_ref.argmax(1).numpy()[clean.sample_id.astype(int).to_numpy()]
        clean_ok = int((clean.clean_pred.to_numpy() == ref_pred).sum())
        att_ok, att_n = agreement(_attack_rows(rec), _attack_rows(rec_ref))
        share = att_ok / att_n
        state.setdefault("fp32_records", {})[name] = rec
        robust = 100 * float(_attack_rows(rec).correct_top1.mean())
        data["models"][name] = {"logits_max_abs_diff": float(diff.max()), "logits_over_tolerance": over,
                                "clean_agree": clean_ok, "n": len(clean), "attack_agree": att_ok, "attack_n": att_n,
                                "robust_top1": robust}
        need = 0.97 if cuda else 1.0
        if over or clean_ok < len(clean) or share < (0.90 if cuda else 1.0):
            verdict = "FAIL"
        elif share < need and verdict == "PASS":
            verdict = "WARN"
        parts.append(f"{name}: logits max|d| {float(diff.max()):.1e} ({over} over tol), clean {clean_ok}/{len(clean)}, "
                     f"PGD {att_ok}/{att_n}")
    ref = "a CPU run" if cuda else "a second run (device = CPU)"
    head = (f"{s.smoke_n} digits, PGD-{s.smoke_steps} {s.smoke_eps}, {s.device} vs CPU: logits within "
            f"{atol:g}+{rtol:g}|x|, clean verdicts vs a plain CPU forward, PGD verdicts vs {ref}; ")
    return verdict, head + "; ".join(parts), data


def _versus_fp32(s: Settings, state: Dict[str, Any], what: str, kw: Dict[str, Any], need: float) -> Outcome:
    base = state.get("fp32_records")
    if not base:
        return "FAIL", "no fp32 records to compare with (the fp32 smoke row failed)", {}
    parts: List[str] = []
    verdict = "PASS"
    data: Dict[str, Any] = {"models": {}}
    for name in s.smoke_models:
        if name not in base:
            continue
        if kw.get("compile"):
            torch._dynamo.reset()  # each model compiled afresh, as in its own `evaluate --compile` process
        rec = harness_records(s, _model(s, name), s.device, f"{name}_{what}", **kw)
        c_ok, c_n = agreement(rec[rec.attack == "clean"], base[name][base[name].attack == "clean"])
        a_ok, a_n = agreement(_attack_rows(rec), _attack_rows(base[name]))
        r_new = 100 * float(_attack_rows(rec).correct_top1.mean())
        r_old = 100 * float(_attack_rows(base[name]).correct_top1.mean())
        data["models"][name] = {"clean_agree": c_ok, "n": c_n, "attack_agree": a_ok, "attack_n": a_n,
                                "robust_top1": r_new, "robust_top1_fp32": r_old}
        if c_ok < c_n or a_ok / a_n < need - 0.07:
            verdict = "FAIL"
        elif a_ok / a_n < need and verdict == "PASS":
            verdict = "WARN"
        parts.append(f"{name}: clean {c_ok}/{c_n}, PGD verdicts agree {100 * a_ok / a_n:.0f}% "
                     f"(robust top-1 {r_new:.1f} vs {r_old:.1f})")
    return verdict, f"{what} vs fp32 eager on {s.device} (PASS from {100 * need:.0f}%): " + "; ".join(parts), data


def smoke_bf16(s: Settings, state: Dict[str, Any]) -> Outcome:
    return _versus_fp32(s, state, "bf16", {"precision": "bf16"}, 0.90)


def smoke_compile(s: Settings, state: Dict[str, Any]) -> Outcome:
    if s.quick:
        works = state.get("environment", {}).get("compile", {}).get("works")
        seen = {True: "the environment row found that torch.compile works",
                False: "the environment row found that torch.compile fails here",
                None: "the environment row could not confirm that torch.compile works"}[works]
        return "SKIP", f"not in --quick: compiling the models takes minutes on a CPU ({seen})", {}
    return _versus_fp32(s, state, "compile", {"compile": True}, 0.97)


def resume(s: Settings, state: Dict[str, Any]) -> Outcome:
    """A finished run, one finished attack unit deleted (as if the process died before writing it),
    re-run into the same folder: only that unit is computed again and the records are identical."""
    import pandas as pd

    from ..api import evaluate

    name = s.smoke_models[0]
    model = _model(s, name)
    x, y = _digits(s.smoke_n)
    out = s.tmp / "resume"
    shutil.rmtree(out, ignore_errors=True)
    kw = dict(attack="pgd", eps=s.smoke_eps, steps=s.smoke_steps, data=(x, y), name=f"{name}_resume",
              device=str(s.device), out=out, batch_size=8, chunk_size=8, quiet=True)
    evaluate(model, **kw)
    first = pd.read_parquet(out / "records.parquet")[COLS].sort_values(KEY).reset_index(drop=True)
    units = sorted(p for p in (out / "units").glob("*.parquet"))
    attacked = [p for p in units if (pd.read_parquet(p, columns=["attack"]).attack != "clean").any()]
    victim = attacked[len(attacked) // 2]
    kept = {p.name: p.stat().st_mtime_ns for p in units if p != victim}
    victim.unlink()
    victim.with_suffix(".json").unlink()
    (out / "records.parquet").unlink()
    evaluate(model, **kw)
    second = pd.read_parquet(out / "records.parquet")[COLS].sort_values(KEY).reset_index(drop=True)
    redone = [n for n, t in kept.items() if (out / "units" / n).stat().st_mtime_ns != t]
    same = first.equals(second)
    data = {"units": len(units), "deleted": victim.stem, "recomputed_others": len(redone), "records_equal": same,
            "records": len(first)}
    line = (f"{name}, {s.smoke_n} digits in {len(units)} units: one finished PGD unit deleted, re-run: "
            f"{'identical' if same else 'DIFFERENT'} records ({len(first)}), "
            f"{len(redone)} other units recomputed")
    return ("PASS" if same and victim.is_file() and not redone else "FAIL"), line, data


CHECKS = [("correctness", "smoke fp32", smoke_fp32), ("correctness", "bf16 vs fp32", smoke_bf16),
          ("correctness", "compile vs fp32", smoke_compile), ("correctness", "resume", resume)]

"""Helpers shared by the model-family tests: release-format checkpoints and a small FGSM evaluation."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Dict, Tuple

import pandas as pd
import timm
import torch
from safetensors.torch import save_file

from robustbench_pid.cli import main

# name: (wrap(sd) -> object saved with torch.save, expected checkpoint_format)
RELEASE_FORMATS: Dict[str, Tuple[Callable, str]] = {
    "state_dict": (lambda sd: {"state_dict": sd, "epoch": 299, "arch": "x"}, "state_dict"),
    "state_dict_ema": (lambda sd: {"state_dict_ema": sd, "epoch": 299}, "state_dict_ema"),
    "model": (lambda sd: {"model": sd, "epoch": 299}, "model"),
    "module-prefix": (lambda sd: {"state_dict": {f"module.{k}": v for k, v in sd.items()}}, "state_dict"),
    "plain": (lambda sd: sd, "state_dict"),
}


def randomized(arch: str, seed: int, **kw) -> torch.nn.Module:
    """``arch`` with every tensor (buffers too) set to seeded random values, in eval mode."""
    torch.manual_seed(seed)
    net = timm.create_model(arch, **kw).eval()
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point():
                t.copy_((t + 0.05 * torch.randn_like(t)).abs() if "running_var" in name else t + 0.05 * torch.randn_like(t))
    return net


def assert_same_tensors(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def evaluate_fgsm(alias: str, arch: str, tmp_path: Path, seed: int = 0) -> Tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``evaluate --model ALIAS --checkpoint <random-init arch> --attack fgsm --limit 8``; checks the rows."""
    ck = tmp_path / f"{alias}.safetensors"
    save_file(randomized(arch, seed).state_dict(), str(ck))
    out = tmp_path / f"run_{alias}"
    rc = main(["evaluate", "--model", alias, "--checkpoint", str(ck), "--attack", "fgsm", "--limit", "8",
               "--out", str(out), "--quiet"])
    assert rc == 0
    records = pd.read_parquet(out / "records.parquet")
    summary = pd.read_csv(out / "summary.csv")
    info = json.loads((out / "run.json").read_text())
    # clean + the default sweep of six eps (1..6 / 255), 8 samples each
    assert len(records) == 7 * 8
    assert set(records["attack"]) == {"clean", "fgsm"}
    fgsm = records[records["attack"] == "fgsm"]
    assert sorted(set(fgsm["eps"].round(8))) == [round(i / 255, 8) for i in range(1, 7)]
    assert (fgsm["pert_linf"] <= fgsm["eps"] + 1e-6).all()
    assert set(records["arch"]) == {arch} and set(records["model"]) == {alias}
    assert set(records["checkpoint_sha256"]) == {hashlib.sha256(ck.read_bytes()).hexdigest()}
    accuracy = summary[summary["metric"].isin(["top1", "top5"])]  # beside them: the attack's evidence rows
    assert len(accuracy) == 7 * 2
    clean = records[records["attack"] == "clean"]
    top1 = summary[(summary["attack"] == "clean") & (summary["metric"] == "top1")]["value"].item()
    assert abs(top1 - 100 * clean["correct_top1"].mean()) < 1e-9
    assert info["status"] == "complete" and info["n_samples"] == 8 and info["arch"] == arch
    return records, summary, info

"""``cost`` benchmark (RPC Table 13): FLOPs of a tiny known model against a hand count, and a run on digits
recorded like any other result (device named)."""
from __future__ import annotations

import math

import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.benchmarks.cost import count_flops, measure_cost


def test_flops_and_params_of_a_tiny_mlp_by_hand():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.rand(4, 2, 4), torch.tensor([0, 1, 2, 0])
    # a Linear(i, o) is i*o multiply-adds per sample = 2*i*o FLOPs; ReLU and Flatten count 0
    per_sample = 2 * 8 * 16 + 2 * 16 * 3
    assert count_flops(net, x) == 4 * per_sample == 1408
    cost = measure_cost(net, x, y, reps=2)
    assert cost["flops_per_sample"] == per_sample
    assert cost["params"] == 8 * 16 + 16 + 16 * 3 + 3
    assert cost["sec_per_sample_test"] > 0 and cost["sec_per_sample_train"] > 0
    assert math.isnan(cost["peak_mem_test_mb"]) and all(p.grad is None for p in net.parameters())


def test_cost_run_on_digits_is_recorded_with_its_device(tmp_path):
    df = rbp.evaluate(model="pid_deit", benchmark="cost", limit=8, batch_size=8, out=tmp_path / "c", device="cpu",
                      quiet=True)
    m = df.set_index("metric")
    assert m.loc["params", "value"] == sum(p.numel() for p in rbp.load_model("pid_deit").parameters())
    assert m.loc["flops_per_sample", "value"] > 0 and m.loc["flops_per_sample", "n"] == 8
    assert (df["device_name"] == "cpu").all()

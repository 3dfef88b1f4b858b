"""``cost`` benchmark (RPC Table 13): FLOPs of a tiny known model against a hand count, and a run on digits
recorded like any other result (device named)."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.benchmarks.cost import CONVENTIONS, METRICS, count_flops, count_ops, measure_cost


def test_flops_and_params_of_a_tiny_mlp_by_hand():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.rand(4, 2, 4), torch.tensor([0, 1, 2, 0])
    # a Linear(i, o) is i*o multiply-adds per sample = 2*i*o FLOPs; ReLU and Flatten count 0
    per_sample = 2 * 8 * 16 + 2 * 16 * 3
    assert count_flops(net, x) == 4 * per_sample == 1408
    cost = measure_cost(net, x, y, reps=2)
    assert cost["flops_per_sample"] == per_sample and cost["macs_per_sample"] == per_sample / 2
    assert cost["params"] == 8 * 16 + 16 + 16 * 3 + 3
    assert cost["sec_per_sample_test"] > 0 and cost["sec_per_sample_train"] > 0
    assert math.isnan(cost["peak_mem_test_mb"]) and all(p.grad is None for p in net.parameters())


def test_cost_run_on_digits_is_recorded_with_its_device(tmp_path, capsys):
    df = rbp.evaluate(model="pid_deit", benchmark="cost", limit=8, batch_size=8, out=tmp_path / "c", device="cpu",
                      quiet=True)
    m = df.set_index("metric")
    assert m.loc["params", "value"] == sum(p.numel() for p in rbp.load_model("pid_deit").parameters())
    assert m.loc["flops_per_sample", "value"] > 0 and m.loc["flops_per_sample", "n"] == 8
    assert m.loc["flops_per_sample", "value"] == 2 * m.loc["macs_per_sample", "value"]
    assert (df["device_name"] == "cpu").all()
    # every row says what it counts, in which unit: the records and the summary
    assert list(df["metric"]) == list(METRICS)
    assert dict(zip(df["metric"], df["value_unit"])) == {k: u for k, (u, _) in CONVENTIONS.items()}
    assert "2 per multiply-add" in m.loc["flops_per_sample", "convention"] and \
        "1 per multiply-add" in m.loc["macs_per_sample", "convention"]
    assert "math attention kernel" in m.loc["macs_per_sample", "convention"]
    assert "PAP's shrinkage" in m.loc["macs_per_sample", "convention"]  # what is not counted
    recs = pd.read_parquet(tmp_path / "c" / "records.parquet")
    assert set(recs["value_unit"]) == {u for u, _ in CONVENTIONS.values()} and recs["convention"].str.len().min() > 0
    from robustbench_pid.cli import main

    assert main(["table", "--layout", "long", str(tmp_path / "c")]) == 0  # the printed table names the unit
    lines = {ln.split("|")[8].strip(): ln for ln in capsys.readouterr().out.splitlines() if "| cost |" in ln}
    assert "| MAC |" in lines["macs_per_sample"] and "| FLOP |" in lines["flops_per_sample"]


# --- counting attention: the same count whatever the device and kernel (issue 35) -------------------------------

def _attention_layer(dim: int = 48, heads: int = 3) -> torch.nn.Module:
    from timm.layers import Attention

    torch.manual_seed(0)
    return Attention(dim, num_heads=heads, qkv_bias=True).eval()


def _hand_macs(n: int, dim: int, heads: int, batch: int = 1) -> int:
    """qkv Linear(dim, 3 dim) and proj Linear(dim, dim) per token; per head 2 N^2 d for QK^T and AV."""
    d = dim // heads
    return batch * (n * dim * 3 * dim + n * dim * dim + heads * 2 * n * n * d)


def _kernel_ran(count, kernel: str) -> bool:
    """The count saw the op of the kernel it was given (so the comparison is between kernels that ran)."""
    fused = [op for op in count.by_op if "scaled_dot_product" in op or "attention" in op]
    return (not fused and "aten.bmm" in count.by_op) if kernel == "math" else bool(fused)


def test_one_attention_layer_against_a_hand_count_on_every_cpu_kernel():
    layer, (b, n, dim, heads) = _attention_layer(), (2, 17, 48, 3)
    x = torch.rand(b, n, dim)
    want = _hand_macs(n, dim, heads, b)
    assert want == 2 * (17 * 48 * 144 + 17 * 48 * 48) + 2 * 3 * 2 * 17 * 17 * 16 == 368832
    for kernel in ("math", "flash"):  # on the CPU "flash" is aten._scaled_dot_product_flash_attention_for_cpu
        c = count_ops(layer, x, kernel)
        assert _kernel_ran(c, kernel), (kernel, c.by_op)
        assert (c.macs, c.flops) == (want, 2 * want), kernel
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in count_ops(layer, x, "flash").by_op
    assert count_flops(layer, x) == 2 * want  # the default: the math kernel
    with pytest.raises(ValueError, match="unknown attention kernel"):
        count_ops(layer, x, "fastest")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="about the CUDA attention kernels: needs a CUDA device")
def test_one_attention_layer_counts_the_same_on_every_cuda_kernel():
    """flash / memory-efficient / cuDNN attention (those this GPU and torch build can run, in fp16) and math."""
    layer, (b, n, dim, heads) = _attention_layer(dim=128, heads=2), (2, 33, 128, 2)
    layer = layer.cuda().half()
    x = torch.rand(b, n, dim, device="cuda", dtype=torch.half)
    ran = []
    for kernel in ("math", "flash", "efficient", "cudnn"):
        try:
            c = count_ops(layer, x, kernel)
        except RuntimeError:  # this kernel cannot run here (GPU generation, build): nothing to compare
            continue
        assert _kernel_ran(c, kernel), (kernel, c.by_op)
        assert c.macs == _hand_macs(n, dim, heads, b), kernel
        ran.append(kernel)
    assert "math" in ran and len(ran) >= 2, ran  # at least one fused kernel compared with the decomposition


# RPC Table 13 as printed ("M", read as GMAC per image) and this count (one 224 px image, random weights)
TABLE13 = {"symvit": ("symvit_tiny_patch16_224", {}, 1.17, 1.1665),
           "rpc 4 iter/layer 1": ("rpc_symvit_tiny_patch16_224", {"pap_iterations": 4}, 1.22, 1.2112),
           "rpc 5 iter/layer 1": ("rpc_symvit_tiny_patch16_224", {"pap_iterations": 5}, 1.23, 1.2261),
           "rpc 6 iter/layer 1": ("rpc_symvit_tiny_patch16_224", {"pap_iterations": 6}, 1.25, 1.2410),
           "rpc 2 iter/all layers": ("rpc_symvit_tiny_patch16_224",
                                     {"pap_iterations": 2, "rpc_layers": "all", "pap_lambda": 3.0}, 1.35, 1.3454)}


def _layer_norm_elements(net: torch.nn.Module, x: torch.Tensor) -> int:
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
             for m in net.modules() if isinstance(m, torch.nn.LayerNorm)]
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    return sum(seen)


def test_rpc_table13_models_and_deit_tiny_gmac_fresh():
    from robustbench_pid.models.zoo import build_model

    x = torch.rand(1, 3, 224, 224)
    for name, (arch, kwargs, paper, want) in TABLE13.items():
        torch.manual_seed(0)
        net = build_model(arch, num_classes=1000, **kwargs).eval()
        gmac = count_ops(net, x).macs / 1e9
        assert gmac == pytest.approx(want, abs=1e-3), name
        assert abs(gmac - paper) < 0.01, name  # the paper's value, printed "M", is this count in 10^9
        # fvcore (in the authors' requirements) also counts 5 per LayerNorm element (25 norms of 197 x 192):
        # with it every count rounds to the printed value
        ln = _layer_norm_elements(net, x)
        assert ln == 25 * 197 * 192 and round(gmac + 5 * ln / 1e9, 2) == paper, name
        if name == "rpc 6 iter/layer 1":  # the whole model counts the same on the CPU kernel as on math
            assert count_ops(net, x, "flash").macs == count_ops(net, x).macs
    torch.manual_seed(0)
    deit = build_model("deit_tiny_patch16_224", num_classes=1000).eval()
    assert count_ops(deit, x).macs / 1e9 == pytest.approx(1.2537, abs=1e-3)
    # per layer, symmetric attention costs 2 N^2 D multiply-adds (QK^T and AV) and each extra PAP iteration one
    # more attention: 5 iterations minus 4 = one layer's attention, 197^2 * 192 * 2
    torch.manual_seed(0)
    four, five = (count_ops(build_model("rpc_symvit_tiny_patch16_224", num_classes=1000, pap_iterations=k).eval(),
                            x).macs for k in (4, 5))
    assert five - four == 2 * 197 * 197 * 192

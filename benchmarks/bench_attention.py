"""PID attention vs softmax attention, forward, at DeiT-tiny size (224 px: 197 tokens, dim 192,
3 heads), measured side by side:

  - one attention layer in the middle of the network (the PID controller state is primed as
    it is from layer 2 on: v^0, the running error sum and the previous error present);
  - the whole model, PID DeiT-tiny vs DeiT-tiny (random weights; weights do not change cost).

    ratio = PID time / softmax time                       target <= 1.10

    python benchmarks/bench_attention.py --batch 64
"""
from __future__ import annotations

import argparse

import torch

from _common import machine, pick_device, timed_interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--profile", action="store_true", help="print the top ops of the PID layer (torch.profiler)")
    a = ap.parse_args()
    device = pick_device(a.device)

    import timm
    from timm.layers import Attention

    from robustbench_pid.models.pid_vit import PidAttention, PidGains, PidState

    torch.manual_seed(0)
    dim, heads, tokens = 192, 3, 197
    soft = Attention(dim, num_heads=heads, qkv_bias=True).eval().to(device)
    pid = PidAttention(dim, num_heads=heads, qkv_bias=True, gains=PidGains()).eval().to(device)
    pid.load_state_dict(soft.state_dict())
    x = torch.randn(a.batch, tokens, dim, device=device)
    hd = dim // heads
    prime = [torch.randn(a.batch, heads, tokens, hd, device=device) for _ in range(3)]

    def state() -> PidState:
        s = PidState()
        s.reference, s.error_sum, s.prev_error = prime
        s.layer = 1
        return s

    def layer_soft() -> None:
        with torch.inference_mode():
            soft(x)

    def layer_pid() -> None:
        with torch.inference_mode():
            pid(x, state=state())

    m_soft = timm.create_model("deit_tiny_patch16_224").eval().to(device)
    m_pid = timm.create_model("pid_deit_tiny_patch16_224").eval().to(device)
    m_pid.load_state_dict(m_soft.state_dict())
    img = torch.rand(a.batch, 3, 224, 224, device=device)

    def model_soft() -> None:
        with torch.inference_mode():
            m_soft(img)

    def model_pid() -> None:
        with torch.inference_mode():
            m_pid(img)

    t = timed_interleaved({"softmax layer": layer_soft, "PID layer": layer_pid}, device, reps=a.reps * 4)
    tm = timed_interleaved({"DeiT-tiny": model_soft, "PID DeiT-tiny": model_pid}, device, reps=a.reps)
    print(f"# bench_attention: batch {a.batch}, 197 tokens, dim 192, 3 heads, device {device}")
    print(f"# {machine()}")
    for k, v in {**t, **tm}.items():
        print(f"{k:24s} {1e3 * v:9.2f} ms")
    print(f"PID / softmax attention layer forward: {t['PID layer'] / t['softmax layer']:.3f}")
    print(f"PID / softmax whole-model forward:     {tm['PID DeiT-tiny'] / tm['DeiT-tiny']:.3f}")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(5):
                layer_pid()
        print(prof.key_averages().table(sort_by="self_cpu_time_total" if device.type == "cpu"
                                        else "self_cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main()

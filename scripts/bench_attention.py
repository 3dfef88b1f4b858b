"""PID attention vs softmax attention at DeiT-tiny size (224 px: 197 tokens, dim 192, 3 heads),
measured side by side:

  - one attention layer in the middle of the network, forward (the PID controller state is
    primed as it is from layer 2 on: v^0, the running error sum and the previous error present);
  - the whole model, PID DeiT-tiny vs DeiT-tiny (random weights; weights do not change cost):
    forward, and forward+backward to the input (what every step of a gradient attack costs:
    parameters frozen, gradient taken to the image only).

    ratio = PID time / softmax time                       target <= 1.10

``--precision bf16`` runs the passes under CUDA autocast as ``evaluate --precision bf16`` runs the
attack; ``--compile`` times ``torch.compile`` of both models (``evaluate --compile``), which fuses
PID's element-wise controller into the surrounding kernels. The last line gives the PID model's
throughput as ``evaluate --dry-run --calibration FWD,FB`` takes it.

    python scripts/bench_attention.py --batch 64                                # CPU
    python scripts/bench_attention.py --batch 256 --precision bf16 --compile    # one GPU
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
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="whole-model passes under CUDA autocast (as evaluate's attack passes)")
    ap.add_argument("--compile", action="store_true", help="torch.compile both whole models (as evaluate --compile)")
    ap.add_argument("--profile", action="store_true", help="print the top ops of the PID layer (torch.profiler)")
    a = ap.parse_args()
    device = pick_device(a.device)
    if a.precision != "fp32" and device.type != "cuda":
        raise SystemExit(f"error: --precision {a.precision} needs a CUDA device (as in evaluate); use fp32")

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

    from robustbench_pid.run.speed import calibration_pair, pass_rates, random_batch, random_model

    m_soft = random_model("deit_tiny_patch16_224", device)
    m_pid = random_model("pid_deit_tiny_patch16_224", device)
    m_pid.load_state_dict(m_soft.state_dict())
    run_soft, run_pid = (torch.compile(m_soft), torch.compile(m_pid)) if a.compile else (m_soft, m_pid)
    img, target = random_batch(a.batch, device)

    t = timed_interleaved({"softmax layer": layer_soft, "PID layer": layer_pid}, device, reps=a.reps * 4)
    # the whole models: robustbench_pid.run.speed.pass_rates, the measurement `robustbench-pid doctor` prints
    r = pass_rates({"DeiT-tiny": run_soft, "PID DeiT-tiny": run_pid}, img, target, a.precision, reps=a.reps)
    tm = {f"{k} fwd": v["fwd_s"] for k, v in r.items()}
    tb = {f"{k} f+b": v["fb_s"] for k, v in r.items()}
    how = f"{a.precision}{' + torch.compile' if a.compile else ' eager'}"
    print(f"# bench_attention: batch {a.batch}, 197 tokens, dim 192, 3 heads, device {device}; whole models {how}")
    print(f"# {machine()}")
    for k, v in {**t, **tm, **tb}.items():
        print(f"{k:24s} {1e3 * v:9.2f} ms   {a.batch / v:9.1f} img/s")
    print(f"PID / softmax attention layer forward (fp32 eager): {t['PID layer'] / t['softmax layer']:.3f}")
    print(f"PID / softmax whole-model forward ({how}):          {tm['PID DeiT-tiny fwd'] / tm['DeiT-tiny fwd']:.3f}")
    print(f"PID / softmax whole-model forward+backward ({how}): {tb['PID DeiT-tiny f+b'] / tb['DeiT-tiny f+b']:.3f}")
    fwd, fb = calibration_pair(r["PID DeiT-tiny"])
    print(f"PID DeiT-tiny here, for evaluate --dry-run: --calibration {fwd:g},{fb:g}")
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

"""Attack throughput: the harness's PGD against the physical limit and against torchattacks.

Prints, measured side by side on one batch:
  harness PGD-k / (k x bare forward+backward to the input)   target <= 1.05 (1.0 is the limit)
    - early stop off (every sample gets k steps: the fair ratio)
    - early stop on (the default: broken samples stop, so it can go below 1)
  harness PGD / torchattacks PGD, same eps/step/steps/random start     target <= 1.0
  harness work unit (clean pass + PGD-k + verdict pass + records) / (k f+b + 2 forward)

    python scripts/bench_attack.py --model digits            # the embedded PID DeiT, 32x32
    python scripts/bench_attack.py --model imagenet --batch 8 # PID DeiT-tiny 224 (random weights)
"""
from __future__ import annotations

import argparse
import json

import torch

from _common import machine, pick_device, timed_interleaved


def build(kind: str, batch: int, device: torch.device):
    if kind == "digits":
        from robustbench_pid import load_dataset, load_model

        model = load_model("pid_deit").to(device)
        ds = load_dataset("digits", "test")
        x, y = ds.images[:batch].to(device), ds.labels[:batch].to(device)
        return model, x, y
    from robustbench_pid.run.speed import random_model

    model = random_model("pid_deit_tiny_patch16_224", device)
    x = torch.rand(batch, 3, 224, 224, device=device)
    with torch.inference_mode():
        y = model(x).argmax(1)  # random weights: attack the model's own predictions
    return model, x, y.clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["digits", "imagenet"], default="digits")
    ap.add_argument("--batch", type=int, default=None, help="default: 128 (digits), 64 on GPU / 8 on CPU (imagenet)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eps", type=float, default=4 / 255)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    device = pick_device(a.device)
    batch = a.batch or (128 if a.model == "digits" else (64 if device.type == "cuda" else 8))
    model, x, y = build(a.model, batch, device)
    k = a.steps

    from robustbench_pid.attacks import make_attack

    harness = make_attack("pgd", eps=a.eps, steps=k, early_stop=False)
    harness_es = make_attack("pgd", eps=a.eps, steps=k, early_stop=True)
    alpha = harness.step()

    def bare_fwd() -> None:
        with torch.inference_mode():
            model(x)

    def run_h_es() -> None:
        harness_es(model, x, y, generator=torch.Generator(device=device).manual_seed(0))

    from robustbench_pid.run.speed import pgd_calls

    # k bare passes and the harness's PGD: the package's pair, the one `robustbench-pid doctor` times
    fns = {**pgd_calls(model, x, y, k, eps=a.eps), "harness PGD (early stop on)": run_h_es, "bare forward": bare_fwd}
    try:
        import torchattacks

        ta = torchattacks.PGD(model, eps=a.eps, alpha=alpha, steps=k, random_start=True)
        fns["torchattacks PGD"] = lambda: ta(x, y)
    except ImportError:
        ta = None

    # the harness's whole work unit: data batches, clean pass, attack, verdict pass, records
    from robustbench_pid.benchmarks import get_benchmark
    from robustbench_pid.specs import Unit
    from robustbench_pid.run.context import Context
    from robustbench_pid.specs import RunSpec

    class _Ctx(Context):
        def batches(self, unit):  # the preloaded batch, as the bare loops get it
            yield x, y, [str(i) for i in range(len(y))], None  # no memo: each unit pays its clean pass

    spec = RunSpec(model="bench", batch_size=batch)
    ctx = _Ctx(spec, model, None, list(range(batch)), device, {})
    bench = get_benchmark("adversarial")
    params = json.dumps(harness.params(), sort_keys=True)
    unit = Unit("adversarial", "pgd", a.eps, params, "", 0, batch, "0" * 64)
    fns["harness work unit (early stop off)"] = lambda: bench.run_unit(ctx, unit)

    t = timed_interleaved(fns, device, reps=a.reps)
    x_es = harness_es(model, x, y, generator=torch.Generator(device=device).manual_seed(0))
    with torch.inference_mode():
        broken = (~(model(x_es).topk(5, 1).indices == y[:, None]).any(1)).float().mean().item()
    print(f"# bench_attack: model {a.model}, batch {batch}, PGD-{k}, eps {a.eps:.5f}, device {device}")
    print(f"# {machine()}")
    for name, s in t.items():
        print(f"{name:40s} {1e3 * s:10.1f} ms")
    print(f"harness PGD-{k} / {k} x bare f+b (early stop off):   {t['harness PGD (early stop off)'] / t['bare k x f+b']:.3f}")
    print(f"harness PGD-{k} / {k} x bare f+b (early stop on):    {t['harness PGD (early stop on)'] / t['bare k x f+b']:.3f}"
          f"   ({100 * broken:.0f}% of samples out of top-5 at the end)")
    if ta is not None:
        print(f"harness PGD / torchattacks PGD (both run every step): {t['harness PGD (early stop off)'] / t['torchattacks PGD']:.3f}")
    full = t["harness work unit (early stop off)"] / (t["bare k x f+b"] + 2 * t["bare forward"])
    print(f"harness work unit / (k f+b + 2 forward):           {full:.3f}")


if __name__ == "__main__":
    main()

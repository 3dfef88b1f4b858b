"""Decoding that keeps up (issue 48, item 1): images/s decoded by ``--decode cpu`` (PIL in N workers) and
``--decode gpu`` (bytes read by N workers, decoded, resized and cropped in batches on the GPU), the model's forward
rate they have to feed, and the two paths' agreement, on one generated ImageNet-validation tree.

Figures, each printed and written to ``--json FILE``:
  decode      images/s of one pass over the tree through the DataLoader (worker start-up included), per decoder
  forward     PID DeiT-tiny forward images/s at the batch size, fp32 and bf16 (the rate a clean pass needs fed)
  agreement   the tensor path on the device against the PIL path, every image: max and mean |pixel difference|
              (in levels of 1/255), the share of differing values, and the clean top-1 verdicts of a seeded random
              PID DeiT-tiny (every weight matrix from N(0, 0.02), so its verdicts differ between images) that agree

Without CUDA the GPU decoder runs on the CPU (the code path the GPU runs, not its speed) and the script says so.

    python scripts/bench_decode.py --n 64 --workers 0                        # CPU: rates of the CPU path, agreement
    python scripts/bench_decode.py --n 4096 --workers 14 --json decode.json  # one GPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODEL_INFO = {"input_size": (3, 224, 224), "interpolation": "bicubic", "crop_pct": 0.875}  # DeiT's


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None, help="images in the tree (default 64 on CPU, 4096 on CUDA)")
    ap.add_argument("--tree", type=Path, help="reuse this tree (built there if missing or empty)")
    ap.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: 0 on <= 2 cores, else "
                                                              "min(14, cores - 2))")
    ap.add_argument("--batch-size", type=int, default=None, help="default 32 on CPU, 256 on CUDA")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    ap.add_argument("--agree", type=int, default=256, help="images compared pixel by pixel and by verdict")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    import torch

    a.device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {a.device}: no CUDA device is visible here; use --device cpu")
    cuda = a.device.startswith("cuda")
    a.n = a.n if a.n is not None else (4096 if cuda else 64)
    a.batch_size = a.batch_size if a.batch_size is not None else (256 if cuda else 32)
    from robustbench_pid.data.generators.jpeg_tree import sensible_workers

    a.workers = a.workers if a.workers is not None else sensible_workers(os.cpu_count() or 1)
    for name, v, low in (("--n", a.n, 1), ("--batch-size", a.batch_size, 1), ("--workers", a.workers, 0),
                         ("--agree", a.agree, 1)):
        if v < low:
            fail(f"{name} must be >= {low}, got {v}")
    return a


def agreement(tree: Path, device: str, n: int, batch: int) -> Dict[str, Any]:
    """The tensor path on ``device`` against the PIL path on the first ``n`` images: pixels and clean verdicts."""
    import torch

    from robustbench_pid import load_dataset
    from robustbench_pid.data.batch_decode import BatchDecoder, EncodedFiles, collate_encoded
    from robustbench_pid.models import load_model
    from robustbench_pid.models.zoo import build_model

    dev = torch.device(device)
    torch.manual_seed(0)
    net = build_model("pid_deit_tiny_patch16_224", num_classes=1000)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(net.state_dict(), Path(tmp) / "ck.pth")
        model = load_model("pid_deit", str(Path(tmp) / "ck.pth"), "imagenet").to(dev).eval()
    ds = load_dataset("imagenet", root=str(tree), model_info=MODEL_INFO)
    enc, decoder = EncodedFiles(ds), BatchDecoder(MODEL_INFO, dev)
    top, total, diff_values, values, same, count, classes = 0.0, 0.0, 0, 0, 0, 0, set()
    for s in range(0, min(n, len(ds)), batch):
        idx = range(s, min(n, len(ds), s + batch))
        pil = torch.stack([ds[i][0] for i in idx]).to(dev)
        got = decoder(collate_encoded([enc[i] for i in idx])[0])
        d = (got - pil).abs() * 255
        top, total = max(top, float(d.max())), total + float(d.sum())
        diff_values, values = diff_values + int((d > 0.5).sum()), values + d.numel()
        with torch.inference_mode():
            a, b = model(pil).argmax(1), model(got).argmax(1)
        same, count = same + int((a == b).sum()), count + len(idx)
        classes |= set(a.tolist())
    return {"images": count, "device": str(dev), "max_levels": top, "mean_levels": total / values,
            "share_differing": diff_values / values, "verdicts_agree": same, "distinct_predictions": len(classes),
            "fallbacks": decoder.fallbacks}


def forward_rates(device: str, batch: int) -> Dict[str, float]:
    """PID DeiT-tiny forward images/s (fp32, and bf16 on CUDA), interleaved medians (run/speed.py)."""
    import torch

    from robustbench_pid.run.speed import pass_rates, random_batch, random_model

    dev = torch.device(device)
    model = random_model("pid_deit_tiny_patch16_224", dev)
    x, y = random_batch(batch, dev)
    out = {"fp32": pass_rates({"pid": model}, x, y, "fp32", reps=3)["pid"]["fwd"]}
    if dev.type == "cuda":
        out["bf16"] = pass_rates({"pid": model}, x, y, "bf16", reps=3)["pid"]["fwd"]
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    warnings.simplefilter("ignore")  # "a partial copy" of ImageNet: a generated tree is one
    import torch

    from robustbench_pid.data.generators.jpeg_tree import build_tree, decode_rate, tree_stats
    from robustbench_pid.run.speed import machine

    cuda = a.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="bench_decode_") as tmp:
        tree = a.tree if a.tree is not None else Path(tmp) / "tree"
        if not (tree.is_dir() and any(tree.iterdir())):
            tree.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            build_tree(tree, a.n)
            print(f"# built {a.n} JPEGs in {time.perf_counter() - t:.1f} s", flush=True)
        st = tree_stats(tree)
        print(f"# bench_decode: {st['images']} JPEGs ({st['mean_kb']:.0f} KB), batch {a.batch_size}, workers "
              f"{a.workers}, device {a.device}; {machine()}", flush=True)
        rates = {"cpu": decode_rate(tree, a.workers, a.batch_size, MODEL_INFO, pin_memory=cuda)}
        if cuda:
            rates["gpu"] = decode_rate(tree, a.workers, a.batch_size, MODEL_INFO, decode="gpu", device=a.device)
        else:
            print("# SKIPPED: --decode gpu's speed (no CUDA device here); its code path runs on the CPU below")
        agree = agreement(tree, a.device, a.agree, a.batch_size)
        fwd = forward_rates(a.device, a.batch_size)
    for k, r in rates.items():
        print(f"decode {k:3}: {r['img_s']:9.0f} img/s ({r['images']} images, {r['seconds']:.2f} s, {r['workers']} workers)")
    for k, v in fwd.items():
        print(f"forward {k}: {v:9.0f} img/s (PID DeiT-tiny, batch {a.batch_size})")
    target = fwd.get("bf16", fwd["fp32"])
    best = max(rates, key=lambda k: rates[k]["img_s"])
    print(f"decode / forward ({'bf16' if 'bf16' in fwd else 'fp32'}): {rates[best]['img_s'] / target:.2f} with "
          f"--decode {best} (>= 1: decoding keeps up with a clean pass)")
    print(f"agreement on {agree['device']} ({agree['images']} images): pixels max {agree['max_levels']:.0f}/255, mean "
          f"{agree['mean_levels']:.4f}/255, {100 * agree['share_differing']:.2f}% of values differ; clean top-1 "
          f"verdicts {agree['verdicts_agree']}/{agree['images']} agree ({agree['distinct_predictions']} classes "
          f"predicted); {agree['fallbacks']} files decoded on the CPU")
    if a.json:
        import platform

        import torchvision

        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "script": "scripts/bench_decode.py", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
            "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__},
            "tree": st, "batch_size": a.batch_size, "workers": a.workers, "decode": rates, "forward": fwd,
            "agreement": agree}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

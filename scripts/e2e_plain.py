"""The plain loop ``scripts/bench_e2e.py`` times ``evaluate`` against, in its own process:
``python scripts/e2e_plain.py SETTINGS_JSON`` prints one JSON line (work seconds, images, top-1 per condition).

What a user writes without the harness: torchvision ImageFolder + DataLoader (the same batch, workers and
transform: Resize(floor(224 / 0.875) = 256, bicubic, antialias) + CenterCrop(224) + ToTensor, normalization inside
the model), the same model, the project's attack classes at the paper-protocol settings, top-1 counted on the
device. ``decode: gpu``: the workers read file bytes (torchvision.io.read_file) and the loop decodes each batch
with ``torchvision.io.decode_jpeg(device=...)`` and resizes/crops each image with torchvision's tensor functions
(the same steps, written plainly: one resize per image). ``compile``: ``torch.compile`` of the model and of its
network, as ``evaluate --compile`` compiles them. Timed from after its imports to the last batch.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
MODEL = "pid_deit"


def plain_loop(cfg: Dict[str, Any], t_script: float) -> Dict[str, Any]:
    """Decode each image once, clean pass, every condition on each batch."""
    import torch
    from torchvision import datasets as tvd
    from torchvision import transforms as T

    from robustbench_pid.attacks import make_attack
    from robustbench_pid.benchmarks.adversarial import protocol_params
    from robustbench_pid.core.imagenet_info import wnid_to_index
    from robustbench_pid.core.labels import parse_eps
    from robustbench_pid.models.zoo import load_model
    from robustbench_pid.runtime.device import attack_precision

    t0 = time.perf_counter()
    device = torch.device(cfg["device"])
    model = load_model(MODEL, cfg["checkpoint"], "imagenet").to(device)
    size = int(model.info["input_size"][-1])
    scale = int(math.floor(size / model.info["crop_pct"]))
    interp = T.InterpolationMode[str(model.info["interpolation"]).upper()]  # bicubic for DeiT
    gpu_decode = cfg.get("decode", "cpu") == "gpu"
    tf = T.Compose([T.Resize(scale, interp, antialias=True), T.CenterCrop(size), T.ToTensor()])
    w2i = wnid_to_index()

    class WnidFolder(tvd.ImageFolder):  # labels = index in the 1000 sorted wnids, as the project's
        def find_classes(self, directory: str) -> Tuple[List[str], Dict[str, int]]:
            classes = sorted(d.name for d in os.scandir(directory) if d.is_dir())
            return classes, {c: w2i[c] for c in classes}

    if gpu_decode:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file
        from torchvision.transforms.v2 import functional as F

        ds = WnidFolder(cfg["tree"], loader=read_file)  # items: (file bytes, label)

        def collate(items: List[Any]) -> Any:
            return [b for b, _ in items], torch.tensor([y for _, y in items])

        def images(data: List[Any]) -> Any:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            crops = [F.center_crop(F.resize(im, [scale], interpolation=interp, antialias=True), [size, size])
                     for im in decoded]
            return torch.stack(crops).float().div_(255)
    else:
        ds, collate = WnidFolder(cfg["tree"], transform=tf), None

        def images(x: Any) -> Any:
            return x.to(device, non_blocking=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"],
                                         pin_memory=device.type == "cuda" and not gpu_decode, collate_fn=collate)
    fwd, net = model, model.net
    if cfg.get("compile"):
        fwd, net = torch.compile(model), torch.compile(model.net)
    attacks = []
    for name, params in cfg["conditions"]:
        settings = protocol_params(name, {**params, "eps": parse_eps(params["eps"])}, "paper")
        attacks.append((f"{name}@{settings['eps']:.6f}", make_attack(name, **settings), torch.Generator().manual_seed(0)))
    correct = {"clean@0.000000": torch.zeros((), dtype=torch.long, device=device)}
    correct.update({k: torch.zeros((), dtype=torch.long, device=device) for k, _, _ in attacks})
    n = 0
    for x, y in loader:
        x, y = images(x), y.to(device, non_blocking=True)
        n += len(y)
        with torch.inference_mode():
            clean_logits = fwd(x)
        clean_pred = clean_logits.argmax(1)  # outside inference mode: the attacks' autograd may save it
        correct["clean@0.000000"] += (clean_pred == y).sum()
        z = model.normalize(x) if attacks else None
        for key, attack, gen in attacks:  # paper protocol: normalized space, no clipping, clean-prediction labels
            with attack_precision(device, cfg["precision"]):
                z_adv = attack(net, z, clean_pred, bounds=None, generator=gen)
            with torch.inference_mode():
                correct[key] += (net(z_adv).argmax(1) == y).sum()
    top1 = {k: 100.0 * v.item() / n for k, v in correct.items()}  # the one host sync
    work = time.perf_counter() - t0
    return {"work_s": work, "in_script_s": time.perf_counter() - t_script, "n": n, "top1": top1}


if __name__ == "__main__":
    started = time.perf_counter()
    print(json.dumps(plain_loop(json.loads(sys.argv[1]), started)))

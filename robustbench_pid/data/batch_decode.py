"""``--decode gpu``: JPEG bytes read by the DataLoader workers, decoded, resized and cropped in batches on a device.

Why: PIL decoding in CPU workers is the bottleneck of a clean pass at ImageNet scale (issue 48: a model forward
is ten times the decode rate of 14 workers). Here the workers only read each file's bytes; the runner's main
process decodes a whole batch at once with ``torchvision.io.decode_jpeg(..., device=device)`` (nvjpeg on CUDA)
and applies the model's evaluation transform as tensor operations: the same steps as the CPU path
(``imagenet.eval_transform`` / ``imagenet_c.c_transform``): resize the shorter side to floor(size / crop_pct)
with the model's interpolation (antialiased), centre crop, [0, 1] float. Images of one shape are resized
together. Another decoder gives other pixels (rounding of the IDCT and the resize), so it is another measurement:
``decode`` is in the run's spec and every unit key, and ``decode_provenance`` is recorded in run.json.

The device is an argument, so the same code runs on the CPU (``decode_jpeg`` on CPU tensors): a test compares
it there with the PIL path. Only the run's entry refuses ``gpu`` without CUDA (:func:`check_decode`).

Files the device decoder cannot read (a PNG, a CMYK JPEG nvjpeg refuses) are decoded on the CPU
(``torchvision.io.decode_image``, then PIL), with one warning per run; a file nothing can read is the CPU
path's error (``imagenet.load_image``).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset

from ..errors import UserError
from ..specs import DECODES

JPEG_MAGIC = b"\xff\xd8"
SIDE_C = 224  # ImageNet-C files (imagenet_c.SIDE; not imported: that module registers a dataset)


# --------------------------------------------------------------------------- where it enters

def decode_datasets() -> List[str]:
    """The registered datasets read from image files (the ImageNet family): the ones --decode gpu can read."""
    from . import datasets

    return sorted(n for n in datasets.names() if datasets.get(n).family == "imagenet" and datasets.get(n).needs_root)


def check_decode(decode: Any, dataset: Optional[str] = None, benchmark: Optional[str] = None,
                 device: Optional[str] = None, data_object: bool = False) -> None:
    """Refuse a ``decode`` that cannot run here, in one line naming the fix (nothing is loaded or written yet).
    ``device``: the ``--device`` text or a device's type."""
    if decode not in DECODES:
        raise UserError(f"--decode {decode!r}: choose cpu (PIL in the loader workers, the default) or gpu "
                        f"(JPEG bytes decoded in batches on the GPU)")
    if decode == "cpu":
        return
    if data_object:
        raise UserError("--decode gpu reads image files of a registered dataset; a data object is read as it is: "
                        "drop decode='gpu'")
    if dataset is not None and dataset not in decode_datasets():
        raise UserError(f"--decode gpu reads JPEG files (datasets {', '.join(decode_datasets())}); dataset "
                        f"{dataset!r} is not read from files: drop --decode gpu")
    if benchmark == "corruptions":
        raise UserError("--decode gpu: the corruptions benchmark corrupts CPU images in the loader workers; drop "
                        "--decode gpu (or use --dataset imagenet-c, whose corrupted files it decodes)")
    if device is not None and str(device).split(":")[0] == "cpu":
        raise UserError("--decode gpu decodes on the run's GPU but --device cpu runs on the CPU; drop --decode gpu "
                        "or use --device cuda")
    if not torch.cuda.is_available():
        raise UserError("--decode gpu needs a CUDA device (torch.cuda.is_available() is False); drop --decode gpu "
                        "or run on a GPU machine")


# --------------------------------------------------------------------------- the workers' side: bytes

@dataclass
class EncodedBatch:
    """A batch as the workers read it: each file's bytes (uint8 CPU tensors), which transform it takes (``eval``
    or ImageNet-C's ``c``) and its path (for messages and the CPU fallback)."""

    data: List[torch.Tensor]
    kinds: List[str]
    paths: List[str]

    def pin_memory(self) -> "EncodedBatch":
        return self  # the decoder reads host bytes; nothing to pin

    def __len__(self) -> int:
        return len(self.data)


class EncodedFiles(Dataset):
    """A file dataset (``ImageFiles`` / ``ImageNetCFiles``) whose items are its files' bytes, not images."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Tuple[Tuple[torch.Tensor, str, str], int]:
        path, kind, label = self.base.encoded(i)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise UserError(f"cannot read image {path}: {exc}. Replace the file, or pass --skip-unreadable to skip "
                            f"(and count) unreadable images") from None
        return (torch.frombuffer(bytearray(raw), dtype=torch.uint8), kind, str(path)), label


def collate_encoded(items: Sequence[Tuple[Tuple[torch.Tensor, str, str], int]]) -> Tuple[EncodedBatch, torch.Tensor]:
    """Bytes of differing lengths stay a list (no stacking); labels become a tensor, as the default collate."""
    return (EncodedBatch([it[0][0] for it in items], [it[0][1] for it in items], [it[0][2] for it in items]),
            torch.tensor([int(it[1]) for it in items]))


# --------------------------------------------------------------------------- the device's side: pixels

@dataclass(frozen=True)
class Steps:
    """One transform as tensor steps: resize to ``resize`` (an int: the shorter side; a pair: both sides; None:
    none), then centre crop to ``crop`` (None: none). ``side``: the size every input must have (ImageNet-C)."""

    resize: Any
    crop: Optional[int]
    side: Optional[int] = None


def tensor_steps(model_info: Dict[str, Any]) -> Dict[str, Steps]:
    """The ``eval`` and ImageNet-C ``c`` transforms of this model, as ``imagenet.eval_transform`` and
    ``imagenet_c.c_transform`` define them for PIL images."""
    from .imagenet import input_side

    size = input_side(model_info)
    crop_pct = float(model_info.get("crop_pct") or 0.875)
    crop_mode = str(model_info.get("crop_mode") or "center")
    scale = int(math.floor(size / crop_pct))
    if crop_mode == "border":
        raise UserError("--decode gpu: this model's crop_mode is 'border' (resize the long side, pad with the mean "
                        "colour), which only the CPU path implements; drop --decode gpu")
    resize = scale if crop_mode == "center" else (scale, scale)
    c = Steps(None, None, SIDE_C) if size == SIDE_C else Steps((size, size), None, SIDE_C)
    return {"eval": Steps(resize, size), "c": c}


class BatchDecoder:
    """Decodes an :class:`EncodedBatch` on ``device`` into the model's input: (N, 3, size, size) float in [0, 1]."""

    def __init__(self, model_info: Dict[str, Any], device: torch.device) -> None:
        from .imagenet import input_side, interpolation

        self.device = torch.device(device)
        self.steps = tensor_steps(model_info)
        self.size = input_side(model_info)
        self.interp_name, self.mode = interpolation(model_info)
        self.fallbacks = 0

    def __call__(self, batch: EncodedBatch) -> torch.Tensor:
        images = self._decode(batch)
        out = torch.empty((len(images), 3, self.size, self.size), dtype=torch.float32, device=self.device)
        groups: Dict[Tuple[str, int, int], List[int]] = {}
        for k, (img, kind) in enumerate(zip(images, batch.kinds)):
            groups.setdefault((kind, int(img.shape[-2]), int(img.shape[-1])), []).append(k)
        for (kind, h, w), idx in groups.items():
            steps = self.steps[kind]
            if steps.side is not None and kind == "c" and (h, w) != (steps.side, steps.side):
                raise UserError(f"imagenet-c: {batch.paths[idx[0]]} is {w}x{h}, not {steps.side}x{steps.side} as "
                                f"every ImageNet-C file is; replace it with the file from the ImageNet-C archive")
            x = torch.stack([images[k] for k in idx])
            out[torch.tensor(idx, device=self.device)] = self._transform(x, steps).float().div_(255)
        return out

    def _transform(self, x: torch.Tensor, steps: Steps) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        if steps.resize is not None:
            size = [steps.resize] if isinstance(steps.resize, int) else list(steps.resize)
            x = F.resize(x, size, interpolation=self.mode, antialias=True)
        if steps.crop is not None:
            x = F.center_crop(x, [steps.crop, steps.crop])
        return x

    def _decode(self, batch: EncodedBatch) -> List[torch.Tensor]:
        """uint8 (3, H, W) images on the device: the JPEGs in one decode_jpeg call, the rest on the CPU."""
        from torchvision.io import ImageReadMode, decode_jpeg

        images: List[Optional[torch.Tensor]] = [None] * len(batch)
        jpeg = [k for k, d in enumerate(batch.data) if bytes(d[:2].tolist()) == JPEG_MAGIC]
        if jpeg:
            try:
                got = decode_jpeg([batch.data[k] for k in jpeg], mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:  # one file the device decoder refuses fails the batch: decode one by one
                got = [self._one_jpeg(batch.data[k]) for k in jpeg]
            for k, img in zip(jpeg, got):
                images[k] = img
        for k in range(len(batch)):
            if images[k] is None:
                images[k] = self._on_cpu(batch.data[k], batch.paths[k]).to(self.device, non_blocking=True)
        return images  # type: ignore[return-value]

    def _one_jpeg(self, data: torch.Tensor) -> Optional[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return None

    def _on_cpu(self, data: torch.Tensor, path: str) -> torch.Tensor:
        """A file the device decoder did not read: torchvision's CPU decoders, then PIL (the CPU path's reader and
        its error for a file nothing reads)."""
        from pathlib import Path

        from torchvision.io import ImageReadMode, decode_image
        from torchvision.transforms.functional import pil_to_tensor

        from .imagenet import load_image

        if self.fallbacks == 0:
            warnings.warn(f"--decode gpu: {path} is not a JPEG the {self.device.type} decoder reads; decoded on the "
                          f"CPU (so is any other such file of this run)", stacklevel=2)
        self.fallbacks += 1
        try:
            return decode_image(data, mode=ImageReadMode.RGB)
        except RuntimeError:
            return pil_to_tensor(load_image(Path(path)))

    def provenance(self) -> Dict[str, Any]:
        return decode_provenance("gpu", self)


def decode_provenance(decode: str, decoder: Optional[BatchDecoder] = None) -> Dict[str, Any]:
    """What run.json records of how the images were decoded (the steps, the device, the library)."""
    if decode == "cpu" or decoder is None:
        return {"decode": "cpu", "reader": "PIL (Image.open, convert RGB) and torchvision transforms on PIL images, "
                                           "in the DataLoader workers"}
    import torchvision

    eval_steps = decoder.steps["eval"]
    return {"decode": "gpu", "device": str(decoder.device), "torchvision": torchvision.__version__,
            "reader": "each file's bytes read in the DataLoader workers",
            "jpeg": f"torchvision.io.decode_jpeg, batched, on {decoder.device} (nvjpeg on CUDA), RGB, no EXIF rotation",
            "other_files": "torchvision.io.decode_image on the CPU, else PIL (warned)",
            "resize": {"size": eval_steps.resize, "interpolation": decoder.interp_name, "antialias": True,
                       "on": "uint8 tensors, torchvision.transforms.v2.functional.resize"},
            "center_crop": eval_steps.crop, "imagenet_c": "no resize at 224" if decoder.steps["c"].resize is None
            else f"resize to {decoder.steps['c'].resize}"}

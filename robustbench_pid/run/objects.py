"""Model and data *objects* (not registered names) for ``rbp.evaluate`` / ``rbp.attack``.

A model object is any ``nn.Module`` mapping [0, 1] images to logits (``mean=``/``std=`` wrap a
normalisation in front, as ``load_model`` does, one value per channel of the images; without them there
is none, whatever the channel count: a 1-channel model needs no made-up normalisation). Its identity is a content hash of its state_dict
and its class name (recorded as ``checkpoint_sha256``), so resuming needs the same weights, not the
same Python object, and a run folder never mixes two models. The caller's object is never touched:
everything here works on a deep copy (device, train/eval mode, ``requires_grad``, compilation).

Data objects (a ``Dataset`` of (image, label), a ``DataLoader``, or tensors ``(x, y)``) are read in
index order; sample ids are the indices. Their content hash (images as float32, labels) goes into
the unit keys, so the three forms of the same data give the same run, and other data never reuses
its records. Hashing reads the data once: for large data sets prefer a registered dataset.
"""
from __future__ import annotations

import copy
import hashlib
import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from ..errors import UserError, without_worker_traceback
from ..models.wrapper import Normalized
from .input_checks import as_tensor, check_labels, check_layout, check_range, meta_tensors, probe_model, watch_outputs


def _class_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def state_sha256(module: nn.Module) -> str:
    """sha256 of the module's class and every state_dict entry (name, dtype, shape, bytes)."""
    h = hashlib.sha256(_class_name(module).encode())
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _uncompiled(obj: nn.Module) -> nn.Module:
    """The module behind a ``torch.compile`` wrapper (a compiled module keeps its weights there)."""
    orig = getattr(obj, "_orig_mod", None)
    return orig if isinstance(orig, nn.Module) else obj


def wrap_model(obj: Any, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
               name: Optional[str] = None, num_classes: Optional[int] = None) -> Normalized:
    """A deep copy of ``obj`` as a ``Normalized`` model (eval mode, frozen) with provenance in ``.info``.

    ``num_classes`` and ``input_size`` stay None until :func:`complete_info` sees a sample.
    """
    if not isinstance(obj, nn.Module):
        raise UserError(f"model must be a registered name (str) or a torch.nn.Module, got {type(obj).__name__}")
    if (mean is None) != (std is None):
        raise UserError("give both mean= and std= (the normalisation to wrap in front of the model), or neither")
    src = _uncompiled(obj)
    if meta_tensors(src):
        raise UserError(f"the model ({type(src).__name__}) has parameters on the meta device (shapes without data, "
                        f"e.g. built under torch.device('meta')): materialise and load its weights first "
                        f"(model.to_empty(device='cpu'), then model.load_state_dict(...))")
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                    or num_classes < 1):
        raise UserError(f"num_classes must be a whole number >= 1, got {num_classes!r}")
    if isinstance(src, Normalized) and mean is None:
        model = copy.deepcopy(src)  # already takes [0, 1] pixels and knows its normalisation
        old = dict(getattr(src, "info", {}) or {})
        mean_l, std_l = model.mean.flatten().tolist(), model.std.flatten().tolist()
        arch = old.get("arch") or _class_name(src.net)
    else:
        net = copy.deepcopy(src)
        try:
            if isinstance(mean, str) or isinstance(std, str):
                raise TypeError
            # no mean=/std=: no normalisation, whatever the channel count (recorded as [], one value per channel
            # otherwise: how many the data has is checked when it is seen, probe_model)
            mean_l = [] if mean is None else [float(v) for v in mean]
            std_l = [] if std is None else [float(v) for v in std]
        except (TypeError, ValueError):
            mean_l, std_l = [], [-1.0]
        if len(std_l) != len(mean_l) or (mean is not None and not mean_l) or \
                not all(math.isfinite(s) and s > 0 for s in std_l) or not all(math.isfinite(m) for m in mean_l):
            raise UserError(f"mean= and std= need one finite number per channel of the images (lists such as "
                            f"[0.485, 0.456, 0.406]) and std > 0, or neither for a model that takes [0, 1] images as "
                            f"they are; got mean={mean!r} std={std!r}")
        # identity: one 0 / 1 that broadcasts over any number of channels ((x - 0) / 1 is x, bit for bit)
        model = Normalized(net, mean_l or [0.0], std_l or [1.0])
        old, arch = {}, _class_name(src)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    # every call, not only the probe's two (the paper protocol calls .net directly); armed by complete_info
    model.output_check = watch_outputs(model.net)
    # a timm network knows its evaluation size and resize (used by registered datasets' transforms;
    # its normalisation is not guessed: that is mean=/std=)
    cfg = dict(getattr(model.net, "pretrained_cfg", None) or {})
    if mean is None and not isinstance(src, Normalized) and cfg.get("mean") is not None and (
            any(float(v) != 0.0 for v in cfg["mean"]) or any(float(v) != 1.0 for v in cfg.get("std", []))):
        warnings.warn(f"the model's timm config names mean={list(cfg['mean'])} std={list(cfg.get('std', []))}, but no "
                      f"mean=/std= was given: it gets [0, 1] pixels unnormalised; pass mean=/std= if it expects "
                      f"normalised input", stacklevel=3)
    model.info = {
        "model": name or (old.get("model") if old else None) or type(src).__name__,
        "arch": arch, "arch_kwargs": dict(old.get("arch_kwargs", {})),
        "num_classes": num_classes if num_classes is not None else old.get("num_classes"),
        "mean": mean_l, "std": std_l, "mean_given": mean is not None, "input_size": old.get("input_size") or _list(cfg.get("input_size")),
        "interpolation": old.get("interpolation") or cfg.get("interpolation"),
        "crop_pct": old.get("crop_pct") or cfg.get("crop_pct"),
        "crop_mode": old.get("crop_mode") or cfg.get("crop_mode") or "center",
        # the weights as they are now (a loaded model may have been fine-tuned since)
        "checkpoint": f"object:{_class_name(src)}", "checkpoint_sha256": _identity(model, mean is None and not
                                                                                    isinstance(src, Normalized)),
        "loaded_from": old.get("checkpoint"), "strict": True, "load_problems": [],
    }
    return model


def _identity(model: Normalized, unnormalised: bool) -> str:
    """The object's content hash. Without mean=/std= it is hashed as it was before the identity normalisation
    became one broadcast value (three zeros and ones then): the same weights keep their hash, and their run folders."""
    if not unnormalised:
        return state_sha256(model)
    return state_sha256(Normalized(model.net, [0.0] * 3, [1.0] * 3))


def _list(v: Any) -> Optional[List[Any]]:
    return list(v) if v is not None else None


def is_object(model: Any) -> bool:
    """Is this the copy of a caller's model object (not a registered model built for its data)?"""
    return str((getattr(model, "info", None) or {}).get("checkpoint") or "").startswith("object:")


def complete_info(model: Normalized, sample: torch.Tensor, device: torch.device, need_grad: bool = False,
                  second: Optional[torch.Tensor] = None) -> None:
    """Fill ``input_size`` and ``num_classes`` of a model object (or check a registered model on a
    caller's data), checking its output on a probe batch of two samples (``sample`` and ``second``, default ``sample`` twice): see
    :func:`input_checks.probe_model`."""
    info = model.info
    if info.get("input_size") is None:
        info["input_size"] = list(sample.shape)
    images = torch.stack([sample, sample if second is None else second]).float()
    info["num_classes"] = probe_model(model, images, device, info.get("num_classes"), need_grad)
    check = getattr(model, "output_check", None)
    if check is not None:
        check.arm(info["num_classes"])


class ObjectData(Dataset):
    """A data object as the runner's dataset: items in index order, ids = indices, content hash."""

    def __init__(self, base: Dataset, source: str, name: str, read_batch: int = 64, workers: int = 0) -> None:
        if isinstance(base, IterableDataset):
            raise UserError("data= must be indexable (a map-style Dataset, a DataLoader over one, or tensors (x, y)); "
                            "an IterableDataset has no stable sample ids")
        try:
            n = len(base)  # type: ignore[arg-type]
        except TypeError:
            raise UserError(f"data= ({type(base).__name__}) has no len(): give a map-style Dataset") from None
        if n == 0:
            raise UserError("data= is empty")
        self.base = base
        self.sample_ids: List[str] = [str(i) for i in range(n)]
        hx, hy = hashlib.sha256(), hashlib.sha256()  # images, labels: the same whatever the read batch
        max_label, shape, seen = -1, None, 0
        loader = DataLoader(_Items(base), batch_size=max(1, read_batch), shuffle=False, num_workers=workers)
        # every batch checked: a min/max and the labels (cheap next to hashing)
        for x, y in without_worker_traceback(loader):
            if shape is None:
                shape = list(x.shape[1:])
            check_range(x, "data=", offset=seen)
            check_labels(y, "data=", offset=seen)
            hx.update(x.contiguous().numpy().tobytes())
            hy.update(y.to(torch.int64).numpy().tobytes())
            max_label = max(max_label, int(y.max()))
            seen += len(y)
        self.content_sha256 = hashlib.sha256((hx.hexdigest() + hy.hexdigest()).encode()).hexdigest()
        self.max_label = max_label
        self.sample_shape = shape or []
        self.provenance: Dict[str, Any] = {"dataset": name, "source": source, "n": n, "sample_ids": "index",
                                           "content_sha256": self.content_sha256, "image_shape": self.sample_shape}

    def __len__(self) -> int:
        return len(self.sample_ids)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return _item(self.base[i], i)


class _Items(Dataset):
    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return _item(self.base[i], i)


def _item(item: Any, i: int) -> Tuple[torch.Tensor, int]:
    if not (isinstance(item, (tuple, list)) and len(item) >= 2):
        raise UserError(f"data= item {i} is a {type(item).__name__}; each item must be (image, label)")
    x, y = item[0], item[1]
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        raise UserError(f"data= item {i}: the image is a {type(x).__name__}; give a float tensor C x H x W in [0, 1] "
                        f"(e.g. torchvision.transforms.ToTensor() for a PIL image)")
    x = as_tensor(x, f"data= item {i}: the image")
    check_layout(x, f"data= item {i}: the image")
    return x.float(), _label(y, i)


def _label(y: Any, i: int) -> int:
    """One whole class index >= 0 (its upper bound is the model's: checked in ``prepare``)."""
    if isinstance(y, (torch.Tensor, np.ndarray)):
        if (y.size if isinstance(y, np.ndarray) else y.numel()) != 1:
            raise UserError(f"data= item {i}: the label has shape {tuple(y.shape)}; give one class index per image")
        y = y.item()
    if isinstance(y, (bool, np.bool_)) or not isinstance(y, (int, float, np.integer, np.floating)):
        raise UserError(f"data= item {i}: the label is {y!r}; give an integer class index")
    t = torch.tensor([float(y)]) if isinstance(y, (float, np.floating)) else torch.tensor([int(y)])
    check_labels(t, "data=", offset=i)
    return int(y)


def as_data(data: Any, name: str) -> Tuple[ObjectData, Dict[str, Any]]:
    """(the runner's dataset, settings taken from the object: ``batch_size``/``workers`` of a DataLoader)."""
    hints: Dict[str, Any] = {}
    if isinstance(data, DataLoader):
        if data.batch_size is not None:
            hints["batch_size"] = int(data.batch_size)
        hints["workers"] = int(data.num_workers)
        # its dataset, in index order: a shuffling sampler would give other ids on every pass
        return ObjectData(data.dataset, f"DataLoader over {type(data.dataset).__name__}", name,
                          hints.get("batch_size", 64), data.num_workers), hints
    if isinstance(data, Dataset):
        return ObjectData(data, f"Dataset {type(data).__name__}", name), hints
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, (torch.Tensor, np.ndarray))
                                                                  for t in data):
        x, y = as_tensor(data[0], "data=(x, y): x"), as_tensor(data[1], "data=(x, y): y")  # numpy: converted
        if x.dim() != 4 or y.dim() != 1 or len(x) != len(y):
            raise UserError(f"data=(x, y) needs x of shape (N, C, H, W) and y of shape (N,); "
                            f"got {tuple(x.shape)} and {tuple(y.shape)}")
        check_layout(x, "data=(x, y): x")
        return ObjectData(TensorDataset(x.detach().cpu(), y.detach().cpu()), "tensors", name), hints
    raise UserError(f"data= must be a torch Dataset of (image, label), a DataLoader, or tensors (x, y); "
                    f"got {type(data).__name__}")

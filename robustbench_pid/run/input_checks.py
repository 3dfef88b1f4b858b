"""Inputs checked where they enter (issue 23): images, labels and a model object's outputs.

Wrong inputs must not become numbers. Each check is cheap and ends in one ``UserError`` naming
the problem and the fix, before any record is written:

- images: float, NCHW, in [0, 1] on *every* batch (one ``aminmax`` per batch; the samples out of
  range are only located when the check fails);
- labels: whole class indices in [0, num_classes) (-1 "ignore" labels and float labels that
  ``int()`` would truncate are refused, not evaluated);
- a model object: one probe forward of two samples (outputs of shape (batch, classes), a float
  dtype, ``num_classes`` as given, a gradient path to the input when a gradient attack runs;
  ``mean``/``std`` one value per channel). Registered models are built for their data and skip it.

Also a user's eps (``--eps``, ``eps=``): an L-inf eps of 1 is refused (a typo for 1/255); an L2 radius below
``SMALL_L2`` runs with one note (an L-inf budget typed into an L2 attack).

Used by the data objects (``objects``: every read batch while hashing), by ``Context`` (every batch
a run reads, registered datasets included) and by ``rbp.attack``.
"""
from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..core.labels import eps_text
from ..errors import UserError

TOL = 1e-6  # [0, 1] up to float rounding of a transform
RANGE_FIX_OBJECT = ("pass images scaled to [0, 1] (0..255 pixels: x / 255); keep the normalisation out of the "
                    "data and give it as mean=/std= (wrapped in front of the model)")
RANGE_FIX_DATASET = "the dataset's images or transform give values outside [0, 1]: check the files and the transform"


def _ids(sample_ids: Optional[Sequence[Any]], mask: torch.Tensor, offset: int = 0) -> str:
    pos = mask.nonzero().flatten().tolist()
    names = [str(sample_ids[p]) if sample_ids is not None else str(offset + p) for p in pos[:5]]
    more = f" and {len(pos) - 5} more" if len(pos) > 5 else ""
    return f"{'sample' if len(pos) == 1 else f'{len(pos)} samples'} {', '.join(names)}{more}"


def as_tensor(v: Any, what: str) -> torch.Tensor:
    """A tensor, or a numpy array converted (sharing memory); anything else refused."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            raise UserError(f"{what} is a numpy array of Python objects; give numbers (np.stack the images first)")
        t = torch.from_numpy(np.ascontiguousarray(v))
        t._rbp_from_numpy = True  # type: ignore[attr-defined]  # so a fix is spelled for the caller's array
        return t
    raise UserError(f"{what} must be a torch tensor or a numpy array, got {type(v).__name__}")


def check_layout(x: torch.Tensor, what: str, channels: Optional[int] = None) -> None:
    """Float NCHW (batch) or CHW (one image); channels-last is refused with the permute that fixes it."""
    batched = x.dim() == 4
    if x.dim() not in (3, 4):
        shape = "(N, C, H, W)" if batched or x.dim() > 3 else "(C, H, W)"
        raise UserError(f"{what} has shape {tuple(x.shape)}; images must be {shape} float tensors in [0, 1]")
    c, last = x.shape[-3], x.shape[-1]
    looks_last = (last in (1, 3, 4) and c not in (1, 3, 4)) or (channels is not None and c != channels
                                                                   and last == channels)
    if looks_last:
        # the fix in the caller's own type: a numpy array has transpose(axes), not permute
        verb = "transpose" if getattr(x, "_rbp_from_numpy", False) else "permute"
        perm = f"x.{verb}(0, 3, 1, 2)" if batched else f"image.{verb}(2, 0, 1)"
        want = "(N, C, H, W)" if batched else "(C, H, W)"
        raise UserError(f"{what} has shape {tuple(x.shape)}, which looks channels-last (H, W, C last); images must "
                        f"be {want} with the channels first: pass {perm}")
    if not x.is_floating_point():
        fix = "x.astype(np.float32) / 255" if getattr(x, "_rbp_from_numpy", False) else "x.float() / 255"
        raise UserError(f"{what} is {x.dtype}; images must be float tensors in [0, 1]: for 0..255 pixels pass {fix}")


def check_range(x: torch.Tensor, what: str, sample_ids: Optional[Sequence[Any]] = None, offset: int = 0,
                fix: str = RANGE_FIX_OBJECT) -> None:
    """Images in [0, 1]: one min/max of the batch; NaN fails too."""
    if x.numel() == 0:
        return
    lo, hi = (float(v) for v in torch.aminmax(x.detach()))
    if lo >= -TOL and hi <= 1 + TOL:  # False for NaN
        return
    flat = x.detach().reshape(len(x), -1)
    bad = ((flat < -TOL) | (flat > 1 + TOL) | flat.isnan()).any(1)
    raise UserError(f"{what}: images must be in [0, 1], found values in [{lo:.4g}, {hi:.4g}] "
                    f"({_ids(sample_ids, bad, offset)}); {fix}")


def check_batch(dataset: Any, name: str, k: int, idx: Sequence[int], loaded: Any) -> Tuple[Sequence[int], Any, Any]:
    """Batch ``k`` (from 1) of a run's loader pass as (positions, images, labels), checked complete and its images
    in [0, 1] (one min/max per batch, on the host: every batch, not the first only, before any of its records
    exist)."""
    x, y = loaded
    if len(y) != len(idx):
        raise RuntimeError(f"data loader returned {len(y)} of {len(idx)} samples of batch {list(idx[:3])}...")
    if isinstance(x, torch.Tensor):  # else --decode gpu: file bytes, decoded later as uint8 / 255, in [0, 1]
        ids = getattr(dataset, "sample_ids", None)
        check_range(x, f"dataset {name!r}, batch {k} (positions {idx[0]}..{idx[-1]})",
                    [ids[i] for i in idx] if ids is not None else idx,
                    fix=RANGE_FIX_OBJECT if hasattr(dataset, "content_sha256") else RANGE_FIX_DATASET)  # data=
    return idx, x, y


def check_labels(y: torch.Tensor, what: str, num_classes: Optional[int] = None,
                 sample_ids: Optional[Sequence[Any]] = None, offset: int = 0) -> None:
    """Whole class indices in [0, num_classes) (upper bound only when ``num_classes`` is known)."""
    if y.numel() == 0:
        return
    if y.dtype == torch.bool or y.is_complex():
        raise UserError(f"{what}: labels are {y.dtype}; give integer class indices")
    if y.is_floating_point():
        frac = (y != y.round()) | ~torch.isfinite(y)
        if bool(frac.any()):
            v = y[frac][0].item()
            where = _ids(sample_ids, frac, offset)
            raise UserError(f"{what}: labels must be whole class indices, found {v:g} ({where}); "
                            f"they would be truncated to another class: give integer labels (y.long() once they are "
                            f"whole numbers)")
    neg = y < 0
    if bool(neg.any()):
        v = y[neg][0].item()
        rng = f"0..{num_classes - 1}" if num_classes else "0, 1, 2, ..."
        raise UserError(f"{what}: labels must be class indices {rng}, found {v:g} ({_ids(sample_ids, neg, offset)}); a "
                        f"negative ('ignore') label is not a class: drop or relabel those samples")
    if num_classes is not None:
        big = y >= num_classes
        if bool(big.any()):
            v = y[big][0].item()
            raise UserError(f"{what}: labels must be class indices 0..{num_classes - 1} (the model has {num_classes} "
                            f"outputs), found {v:g} ({_ids(sample_ids, big, offset)}); give labels for this model's "
                            f"classes, or a model with a matching head")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n")[0]
    return f"{type(exc).__name__}: {text[:200]}"


def probe_model(model: Any, images: torch.Tensor, device: torch.device, num_classes: Optional[int] = None,
                need_grad: bool = False) -> int:
    """One forward of ``images`` (2 samples, NCHW, [0, 1]) through a model object; returns its classes.

    Refuses outputs that are not float logits of shape (batch, classes), a ``num_classes`` the
    output contradicts, ``mean``/``std`` of another channel count than the images and, when
    ``need_grad``, an output without a gradient path to the input (a detach inside ``forward``).
    """
    info = getattr(model, "info", {}) or {}
    c = int(images.shape[1])
    mean = info.get("mean") or []  # [] : no normalisation (a model object without mean=/std=)
    if mean and len(mean) != c:
        if info.get("mean_given"):  # the caller's mean=/std= (a model's own normalisation names its channels)
            raise UserError(f"mean=/std= have {len(mean)} value(s) but the images have {c} channel(s): give one value "
                            f"per channel of the images (the normalisation the model was trained with), or leave "
                            f"mean=/std= out for a model that takes [0, 1] images as they are")
        fix = " (grayscale to RGB: x.repeat(1, 3, 1, 1))" if (c, len(mean)) == (1, 3) else ""
        raise UserError(f"the model's normalisation (mean=/std=) has {len(mean)} values but the images have {c} "
                        f"channel(s): model {info.get('model')!r} takes {len(mean)}-channel images; give it "
                        f"{len(mean)}-channel images{fix}, or a model built for {c}-channel ones")
    x = images.to(device).float()
    if need_grad:
        x.requires_grad_(True)
    try:
        with torch.enable_grad() if need_grad else torch.inference_mode():
            out = model(x)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's module: say what it was given
        raise UserError(f"the model failed on a batch of shape {tuple(x.shape)} (N, C, H, W, float in [0, 1]) with "
                        f"{_first_line(exc)}; give images with the channel count and size the model expects "
                        f"(channels first), or fix the model") from None
    shape = tuple(getattr(out, "shape", ()))
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != len(x):
        raise UserError(f"the model returned {type(out).__name__} {shape} for a batch of {len(x)} images; it must "
                        f"return logits of shape (batch, classes) = ({len(x)}, C), one row per image (return the "
                        f"logits tensor itself, not a tuple/dict or a pooled/flattened output)")
    if not out.is_floating_point():
        raise UserError(f"the model returned {out.dtype} outputs; it must return float logits (the scores before "
                        f"argmax), not class indices or rounded values")
    classes = int(out.shape[1])
    if num_classes is not None and num_classes != classes:
        raise UserError(f"num_classes={num_classes} but the model outputs {classes} classes; drop num_classes= "
                        f"(it is read from the output) or give the model with the matching head")
    if need_grad and (not out.requires_grad or out.grad_fn is None):
        raise UserError("the model's output has no gradient with respect to its input (a .detach(), .numpy(), "
                        "torch.no_grad() or integer step inside forward); gradient attacks need it: remove it, or "
                        "run only gradient-free attacks (square, spsa, noise)")
    return classes


class OutputCheck:
    """A forward hook on the copy of a model object: *every* output is float logits (batch, classes), with as many
    classes as the first. The probe sees two calls; a model that returns a tuple, another shape or another head
    later (a call counter, a mode switch inside ``forward``) failed deep inside an attack with a traceback."""

    def __init__(self) -> None:
        self.calls = 0
        self.classes: Optional[int] = None
        self.armed = False  # from the end of the probe on (the probe says what is wrong with its own calls)

    def arm(self, classes: int) -> None:
        self.armed, self.classes = True, int(classes)

    def __call__(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self.calls += 1
        if not self.armed:
            return
        x = args[0] if isinstance(args, tuple) and args else None
        n = len(x) if isinstance(x, torch.Tensor) and x.dim() > 0 else None
        ok = isinstance(out, torch.Tensor) and out.dim() == 2 and out.is_floating_point() and \
            (n is None or out.shape[0] == n) and (self.classes is None or out.shape[1] == self.classes)
        if ok:
            self.classes = int(out.shape[1])
            return
        got = (f"{type(out).__name__} {tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else
               type(out).__name__)
        before = f" (its earlier calls returned (batch, {self.classes}) logits)" if self.classes is not None else ""
        raise UserError(f"the model returned {got} on forward call {self.calls} for a batch of {n}{before}; it must "
                        f"return float logits of shape (batch, classes) on every call, the same classes each time "
                        f"(return the logits tensor itself, not a tuple/dict, whatever its call count or mode)")


def watch_outputs(net: torch.nn.Module) -> OutputCheck:
    """Check every forward output of ``net`` (a copy of a caller's module) with :class:`OutputCheck`, once armed."""
    check = OutputCheck()
    net.register_forward_hook(check)
    return check


def meta_tensors(module: torch.nn.Module) -> bool:
    """Does the module hold parameters or buffers without data (the meta device)?"""
    return any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))


# --- a user's eps (--eps, eps=): values accepted but almost surely not meant ---

SMALL_L2 = 0.1  # below every L2 radius in use (RobustBench CIFAR 0.5, AutoAttack's 0.25 / 0.5 / 1.0, ImageNet 3.0)


def small_l2_note(cls: Any, grid: List[Optional[float]]) -> None:
    """One ``note:`` line for L2 radii below ``SMALL_L2``: most likely an L-inf budget typed in L2 units (8/255 is
    about 1/16 of RobustBench's 0.5), which runs and reports a robust accuracy near the clean one. Still run: a small
    L2 radius is legitimate."""
    small = [e for e in grid if e is not None and cls.norm == "l2" and e < SMALL_L2]
    if small:
        given = ", ".join(f"{eps_text(e, 'linf')} = {e:.4g}" if "/" in eps_text(e, "linf") else f"{e:g}" for e in small)
        print(f"note: --attack {cls.name} --eps {given}: an L2 radius well below the usual ones (0.25 / 0.5 / 1.0 on "
              f"CIFAR, 3.0 on ImageNet); L2 radii are plain numbers in pixel units, not k/255 steps: for RobustBench's "
              f"CIFAR-10 L2 budget write --eps 0.5. Running it as given.", file=sys.stderr)


def check_user_eps(cls: Any, eps: Optional[float]) -> None:
    """An L-inf eps of 1 lets an attack replace the image by any other: a typo for 1/255, not a budget (the
    unbounded run that checks attacks is ``--indicators``' own, not an eps)."""
    if eps is not None and cls.norm == "linf" and eps == cls.eps_max:  # above it: the attack says "exceeds"
        raise UserError(f"attack {cls.name!r}: eps {eps:g} spans the whole pixel range [0, 1] (any image can be "
                        f"reached); did you mean {eps:g}/255? (--indicators adds an unbounded check run itself)")

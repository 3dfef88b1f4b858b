"""RobustBench's model zoo as a model source: ``--model robustbench:NAME`` (L-inf) or ``robustbench:L2/NAME`` /
``robustbench:corruptions/NAME``, on ``--dataset cifar10``, ``cifar100`` or ``imagenet`` (and its variants).

The model is built and its checkpoint loaded by RobustBench's own ``robustbench.utils.load_model`` (the pinned
release, ``hub/robustbench_pkg.py``), so its architecture, its key renames and its input normalisation are the
entry's own; it takes [0, 1] images, as RobustBench's models do. The checkpoint is read from a local folder in
RobustBench's ``model_dir`` layout, ``<dir>/<dataset>/<threat>/<NAME>.pt`` (``--checkpoint-dir DIR``, default
``./models`` as RobustBench's), or from ``--checkpoint FILE``; a missing file is one error naming the path,
never a download. The file is read tensors-only (``torch.load(weights_only=True)``) unless ``--allow-pickle``.
Identity in the records: the entry (``robustbench:THREAT/NAME``) and the file's sha256.
"""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch

from ..errors import CheckpointError, UserError
from ..hub import sniff
from ..runtime.third_party import quietly
from .wrapper import Normalized

PREFIX = "robustbench:"
THREATS = ("Linf", "L2", "corruptions")
DATASETS = ("cifar10", "cifar100", "imagenet")  # RobustBench's BenchmarkDataset values
DEFAULT_DIR = "./models"  # RobustBench's own default model_dir


@dataclass(frozen=True)
class Entry:
    """One RobustBench entry: its name, threat model and dataset (RobustBench's spellings)."""

    name: str
    threat: str
    dataset: str

    @property
    def alias(self) -> str:
        return f"{PREFIX}{self.name}" if self.threat == "Linf" else f"{PREFIX}{self.threat}/{self.name}"

    def layout_path(self, root: os.PathLike) -> Path:
        return Path(root) / self.dataset / self.threat / f"{self.name}.pt"


def is_robustbench(model: str) -> bool:
    return isinstance(model, str) and model.startswith(PREFIX)


def parse(model: str, dataset_family: str) -> Entry:
    """``robustbench:[THREAT/]NAME`` on a dataset family, checked (no package needed)."""
    rest = model[len(PREFIX):]
    threat, _, name = rest.rpartition("/")
    threat = threat or "Linf"
    if threat not in THREATS:
        raise UserError(f"--model {model}: unknown RobustBench threat model {threat!r}; use robustbench:NAME (L-inf), "
                        f"robustbench:L2/NAME or robustbench:corruptions/NAME")
    if not name or "/" in name or name in (".", ".."):
        raise UserError(f"--model {model}: expected robustbench:NAME or robustbench:THREAT/NAME, e.g. "
                        f"robustbench:Standard or robustbench:L2/Rony2019Decoupling")
    if dataset_family not in DATASETS:
        raise UserError(f"--model {model}: RobustBench's models are for {', '.join(DATASETS)} (and ImageNet's "
                        f"variants), not {dataset_family!r}; pass --dataset cifar10, cifar100 or imagenet")
    return Entry(name, threat, dataset_family)


def checkpoint_file(entry: Entry, checkpoint: Optional[str], checkpoint_dir: Optional[str]) -> Path:
    """The entry's checkpoint file: ``checkpoint``, else the layout under ``checkpoint_dir`` (default ./models)."""
    path = Path(checkpoint).expanduser() if checkpoint else entry.layout_path(checkpoint_dir or DEFAULT_DIR)
    if not path.is_file():
        where = "--checkpoint" if checkpoint else f"--checkpoint-dir {checkpoint_dir or DEFAULT_DIR}"
        raise CheckpointError(f"{entry.alias} ({entry.dataset}): no checkpoint file at {path} ({where}); put "
                              f"RobustBench's file there (robustbench.utils.load_model('{entry.name}', "
                              f"model_dir=DIR, dataset='{entry.dataset}', threat_model='{entry.threat}') on a "
                              f"machine with internet writes it to DIR/{entry.dataset}/{entry.threat}/{entry.name}.pt)")
    return path


@contextlib.contextmanager
def _weights_only(allow_pickle: bool) -> Iterator[None]:
    """robustbench calls ``torch.load`` without ``weights_only``: during its load, pass it explicitly (tensors
    only unless the user opted in), whatever this torch's default."""
    original = torch.load
    torch.load = functools.partial(original, weights_only=not allow_pickle)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.load = original  # type: ignore[assignment]


@contextlib.contextmanager
def _layout(entry: Entry, path: Path, checkpoint_dir: Optional[str]) -> Iterator[Path]:
    """A model_dir in RobustBench's layout holding ``path``: the given dir when the file is already there, else a
    temporary one linking to it (robustbench's loader takes a folder, not a file)."""
    if checkpoint_dir is not None and entry.layout_path(checkpoint_dir).resolve() == path.resolve():
        yield Path(checkpoint_dir)
        return
    if entry.layout_path(DEFAULT_DIR).resolve() == path.resolve() and checkpoint_dir is None:
        yield Path(DEFAULT_DIR)
        return
    with tempfile.TemporaryDirectory(prefix="rbp-robustbench-") as tmp:
        link = entry.layout_path(tmp)
        link.parent.mkdir(parents=True)
        os.symlink(path.resolve(), link)
        yield Path(tmp)


def entries(entry: Entry) -> List[str]:
    """The names the pinned release has for (dataset, threat)."""
    from robustbench.model_zoo import model_dicts  # imported by import_robustbench
    from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel

    return list(model_dicts[BenchmarkDataset(entry.dataset)][ThreatModel(entry.threat)])


@quietly
def load_robustbench(model: str, dataset: str, checkpoint: Optional[str] = None,
                     checkpoint_dir: Optional[str] = None, allow_pickle: bool = False,
                     package_cache: Optional[str] = None, plan: bool = False) -> Normalized:
    """RobustBench's model for ``model`` (``robustbench:[THREAT/]NAME``) on ``dataset``, in eval mode, taking [0, 1]
    images, with provenance in ``.info`` (see the module docstring). ``plan``: a dry run's model; without the
    checkpoint file the entry's architecture untrained (``info["planned_without_weights"]``: a pass costs the same)."""
    from ..data import dataset_info
    from ..hub.download import sha256_of
    from ..hub.robustbench_pkg import ROBUSTBENCH, import_robustbench

    info = dataset_info(dataset)
    entry = parse(model, info.family)
    utils = import_robustbench(package_cache)
    names = entries(entry)
    if entry.name not in names:
        import difflib

        close = difflib.get_close_matches(entry.name, names, n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UserError(f"RobustBench ({ROBUSTBENCH.requirement}) has no {entry.dataset} {entry.threat} entry "
                        f"{entry.name!r}.{hint} It has {len(names)}: {', '.join(names[:8])}, ...")
    lower = f"{entry.name.lower().replace('-', '_')}_{entry.dataset}_{entry.threat.lower()}"
    import timm

    if timm.is_model(lower):
        raise UserError(f"{entry.alias}: RobustBench loads this entry from timm's hub ({lower}, pretrained=True), "
                        f"which downloads; it is not supported offline here")
    from robustbench.model_zoo import model_dicts
    from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel

    spec = model_dicts[BenchmarkDataset(entry.dataset)][ThreatModel(entry.threat)][entry.name]
    if isinstance(spec.get("gdrive_id"), list):
        raise UserError(f"{entry.alias} is an ensemble of {len(spec['gdrive_id'])} checkpoint files; only "
                        f"single-file entries are supported")
    try:
        path = checkpoint_file(entry, checkpoint, checkpoint_dir)
    except CheckpointError:
        if not plan:
            raise
        net = spec["model"]()
        wrapped = _wrap(net, entry, info.num_classes, None, "")
        wrapped.info["planned_without_weights"] = True
        return wrapped
    gdrive = f" (RobustBench's loader fetches it from Google Drive id {spec['gdrive_id']})" if spec.get("gdrive_id") else ""
    sniff.check(path, how=f"with robustbench.utils.load_model('{entry.name}', model_dir=DIR, dataset='{entry.dataset}', "
                          f"threat_model='{entry.threat}') on a machine with internet{gdrive}")
    try:
        with _layout(entry, path, checkpoint_dir) as model_dir, _weights_only(allow_pickle):
            net = utils.load_model(entry.name, model_dir=str(model_dir), dataset=entry.dataset,
                                   threat_model=entry.threat)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a foreign loader: one line naming the file and the cause
        lead = f"{entry.alias}: RobustBench's loader could not load"
        if sniff.is_read_failure(exc):  # torch.load's: objects refused (the pickle advice) or damage (never it)
            raise sniff.read_failure(path, exc, allow_pickle, lead) from None
        first = str(exc).strip().split("\n")[0][:300]
        raise CheckpointError(f"{lead} {path}: {type(exc).__name__}: {first}") from None
    return _wrap(net, entry, info.num_classes, path, sha256_of(path))


def _wrap(net: torch.nn.Module, entry: Entry, num_classes: int, path: Optional[Path], sha: str) -> Normalized:
    """The entry's module behind an identity :class:`Normalized` (it takes [0, 1] images and normalises inside,
    if it does), in eval mode, frozen, with its provenance."""
    wrapped = Normalized(net, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    wrapped.net.num_classes = num_classes  # type: ignore[attr-defined]
    wrapped.info = _info(entry, num_classes, entry.dataset == "imagenet", path, sha, type(net).__name__)
    wrapped.eval()
    for p in wrapped.parameters():
        p.requires_grad_(False)
    return wrapped


def _info(entry: Entry, num_classes: int, imagenet: bool, path: Optional[Path], sha: str, cls: str
          ) -> Dict[str, Any]:
    from ..hub.robustbench_pkg import ROBUSTBENCH

    return {
        "model": entry.alias,
        "arch": f"{entry.alias} ({cls}, {ROBUSTBENCH.requirement})",
        "arch_kwargs": {},
        "num_classes": num_classes,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
        # RobustBench's ImageNet preprocessing: Resize(256) + CenterCrop(224), bilinear; CIFAR: the 32 x 32 images
        "input_size": [3, 224, 224] if imagenet else [3, 32, 32],
        "interpolation": "bilinear",
        "crop_pct": 0.875 if imagenet else 1.0,
        "crop_mode": "center",
        "checkpoint": None if path is None else str(path),
        "checkpoint_sha256": sha or None,
        "checkpoint_name": entry.alias,
        "checkpoint_published_hash": "",
        "load_problems": [],
    }

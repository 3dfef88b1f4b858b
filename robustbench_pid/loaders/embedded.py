"""``embedded:NAME``: a checkpoint shipped in ``checkpoints/``, verified against its sha256."""
from __future__ import annotations

from safetensors.torch import load_file as st_load

from ..hub.checkpoints import checkpoints_dir, manifest_entry
from ..errors import CheckpointError
from . import Loaded, loaders, sha256_file


@loaders.register("embedded")
def load_embedded(name: str, *, allow_pickle: bool = False) -> Loaded:
    entry = manifest_entry(name)
    path = checkpoints_dir() / entry["file"]
    if not path.is_file():
        raise CheckpointError(f"embedded checkpoint file missing: {path} (re-create it with `robustbench-pid train`)")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise CheckpointError(
            f"{path}: sha256 {digest} does not match the manifest ({entry['sha256']}); the file is corrupt or "
            f"was changed without `robustbench-pid train` updating the manifest"
        )
    return Loaded(st_load(str(path), device="cpu"), str(path), digest, "embedded", made_for=entry["arch"],
                  trained_with=dict(entry.get("arch_kwargs") or {}))

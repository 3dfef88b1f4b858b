"""``embedded:NAME``: a checkpoint shipped in ``checkpoints/``, verified against its sha256."""
from __future__ import annotations

from safetensors.torch import load_file as st_load

from ..hub.checkpoints import checkpoints_dir, manifest_entry
from ..errors import CheckpointError
from ..hub import sniff
from . import Loaded, loaders, sha256_file

RESTORE = "restore the shipped checkpoints (`git checkout -- checkpoints/`, or reinstall the package)"


@loaders.register("embedded")
def load_embedded(name: str, *, allow_pickle: bool = False) -> Loaded:
    entry = manifest_entry(name)
    path = checkpoints_dir() / entry["file"]
    if not path.is_file():
        raise CheckpointError(f"embedded checkpoint file missing: {path}; {RESTORE}")
    sniff.check(path, fix=RESTORE[0].upper() + RESTORE[1:])  # a clone without Git LFS leaves pointers
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise CheckpointError(
            f"{path}: sha256 {digest} does not match the manifest ({entry['sha256']}); the file is corrupt or "
            f"was changed by hand; {RESTORE}"
        )
    try:
        state = st_load(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001 - a file that matches a hand-updated hash but is no safetensors file
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(exc).splitlines()[0][:160]}), although "
                              f"the manifest's sha256 matches it (the manifest was edited to fit); {RESTORE}") from None
    return Loaded(state, str(path), digest, "embedded", made_for=entry["arch"],
                  trained_with=dict(entry.get("arch_kwargs") or {}))

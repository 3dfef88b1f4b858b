"""``timm:NAME[.TAG]``: the pretrained weights timm publishes for a model, fetched from the Hugging Face hub.

The file is downloaded with ``huggingface_hub`` (its cache, its offline switch ``HF_HUB_OFFLINE``)
and then read exactly like a local file (safetensors first, pickles with ``weights_only=True``), so
it gets the same safety rules and the same sha256 provenance. Weights that timm hosts only at a
plain URL go through ``torch.hub``'s download cache. Offline or unreachable: one clear error naming
the file to fetch elsewhere and the ``--checkpoint PATH`` to pass instead.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

from ..errors import CheckpointError
from ..hub import sniff
from . import Loaded, loaders

HUB_FILES = ("model.safetensors", "pytorch_model.bin")


def _offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it only once, at import)."""
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    if env in ("1", "ON", "YES", "TRUE"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:  # noqa: BLE001
        return False


def _cfg(name: str) -> Any:
    import timm
    from timm.models import get_pretrained_cfg

    arch = name.split(".")[0]
    if not timm.is_model(arch):
        raise CheckpointError(f"timm:{name}: timm has no model {arch!r} (list them with "
                              f"`python -c \"import timm; print(timm.list_models(pretrained=True))\"`)")
    cfg = get_pretrained_cfg(name)
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        tags = [t for t in timm.list_pretrained(f"{arch}*") if t.split(".")[0] == arch]
        raise CheckpointError(f"timm:{name}: timm publishes no pretrained weights under that name"
                              + (f"; available: {', '.join(tags)}" if tags else ""))
    return cfg


def _unreachable(name: str, cfg: Any, reason: str) -> CheckpointError:
    where: List[str] = []
    if cfg.hf_hub_id:
        files = [cfg.hf_hub_filename] if cfg.hf_hub_filename else list(HUB_FILES[:1])
        where.append(f"`hf download {cfg.hf_hub_id} {files[0]}` (https://huggingface.co/{cfg.hf_hub_id})")
    if cfg.url:
        where.append(cfg.url)
    return CheckpointError(
        f"timm:{name}: cannot fetch the pretrained weights ({reason}). Nothing is downloaded when the hub is "
        f"unreachable; on a machine with internet access fetch " + " or ".join(where)
        + ", copy the file here and pass it instead: --checkpoint /path/to/the/file (.safetensors/.pth/.bin)"
    )


def _dns_problem() -> str:
    """Fail fast when the hub's host does not even resolve (instead of minutes of HTTP retries)."""
    import socket
    from urllib.parse import urlparse

    try:
        from huggingface_hub import constants

        host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    except Exception:  # noqa: BLE001
        host = "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        return f"the hub host {host} does not resolve ({exc}); no network?"
    return ""


def _from_hub(name: str, cfg: Any) -> Path:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except Exception as exc:  # noqa: BLE001
        raise _unreachable(name, cfg, f"huggingface_hub is not usable: {exc}") from None
    offline = _offline()
    dns = "" if offline else _dns_problem()
    offline = offline or bool(dns)  # no network: the local cache may still have the file
    files = [cfg.hf_hub_filename] if cfg.hf_hub_filename else list(HUB_FILES)
    last: Optional[BaseException] = None
    for fname in files:
        try:
            return Path(hf_hub_download(cfg.hf_hub_id, fname, local_files_only=offline))
        except LocalEntryNotFoundError as exc:  # (a subclass of EntryNotFoundError) not cached / no network
            last = exc
            if offline:
                continue  # the other file name may be cached
            break
        except EntryNotFoundError as exc:  # this repo has the other file format
            last = exc
            continue
        except Exception as exc:  # noqa: BLE001 - offline, no cache, DNS, HTTP: all mean "not reachable"
            last = exc
            if offline:
                continue  # the other file name may be cached
            break
    reason = (f"{dns}, and the file is not in the local cache" if dns else
              "offline mode (HF_HUB_OFFLINE=1) and the file is not in the local cache" if offline
              else f"{type(last).__name__}: {str(last).splitlines()[0] if last and str(last) else 'no detail'}")
    raise _unreachable(name, cfg, reason)


def _from_url(name: str, cfg: Any) -> Path:
    """torch.hub's cache, with torch.hub's rule: a file named ``NAME-<hex>.ext`` must have a sha256 starting
    with ``<hex>``; checked on every use, a cached file included, before it is read."""
    import re

    import torch

    from . import sha256_file

    target = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(cfg.url.split("?")[0])
    m = re.search(torch.hub.HASH_REGEX, target.name)
    prefix = m.group(1) if m else None
    if not target.is_file():
        if _offline():
            raise _unreachable(name, cfg, "offline mode (HF_HUB_OFFLINE=1) and the file is not in torch.hub's cache")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(cfg.url, str(target), hash_prefix=prefix, progress=False)
        except Exception as exc:  # noqa: BLE001
            raise _unreachable(name, cfg, f"{type(exc).__name__}: {exc}") from None
    if prefix and not sha256_file(target).startswith(prefix):
        sniff.check(target, how=f"(delete it; the next run downloads {cfg.url})")  # a page saved in its place
        raise CheckpointError(f"{target}: its sha256 does not start with {prefix}, the hash prefix in its name "
                              f"(timm {name!r}); the file is not the published one and was not read. Delete it "
                              f"and run again to download it, or pass --checkpoint PATH")
    return target


@loaders.register("timm")
def load_timm(name: str, *, allow_pickle: bool = False) -> Loaded:
    from .file import load_file

    cfg = _cfg(name)
    path = _from_hub(name, cfg) if cfg.hf_hub_id else _from_url(name, cfg)
    got = load_file(str(path), allow_pickle=allow_pickle)
    origin = f"timm pretrained {cfg.hf_hub_id or cfg.url}"
    return Loaded(got.state_dict, got.path, got.sha256, "timm", got.wrapper, (origin,) + got.notes)

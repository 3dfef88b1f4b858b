"""The ``robustbench`` package (RobustBench's model zoo and loader), pinned and imported beside this project.

Why not ``pip install robustbench``: its PyPI release (1.1.1) pins ``timm==1.0.9`` and ``gdown==5.1.0`` (this
project needs timm >= 1.0.15), so pip either refuses the environment or downgrades timm; and torchattacks 3.5.1,
already a dependency, ships an old copy of ``robustbench`` inside its own wheel (files under
site-packages/robustbench owned by torchattacks' RECORD), which a real install would overwrite. Instead:

- the pinned wheel is downloaded as a file (``hub/pypi.py``: the index's JSON simple API, kept only at the sha256
  pinned here; ``robustbench-pid fetch robustbench-package``), and its ``robustbench/`` folder is extracted into a
  private folder in the user cache (``$ROBUSTBENCH_PID_PACKAGES``, else ``$XDG_CACHE_HOME/robustbench_pid/packages``);
- :func:`import_robustbench` imports it from there ahead of anything on ``sys.path`` (so torchattacks' copy is never
  the one used), and refuses when another ``robustbench`` was imported first in the process;
- what its import needs and this environment lacks is shimmed, each shim doing only what robustbench calls:
  ``pkg_resources`` (setuptools >= 81 no longer has it; robustbench calls ``resource_filename`` only),
  ``autoattack`` (no PyPI package installs that name; pyautoattack, a dependency, installs the AutoAttack authors'
  code as ``pyautoattack``), and
  ``gdown``, whose stand-in refuses to download: a missing checkpoint is the caller's one-line error, never a
  download from Google Drive. geotorch and torchdiffeq (imported by one architecture at robustbench's import) are real
  packages: the ``robustbench`` extra (``pip install -e ".[robustbench]"``).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any, Optional

from ..errors import UserError
from ..runtime.third_party import quietly
from .download import user_cache
from .pypi import Pin, PinnedFileError, download

ROBUSTBENCH = Pin("robustbench==1.1.1", "robustbench-1.1.1-py3-none-any.whl",
                  "1286e83d04eb8f21d787d9d21f39f8d6ec7ed02e1755684dd6b931b976c2017c", sdist=False)
ENV_PACKAGES = "ROBUSTBENCH_PID_PACKAGES"
MARKER = "PINNED_WHEEL_SHA256"  # written last into an extracted folder: present = complete and from the pinned wheel
NEEDS = ("geotorch", "torchdiffeq")  # the ``robustbench`` extra


def packages_dir(path: Optional[os.PathLike] = None) -> Path:
    """``path``, else ``$ROBUSTBENCH_PID_PACKAGES``, else the user cache dir (XDG convention)."""
    return user_cache("packages", path, ENV_PACKAGES)


def package_dir(cache: Optional[os.PathLike] = None) -> Path:
    """The folder the pinned release is extracted into (holding ``robustbench/``)."""
    return packages_dir(cache) / ROBUSTBENCH.requirement.replace("==", "-")


def installed(cache: Optional[os.PathLike] = None) -> Optional[Path]:
    """The extracted folder if it is complete and from the pinned wheel, else None."""
    d = package_dir(cache)
    marker = d / MARKER
    if marker.is_file() and marker.read_text().strip() == ROBUSTBENCH.sha256 and (d / "robustbench").is_dir():
        return d
    return None


def fetch_package(cache: Optional[os.PathLike] = None, index_url: Optional[str] = None) -> Path:
    """Download the pinned wheel (or reuse it, re-hashed) and extract its ``robustbench/`` folder; the folder
    appears complete or not at all (extracted beside it, then renamed)."""
    done = installed(cache)
    if done is not None:
        return done
    root = packages_dir(cache)
    root.mkdir(parents=True, exist_ok=True)
    wheel = download(ROBUSTBENCH, root, index_url)
    final = package_dir(cache)
    with tempfile.TemporaryDirectory(dir=root, prefix=".extract-") as tmp:
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                parts = Path(member).parts
                if not parts or parts[0] != "robustbench" or ".." in parts or Path(member).is_absolute():
                    continue  # only the package itself, never a path outside the folder
                z.extract(member, tmp)
        if not (Path(tmp) / "robustbench" / "__init__.py").is_file():
            raise PinnedFileError(f"{wheel} has no robustbench/__init__.py: not the robustbench wheel")
        (Path(tmp) / MARKER).write_text(ROBUSTBENCH.sha256 + "\n")
        if final.exists():
            shutil.rmtree(final)  # an incomplete earlier extraction (no marker)
        os.replace(tmp, final)
        os.makedirs(tmp)  # TemporaryDirectory removes its own name on exit
    return final


def missing_package_message(cache: Optional[os.PathLike] = None) -> str:
    return (f"RobustBench's package ({ROBUSTBENCH.requirement}) is not in {package_dir(cache)}: run `robustbench-pid "
            f"fetch robustbench-package` once (downloads the pinned wheel {ROBUSTBENCH.file} from PyPI, sha256 "
            f"{ROBUSTBENCH.sha256[:12]}..., and extracts it there; pip is not used, see docs/models.md)")


@quietly
def import_robustbench(cache: Optional[os.PathLike] = None) -> Any:
    """``robustbench.utils`` from the pinned, extracted release (see the module docstring). One ``error:`` line
    when the release is not fetched, the extra is not installed, or another robustbench is already imported."""
    d = installed(cache)
    if d is None:
        raise UserError(missing_package_message(cache))
    lacking = [m for m in NEEDS if m not in sys.modules and importlib.util.find_spec(m) is None]
    if lacking:
        raise UserError(f"RobustBench's package imports {', '.join(lacking)}, not installed here: "
                        f"pip install -e \".[robustbench]\" (or pip install {' '.join(lacking)})")
    loaded = sys.modules.get("robustbench")
    if loaded is not None:
        where = Path(getattr(loaded, "__file__", "") or "")
        if d not in where.parents:
            raise UserError(f"another robustbench ({where}) was imported in this process before the pinned release "
                            f"in {d}; load robustbench: models in a fresh process (torchattacks ships an old copy "
                            f"of robustbench inside its own wheel)")
        return importlib.import_module("robustbench.utils")
    _shims()
    sys.path.insert(0, str(d))
    try:
        utils = importlib.import_module("robustbench.utils")
    finally:
        sys.path.remove(str(d))  # imported modules keep working; later submodule imports use the package's __path__
    return utils


def _shims() -> None:
    """Stand-ins for modules robustbench imports that this environment lacks (see the module docstring)."""
    if "pkg_resources" not in sys.modules and importlib.util.find_spec("pkg_resources") is None:
        pr = types.ModuleType("pkg_resources")

        def resource_filename(package: str, resource: str) -> str:
            from importlib import resources

            mod = sys.modules.get(package)
            base = package if mod is not None and hasattr(mod, "__path__") else package.rpartition(".")[0]
            return str(resources.files(base) / resource)

        pr.resource_filename = resource_filename  # type: ignore[attr-defined]
        sys.modules["pkg_resources"] = pr
    if "autoattack" not in sys.modules and importlib.util.find_spec("autoattack") is None:
        import pyautoattack
        import pyautoattack.state

        sys.modules["autoattack"] = pyautoattack
        sys.modules["autoattack.state"] = pyautoattack.state
    if "gdown" not in sys.modules and importlib.util.find_spec("gdown") is None:
        g = types.ModuleType("gdown")

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise UserError("robustbench tried to download a checkpoint (gdown); this project loads RobustBench "
                            "checkpoints only from local files: put the file in the layout "
                            "<dir>/<dataset>/<threat>/<NAME>.pt")

        g.download = refuse  # type: ignore[attr-defined]
        sys.modules["gdown"] = g

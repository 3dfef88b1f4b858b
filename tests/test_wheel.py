"""A wheel install (not ``-e``) runs the README job: the suites and embedded checkpoints ship as
package data. The wheel goes into a fresh virtual environment that sees the heavy dependencies
through a ``.pth`` line naming this interpreter's site-packages (a path line: the ``.pth`` files in
that folder, the editable install's finder among them, are not processed), and ``evaluate`` runs
from a folder outside the checkout; its numbers equal the same command run from the checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
JOB = ["--model", "pid_deit", "--attack", "fgsm", "--limit", "8", "--quiet", "--device", "cpu"]


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _run(argv: List[str], cwd: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{argv}\n{p.stdout}\n{p.stderr}"
    return p


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of the sources, so the checkout gets no build/ or egg-info folders."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("robustbench_pid", "attacks", "checkpoints"):  # the top-level data folders map into the wheel
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), str(src)], tmp, _env())
    (wheel,) = (tmp / "dist").glob("robustbench_pid-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, _env())
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp,
                     _env()).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "heavy_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         tmp, _env())
    return venv


def test_wheel_install_runs_the_readme_job(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    import json
    import zipfile

    with zipfile.ZipFile(wheel) as z:  # every embedded file of the manifest ships, byte for byte
        names = set(z.namelist())
        manifest = json.loads(z.read("robustbench_pid/embedded_checkpoints/manifest.json"))
        from robustbench_pid.models.zoo import zoo

        assert len(manifest) == len(zoo.names()) == 16  # every zoo member's digits weights, those trained to resist too
        for entry in manifest.values():
            data = z.read(f"robustbench_pid/embedded_checkpoints/{entry['file']}")
            assert data == (ROOT / "checkpoints" / entry["file"]).read_bytes()
        assert sum(z.getinfo(n).file_size for n in names if n.endswith(".safetensors")) < 15e6
    venv = _fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # the package comes from the fresh venv, never from the checkout or its editable install
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import sys, robustbench_pid.run.suites as s, robustbench_pid.hub.checkpoints as c\n"
                  "print(s.__file__); print(s.suites_dir()); print(c.checkpoints_dir())\n"
                  "print(any('editable' in m for m in sys.modules))"], elsewhere, _env()).stdout.split("\n")
    site = str(venv.resolve())
    assert all(line.startswith(site) for line in where[:3]), where
    assert where[3] == "False"
    listed = _run([str(venv / "bin" / "robustbench-pid"), "list", "suites"], elsewhere, _env()).stdout
    assert {"smoke", "paper-table1", "eps-sweep", "autoattack"} <= {ln.split()[0] for ln in listed.splitlines()}
    released = _run([str(venv / "bin" / "robustbench-pid"), "fetch", "--list"], elsewhere, _env()).stdout
    assert site in released and {"deit_tiny", "fan_tiny"} <= {ln.split()[0] for ln in released.splitlines()[1:]}
    studies = _run([str(venv / "bin" / "robustbench-pid"), "list", "studies"], elsewhere, _env()).stdout
    assert {"pidformer-table1", "rpc-table2", "digits-smoke"} <= {ln.split()[0] for ln in studies.splitlines() if ln[:1] != " "}

    rpc = _run([str(venv / "bin" / "robustbench-pid"), "evaluate", "--model", "rpc_fan", "--attack", "fgsm", "--limit",
                "4", "--quiet", "--device", "cpu", "--out", str(tmp_path / "wheel" / "rpc")], elsewhere, _env())
    assert rpc.returncode == 0 and (tmp_path / "wheel" / "rpc" / "summary.csv").is_file()  # a new family, no checkpoint
    installed = _run([str(venv / "bin" / "evaluate"), *JOB, "--out", str(tmp_path / "wheel" / "run")], elsewhere,
                     _env())
    checkout = _run([sys.executable, "-m", "robustbench_pid", "evaluate", *JOB,
                     "--out", str(tmp_path / "checkout" / "run")], elsewhere, _env(PYTHONPATH=str(ROOT)))

    a = pd.read_csv(tmp_path / "wheel" / "run" / "summary.csv")
    b = pd.read_csv(tmp_path / "checkout" / "run" / "summary.csv")
    assert len(a) > 0 and set(a["attack"]) >= {"clean", "fgsm"} and (a["n"] == 8).all()
    pd.testing.assert_frame_equal(a, b)
    shown = [out.stdout.replace(str(tmp_path / d), "RUN") for out, d in ((installed, "wheel"), (checkout, "checkout"))]
    assert shown[0] == shown[1] and "FGSM" in shown[0].upper()

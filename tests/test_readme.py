"""Every shell command in the README runs as written (on a small --limit), so the README cannot drift.

The commands of every ```bash block run in order in one scratch folder, as a user would run them in a fresh
clone after the quickstart: ``.venv/bin/`` is the interpreter running this test, the install and the
test-suite commands are left out (they are what runs this), and each ``evaluate`` gets ``--limit 8``.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def readme_commands() -> List[str]:
    text = (ROOT / "README.md").read_text()
    cmds: List[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            for part in (p.strip() for p in line.split("&&")):
                if part.startswith("python3 -m venv") or "pip install" in part or "-m pytest" in part:
                    continue  # installing and testing: that is what is running this test
                cmds.append(part)
    return cmds


def test_readme_has_the_two_setup_commands_first() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert blocks[0].strip().startswith("python3 -m venv .venv && .venv/bin/pip install -e")
    assert blocks[0].strip().endswith(".venv/bin/evaluate --model pid_deit --attack pgd")
    assert blocks[1].strip() == ".venv/bin/python -m pytest -n auto"  # every core (pytest-xdist, a test dependency)


def test_ci_runs_the_readme_test_command() -> None:
    """``.ci/run`` runs README's second command as written (plus quiet output and no cache folder)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if "-m pytest" in ln]
    assert ci == [blocks[1].strip() + " -q -p no:cacheprovider"]
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text()


def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    cmds = readme_commands()
    assert any(c.startswith(".venv/bin/robustbench-pid check") for c in cmds)
    (tmp_path / "results").mkdir()
    shutil.copytree(ROOT / "results" / "baselines", tmp_path / "results" / "baselines")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[0].startswith(".venv/bin/"), f"README command not run through .venv/bin/: {cmd}"
        argv[0] = str(BIN / argv[0][len(".venv/bin/"):])
        if Path(argv[0]).name == "evaluate":
            argv += ["--limit", "8", "--quiet", "--device", "cpu"]
        p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
        out = p.stdout + p.stderr
        assert "Traceback" not in out and "error:" not in out, f"{cmd}\n{out}"
        if "robustbench-pid check" in cmd and p.returncode == 1:
            # --limit 8 is another sample set than the baseline's 360 images: the only allowed failure
            fails = [ln for ln in p.stdout.splitlines() if ln.split()[:1] and ln.split()[0] in
                     ("REGRESSED", "MISSING", "SETTINGS-CHANGED")]
            assert not fails and "SAMPLES-CHANGED" in p.stdout, f"{cmd}\n{out}"
            continue
        assert p.returncode == 0, f"{cmd}\n{out}"
    assert (tmp_path / "results" / "report.html").is_file() and any((tmp_path / "results" / "plots").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # every output under results/ (git-ignored)


@pytest.mark.parametrize("argv", [["--eps", "-2/255"], ["--eps", "-0.1"], ["--eps", "1/255,-2/255"]])
def test_negative_eps_with_a_space_is_one_error_line(argv: List[str], capsys) -> None:
    from robustbench_pid.cli import evaluate_main

    assert evaluate_main(["--model", "pid_deit", "--attack", "pgd", *argv, "--limit", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: eps '-") and "must be a finite number >= 0" in err[0]


def test_readme_timm_registration_holds() -> None:
    """README: ``import robustbench_pid.models`` registers our architectures with timm; a plain
    ``import robustbench_pid`` does not import timm at all."""
    assert "registered with timm by `import robustbench_pid.models`" in " ".join((ROOT / "README.md").read_text().split())
    code = ("import sys, robustbench_pid\nassert 'timm' not in sys.modules\n"
            "import timm, robustbench_pid.models\n"
            "m = timm.create_model('pid_deit_tiny_patch16_224', num_classes=10, img_size=32)\n"
            "assert type(m).__module__.startswith('robustbench_pid.') and m.num_classes == 10")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr

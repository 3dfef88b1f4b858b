"""Fast start: ``import robustbench_pid`` and the ``--help`` of every command import neither torch nor
timm (nor pandas or matplotlib); the library loads on first use. Timings: scripts/bench_startup.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from robustbench_pid.cli import verbs

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "timm", "pandas", "matplotlib")


def _heavy_after(code: str) -> List[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _help(call: str) -> str:
    return (f"import contextlib, io\nfrom robustbench_pid.cli import evaluate_main, main\n"
            f"out = io.StringIO()\n"
            f"with contextlib.redirect_stdout(out):\n"
            f"    try:\n        {call}\n    except SystemExit as e:\n        assert e.code == 0, e.code\n"
            f"assert 'usage:' in out.getvalue()")


def test_every_verb_is_discovered() -> None:
    assert {"evaluate", "list", "models", "train", "merge", "table", "check", "plot", "report"} <= set(verbs())


@pytest.mark.parametrize("verb", sorted(verbs()))
def test_verb_help_imports_no_heavy_library(verb: str) -> None:
    assert _heavy_after(_help(f"main([{verb!r}, '--help'])")) == []


def test_evaluate_help_imports_no_heavy_library() -> None:
    assert _heavy_after(_help("evaluate_main(['--help'])")) == []


def test_package_import_is_light_and_names_load_on_use() -> None:
    assert _heavy_after("import robustbench_pid as rbp\nassert 'load_model' in dir(rbp)") == []
    # first use of a public name brings its module (and torch) in
    assert "torch" in _heavy_after("import robustbench_pid as rbp\nrbp.load_model")


def test_public_names_are_the_library_functions() -> None:
    import robustbench_pid as rbp
    from robustbench_pid.api import evaluate
    from robustbench_pid.results.ci.check import check

    assert rbp.evaluate is evaluate and rbp.check is check  # importing robustbench_pid.results.ci.check keeps the function
    assert set(rbp.__all__) <= set(dir(rbp))
    assert all(callable(getattr(rbp, n)) for n in rbp.__all__ if n != "__version__")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rbp.nope  # noqa: B018


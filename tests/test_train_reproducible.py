"""`train` is bit-for-bit reproducible: the recipe fixes seed, threads and kernels (CPU)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from robustbench_pid.train import Recipe, train

ROOT = Path(__file__).resolve().parents[1]

SHORT = Recipe(epochs=1, warmup_epochs=1)


def test_two_short_trainings_are_identical_bit_for_bit(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    a = train("pid_deit", SHORT, tmp_path / "a", log=lambda *_: None)
    assert torch.get_num_threads() == before  # the caller's thread setting is restored
    # the second one in a fresh process whose own default is another thread count
    code = ("import sys, torch; from pathlib import Path; torch.set_num_threads(1); "
            "from robustbench_pid.train import Recipe, train; "
            "train('pid_deit', Recipe(epochs=1, warmup_epochs=1), Path(sys.argv[1]), log=lambda *_: None)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True, env=env, timeout=600)
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())["pid_deit_digits"]
    assert (tmp_path / "a" / "pid_deit_digits.safetensors").read_bytes() == \
        (tmp_path / "b" / "pid_deit_digits.safetensors").read_bytes()
    assert a["sha256"] == b["sha256"] and a["clean_test_top1"] == b["clean_test_top1"]
    assert a["reproduces_with"] == {"threads": 2, "deterministic_algorithms": True, "device": "cpu"}
    assert a["recipe"]["threads"] == 2 and a["versions"]["torch"] == torch.__version__


def test_thread_count_is_part_of_the_recipe(tmp_path: Path) -> None:
    one = train("deit", Recipe(epochs=1, warmup_epochs=1, threads=1), tmp_path / "one", log=lambda *_: None)
    assert one["recipe"]["threads"] == 1 and one["reproduces_with"]["threads"] == 1


@pytest.mark.slow
def test_full_recipe_gives_the_documented_clean_accuracy(tmp_path: Path) -> None:
    """README and the manifest quote today's full-recipe pid_deit at 98.61% clean top-1 (the shipped file, trained
    before the recipe was pinned, has 99.72%): a fresh training checks the quoted number (minutes: slow)."""
    entry = train("pid_deit", Recipe(), tmp_path, log=lambda *_: None)
    quoted = re.search(r"`pid_deit`: ([\d.]+)% clean top-1 instead of the shipped ([\d.]+)%",
                       (ROOT / "README.md").read_text())
    assert quoted, "README no longer quotes the retrained accuracy: update this test"
    assert f"{100 * entry['clean_test_top1']:.2f}" == quoted.group(1)
    manifest = json.loads((ROOT / "checkpoints" / "manifest.json").read_text())
    assert f"{100 * manifest['pid_deit_digits']['clean_test_top1']:.2f}" == quoted.group(2)
    assert f"pid_deit: {quoted.group(1)}% clean top-1" in manifest["pid_deit_digits"]["reproducibility"]

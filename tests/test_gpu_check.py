"""scripts/gpu_check.py (issue 48, item 3), on a machine without a GPU: its plan holds what the GPU session must bring
back within the budget, its dry mode writes nothing, and without CUDA it skips the GPU steps saying why, runs the
others, keeps a step within its time, and exits 0."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu_check(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", mod)  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    return mod


def test_the_dry_plan_holds_every_gpu_figure_within_the_budget_and_writes_nothing(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--dry"]) == 0
    text = capsys.readouterr().out
    out = tmp_path / "out"
    assert not out.exists() and "nothing was run or written (--dry)" in text
    caps = [int(c) for c in re.findall(r"cap +(\d+) s", text)]
    total = int(re.search(r"caps (\d+) s in all, budget 540 s", text).group(1))
    assert len(caps) == 8 and sum(caps) == total <= 540  # the whole session fits one device call
    assert f"-m robustbench_pid doctor --device cuda --json {out / 'doctor.json'}" in text
    assert f"--junitxml={out / 'cuda_tests.xml'}" in text and "tests/test_gpu_decode.py" in text
    lines = text.splitlines()
    e2e = [ln for ln in lines if "scripts/bench_e2e.py" in ln]
    # fp32, bf16 and bf16 + compile; CPU and GPU decode; clean, pgd and sweep
    assert any("--precision fp32" in ln and "--decode cpu,gpu" in ln and "--scenarios clean,pgd" in ln for ln in e2e)
    assert any("--precision bf16 --compile" in ln and "--scenarios pgd" in ln for ln in e2e)
    assert any("--precision bf16" in ln and "--compile" not in ln and "--decode gpu" in ln for ln in e2e)
    assert any("--scenarios sweep" in ln for ln in e2e)
    assert all(f"--json {out}/" in ln for ln in e2e)
    assert any(f"scripts/bench_decode.py --n 2048" in ln and f"--json {out / 'decode.json'}" in ln for ln in lines)
    # the CUDA tests it names exist (a renamed test would make the session run nothing)
    for node in gpu_check.CUDA_TESTS:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file() and (not name or f"def {name}(" in (ROOT / path).read_text()), node


def test_without_cuda_the_gpu_steps_are_skipped_with_the_reason_and_the_others_run(gpu_check, tmp_path, capsys,
                                                                                  monkeypatch):
    py = sys.executable
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: False)
    monkeypatch.setattr(gpu_check, "steps", lambda out, workers, tree: [
        gpu_check.Step("gpu-part", 1, ["-c", "raise SystemExit(3)"], what="a GPU step"),
        gpu_check.Step("cpu-part", 1, ["-c", "print('decoded on the CPU')"], needs_cuda=False, what="a CPU step"),
        gpu_check.Step("slow", 1, ["-c", "import time; time.sleep(30)"], needs_cuda=False),
        gpu_check.Step("late", 37, ["-c", "pass"], needs_cuda=False)])
    assert gpu_check.main(["--budget-s", "40"]) == 0
    text = capsys.readouterr().out
    out = tmp_path / "out"
    status = json.loads((out / "status.json").read_text())
    assert status["cuda"] is False and status["budget_s"] == 40
    steps = status["steps"]
    assert steps["cpu-part"]["status"] == "ok" and "decoded on the CPU" in (out / "cpu-part.log").read_text()
    assert (out / "cpu-part.log").read_text().startswith(f"$ {py} -c ")
    assert steps["gpu-part"] == {**steps["gpu-part"], "status": "skipped",
                                 "why": "needs a CUDA device (torch.cuda.is_available() is False here)"}
    assert not (out / "gpu-part.log").exists()
    # 40 s budget, the last step's 37 s kept: "slow" gets its 1 s cap plus the ~2 s spare, and is stopped there
    assert steps["slow"]["status"].startswith("timed out after") and steps["slow"]["seconds"] < 5
    assert steps["late"]["status"] == "ok"
    assert "gpu-part          SKIPPED: needs a CUDA device" in text
    assert "no CUDA device here: the GPU steps were skipped" in text


def test_a_step_is_not_started_without_time_left_and_a_bad_step_name_is_one_error(gpu_check, tmp_path, capsys,
                                                                                  monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    monkeypatch.setattr(gpu_check, "steps", lambda out, workers, tree: [
        gpu_check.Step("first", 30, ["-c", "import time; time.sleep(1.5)"]),
        gpu_check.Step("second", 30, ["-c", "pass"])])
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 20)
    assert gpu_check.main(["--budget-s", "21"]) == 0
    steps = json.loads((tmp_path / "out" / "status.json").read_text())["steps"]
    assert steps["first"]["status"] == "ok"
    assert steps["second"]["status"] == "skipped" and re.match(r"budget: 1\d s left of 21 s", steps["second"]["why"])
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "first,nope"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --only 'first,nope': unknown step nope; steps: first, second"]

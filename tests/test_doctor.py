"""``robustbench-pid doctor``: the quick run passes on this machine and prints every row, its --json
holds what the rows say, and each FAIL path (device logits that disagree, torch.compile unavailable,
a batch too large) is forced and gives FAIL and exit status 1. On CPU the device is the CPU; the
same code runs with ``--device cuda`` on a GPU.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pandas as pd
import pytest
import torch

import robustbench_pid.doctor as doctor
from robustbench_pid.run import speed
from robustbench_pid.cli import main as cli_main
from robustbench_pid.doctor import Settings, correctness, environment, speed_checks

ROOT = Path(__file__).resolve().parents[1]


def _rows(text: str) -> Dict[str, str]:
    """'section check' -> verdict, from the printed table."""
    out = {}
    for section, name, _ in doctor.plan(None):
        m = re.search(rf"^{re.escape(section)}\s+{re.escape(name)}\s+(PASS|WARN|FAIL|SKIP)\s", text, flags=re.M)
        if m:
            out[f"{section} {name}"] = m.group(1)
    return out


def test_quick_doctor_passes_prints_every_row_and_writes_json(tmp_path: Path) -> None:
    js = tmp_path / "doctor.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "robustbench_pid", "doctor", "--quick", "--device", "cpu",
                           "--json", str(js)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    names = [f"{s} {n}" for s, n, _ in doctor.plan(None)]
    assert sorted(rows) == sorted(names)  # every row printed, once
    assert "FAIL" not in rows.values()
    assert rows["correctness smoke fp32"] == "PASS" and rows["correctness resume"] == "PASS"
    assert rows["speed compiled"] == "SKIP" and rows["correctness compile vs fp32"] == "SKIP"  # --quick says so
    data = json.loads(js.read_text())
    assert data["quick"] is True and data["device"] == "cpu" and data["exit_code"] == 0
    assert [f"{c['section']} {c['name']}" for c in data["checks"]] == names
    assert {f"{c['section']} {c['name']}": c["verdict"] for c in data["checks"]} == rows
    v = data["environment"]["versions"]
    assert v["torch"] == torch.__version__ and v["robustbench_pid"] == __import__("robustbench_pid").__version__
    fp32 = data["speed"]["fp32 eager"]
    for m in ("DeiT-tiny", "PID DeiT-tiny"):
        assert fp32[m]["fwd"] > 0 and fp32[m]["fb"] > 0
        assert fp32[m]["fwd"] == pytest.approx(fp32["batch"] / fp32[m]["fwd_s"], rel=1e-3)
    assert data["speed"]["decode"]["best_img_s"] > 0 and data["speed"]["largest_batch"]["batch"] >= 1
    # the calibration pair printed is the best measured setting's, priced as the dry run prices Table 1
    cal = data["calibration"]
    fwd, fb = (float(v) for v in cal["pair"].split(","))
    assert f"--calibration {cal['pair']} ({cal['setting']})" in proc.stdout
    assert (fwd, fb) == speed.calibration_pair(data["speed"][cal["setting"]]["PID DeiT-tiny"])
    assert cal["all"][cal["setting"]]["table1_seconds"] == pytest.approx(speed.table1_estimate(fwd, fb)["seconds"])


def test_table1_estimate_counts_the_dry_runs_passes(tmp_path: Path, capsys) -> None:
    """table1_passes is the dry run's own count: evaluate --dry-run on the same suite gives the same
    passes per image; the estimate is images x (fwd / fwd rate + f+b / f+b rate) (docs/scaling.md: 15.6 h)."""
    suite = tmp_path / "t1.toml"
    suite.write_text("\n".join(f"[[attack]]\nname = \"{n}\"\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in p.items())
                               for n, p in speed.TABLE1_SUITE) + "\n")
    rc = cli_main(["evaluate", "--model", "pid_deit", "--suite", str(suite), "--protocol", "paper", "--limit", "8",
                   "--dry-run", "--calibration", "1,1", "--out", str(tmp_path / "run")])
    assert rc == 0
    m = re.search(r"(\d+) forward and (\d+) forward\+backward image-passes", capsys.readouterr().out)
    est = speed.table1_estimate(9460, 3941)
    assert (est["fwd_passes"], est["fb_passes"]) == (int(m.group(1)) / 8, int(m.group(2)) / 8) == (10271, 146)
    assert round(est["seconds"]) == round(50_000 * (10271 / 9460 + 146 / 3941)) == 56139
    assert speed.calibration_pair({"fwd": 9460.4, "fb": 3941.26}) == (9460.0, 3941.0)


class Drifting(torch.nn.Module):
    """A model whose logits move with every call: what a device whose results disagree looks like."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x) + 0.5 * self.calls * torch.arange(10, device=x.device)


def _tiny(tmp: Path, **kw: Any) -> Settings:
    base = dict(smoke_models=("tiny",), smoke_n=8, smoke_steps=1, speed_batch=1, reps=1, pgd_steps=1, tree_images=2)
    return Settings(torch.device("cpu"), True, tmp, **{**base, **kw})


def _doctor_cli(monkeypatch, tmp_path: Path, checks, settings: Settings) -> tuple:
    """The CLI with only ``checks`` planned and ``settings`` in place: (exit status, printed, json)."""
    monkeypatch.setattr(doctor, "plan", lambda s: checks)
    monkeypatch.setattr(Settings, "for_device", classmethod(lambda cls, d, q, t: settings))
    js = tmp_path / "d.json"
    rc = cli_main(["doctor", "--quick", "--device", "cpu", "--json", str(js)])
    return rc, json.loads(js.read_text())


def test_device_logits_that_disagree_fail(tmp_path: Path, monkeypatch, capsys) -> None:
    s = _tiny(tmp_path, model_factory=lambda name: Drifting())
    rc, data = _doctor_cli(monkeypatch, tmp_path, [("correctness", "smoke fp32", correctness.smoke_fp32)], s)
    out = capsys.readouterr().out
    assert rc == 1 and re.search(r"^correctness smoke fp32\s+FAIL\s", out, flags=re.M)
    got = data["checks"][0]["data"]["models"]["tiny"]
    assert got["logits_max_abs_diff"] == pytest.approx(4.5)  # 0.5 x one more call x class 9
    assert got["logits_over_tolerance"] == 8 * 9  # every logit but class 0's, on all 8 samples
    assert data["exit_code"] == 1


def test_same_model_twice_passes_and_bf16_is_compared(tmp_path: Path) -> None:
    """The same check on a well-behaved model: PASS, and bf16 compared sample by sample."""
    torch.manual_seed(0)
    steady = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    s = _tiny(tmp_path, model_factory=lambda name: steady)
    state: Dict[str, Any] = {}
    c = doctor.run_one("correctness", "smoke fp32", correctness.smoke_fp32, s, state)
    assert c.verdict == "PASS", c.line
    assert c.data["models"]["tiny"]["clean_agree"] == 8 and c.data["models"]["tiny"]["attack_agree"] == 8
    b = doctor.run_one("correctness", "bf16", correctness.smoke_bf16, s, state)
    assert b.verdict in ("PASS", "WARN") and b.data["models"]["tiny"]["clean_agree"] == 8, b.line


def test_compile_unavailable_fails(tmp_path: Path, monkeypatch, capsys) -> None:
    def broken(*a, **k):
        raise RuntimeError("inductor: no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    rc, data = _doctor_cli(monkeypatch, tmp_path, [("environment", "versions", environment.versions),
                                                   ("environment", "torch.compile", environment.compile_works)],
                           _tiny(tmp_path))
    out = capsys.readouterr().out
    assert rc == 1
    assert re.search(r"^environment versions\s+PASS\s", out, flags=re.M)
    assert re.search(r"^environment torch.compile\s+FAIL\s+torch.compile fails here \(RuntimeError: inductor: no C\+\+", out,
                     flags=re.M)
    assert [c["verdict"] for c in data["checks"]] == ["PASS", "FAIL"] and data["checks"][1]["data"]["works"] is False


def test_batch_too_large_fails_and_the_fit_is_memory_over_saved_bytes(tmp_path: Path, monkeypatch, capsys) -> None:
    torch.manual_seed(0)
    tiny = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    x, y = speed.random_batch(2, torch.device("cpu"), size=16, classes=10)
    tiny(x)
    per = speed.saved_bytes_per_sample(tiny, x, y)
    # conv input (3x16x16 fp32) + ReLU output, flattened input of the linear (4x14x14 fp32, saved once each)
    assert per >= 4 * (3 * 16 * 16 + 4 * 14 * 14)
    r = speed.largest_batch(tiny, torch.device("cpu"), size=16, memory_bytes=int(per * 5 / 0.8))
    assert r["batch"] == 4  # 4 fit, 8 would not
    rc, data = _doctor_cli(monkeypatch, tmp_path, [("speed", "largest batch", speed_checks.largest)],
                           _tiny(tmp_path, memory_bytes=2 ** 20))  # 1 MiB: less than one 224 px sample saves
    out = capsys.readouterr().out
    assert rc == 1 and re.search(r"^speed\s+largest batch\s+FAIL\s+PID DeiT-tiny 224 px: not even a batch of 1", out,
                                 flags=re.M)
    assert data["checks"][0]["data"]["batch"] == 0


def test_a_check_that_raises_is_one_fail_row_and_the_others_still_run(tmp_path: Path, monkeypatch, capsys) -> None:
    def boom(s, state):
        raise OSError("disk on fire")

    rc, data = _doctor_cli(monkeypatch, tmp_path, [("environment", "broken", boom),
                                                   ("environment", "cores & workers", environment.cores)],
                           _tiny(tmp_path))
    assert rc == 1 and [c["verdict"] for c in data["checks"]] == ["FAIL", "PASS"]
    assert data["checks"][0]["line"].startswith("OSError: disk on fire")


def test_agreement_matches_on_condition_and_sample() -> None:
    a = pd.DataFrame({"attack": ["pgd"] * 3, "eps": [0.1] * 3, "sample_id": ["0", "1", "2"], "pred": [1, 2, 3]})
    b = a.iloc[::-1].assign(pred=[3, 0, 1])  # reversed order; sample 1 disagrees
    assert correctness.agreement(a, b) == (2, 3)
    with pytest.raises(RuntimeError, match="different samples"):
        correctness.agreement(a, b.iloc[:2])


def test_bad_json_folder_is_one_clear_error(tmp_path: Path, capsys) -> None:
    assert cli_main(["doctor", "--quick", "--json", str(tmp_path / "missing" / "d.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["doctor", "--quick", "--json", str(tmp_path)]) == 2  # refused before minutes of checks
    assert f"--json {tmp_path} is a folder; give a file path" in capsys.readouterr().err


@pytest.mark.parametrize("compile_row,says", [(True, "found that torch.compile works"),
                                              (False, "could not confirm that torch.compile works")])
def test_the_quick_compile_skip_says_only_what_the_environment_row_found(tmp_path: Path, monkeypatch, capsys,
                                                                          compile_row, says) -> None:
    s = _tiny(tmp_path, compile_timeout_s=60.0 if compile_row else 0.0)
    if not compile_row:  # a compiler that has not finished in time: the row WARNs, and the SKIP must not vouch
        import time as _time

        monkeypatch.setattr(torch, "compile", lambda m: (_time.sleep(0.5), m)[1])
    rc, data = _doctor_cli(monkeypatch, tmp_path, [("environment", "torch.compile", environment.compile_works),
                                                   ("correctness", "smoke compile", correctness.smoke_compile)], s)
    row = data["checks"][1]
    assert row["verdict"] == "SKIP" and says in row["line"]


def test_a_device_that_is_not_there_is_one_error_line(monkeypatch, capsys) -> None:
    """Any machine: CUDA is made invisible, so --device cuda is bad input (exit 2), not a FAIL table."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["doctor", "--quick", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --device cuda: CUDA is not available")


def test_the_decode_check_says_nothing_about_a_partial_imagenet(tmp_path: Path) -> None:
    """doctor's decode row reads a tree it generated (8 images): 'found 8 of the published 50,000 images' is about
    that sample, no news to the person who ran doctor, so no warning reaches the terminal (issue 54)."""
    import warnings

    from robustbench_pid.data.generators.jpeg_tree import build_tree, decode_rate

    build_tree(tmp_path / "tree", 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rate = decode_rate(tmp_path / "tree", 0, batch=4)
    assert rate["images"] == 4 and not [w for w in caught if "partial copy" in str(w.message)]

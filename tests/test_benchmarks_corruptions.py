"""`evaluate --benchmark corruptions` end to end on the embedded digits, and CE normalized by a
baseline model whose results are in the same store."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.results.summaries.corruptions import corruption_rows
from robustbench_pid.core.imagenet_info import CORRUPTIONS_15

BIN = Path(sys.executable).parent
LIMIT = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """deit through the console script, pid_deit through the Python runner, into one store."""
    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import RunSpec

    root = tmp_path_factory.mktemp("store")
    exe = shutil.which("evaluate", path=str(BIN)) or "evaluate"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([exe, "--model", "deit", "--benchmark", "corruptions", "--limit", str(LIMIT), "--quiet",
                        "--out", str(root / "deit")], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "mean_err" in p.stdout and "gaussian_noise/5" in p.stdout
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: a second OpenMP thread only waits on a busy machine
    try:
        run(RunSpec(model="pid_deit", benchmark="corruptions", limit=LIMIT, quiet=True, out=root / "pid_deit"))
    finally:
        torch.set_num_threads(threads)
    return root


def _errors(rec: pd.DataFrame):
    errs = {c: [1 - rec[rec.condition == f"{c}/{s}"].correct_top1.mean() for s in range(1, 6)] for c in CORRUPTIONS_15}
    return errs, 1 - rec[rec.condition == "clean"].correct_top1.mean()


def test_records_and_unnormalized_rows(store: Path):
    rec = rbp.load_records(store / "deit")
    assert len(rec) == LIMIT * (1 + 15 * 5)
    assert set(rec.condition) == {"clean"} | {f"{c}/{s}" for c in CORRUPTIONS_15 for s in range(1, 6)}
    assert set(rec[rec.condition == "fog/2"].severity) == {2} and set(rec[rec.condition == "fog/2"].corruption) == {"fog"}
    df = rbp.load_results(store / "deit").set_index("metric")
    errs, _ = _errors(rec)
    for c in CORRUPTIONS_15:
        assert df.loc[f"err_{c}", "value"] == pytest.approx(100 * np.mean(errs[c]))
    assert df.loc["mean_err", "value"] == pytest.approx(100 * np.mean([np.mean(v) for v in errs.values()]))
    assert "mce" not in df.index  # digits: no AlexNet normalization, no baseline named
    # a corruption at severity 5 hurts at least as much as clean on average (sanity of the pipeline)
    assert df.loc["mean_err", "value"] > 100 * (1 - rec[rec.condition == "clean"].correct_top1.mean())


def test_ce_and_mce_normalized_by_a_baseline_model_in_the_same_store(store: Path, monkeypatch):
    # the environment never changes the rows: the baseline is only the explicit argument
    monkeypatch.setenv("ROBUSTBENCH_PID_CE_BASELINE", "deit")
    plain = rbp.load_results(store)
    assert not any(m.startswith("ce_") or m == "mce" for m in plain.metric)
    df = rbp.load_results(store, ce_baseline="deit")
    pid = df[df.model == "pid_deit"].set_index("metric")
    rec = rbp.load_records(store)
    e_pid, c_pid = _errors(rec[rec.model == "pid_deit"])
    e_base, c_base = _errors(rec[rec.model == "deit"])
    ces = {c: 100 * sum(e_pid[c]) / sum(e_base[c]) for c in CORRUPTIONS_15 if sum(e_base[c]) > 0}
    assert len(ces) >= 5  # the digits models do err on the strong corruptions
    assert {m[3:] for m in pid.index if m.startswith("ce_")} == set(ces)
    for c, v in ces.items():
        assert pid.loc[f"ce_{c}", "value"] == pytest.approx(v)
        assert pid.loc[f"ce_{c}", "ce_baseline"] == "deit"
    if len(ces) == 15:
        assert pid.loc["mce", "value"] == pytest.approx(np.mean(list(ces.values())))
    else:  # a corruption on which the baseline never errs leaves CE (and mCE) undefined: not reported
        assert "mce" not in pid.index
    # the baseline's own rows are not normalized by itself
    assert "mce" not in set(df[df.model == "deit"].metric)


def test_baseline_normalization_exact_on_constructed_records():
    from test_benchmarks_imagenet import _fake_corruption_records

    base = {c: [0.2] * 5 for c in CORRUPTIONS_15}
    mine = {c: [0.1] * 5 for c in CORRUPTIONS_15}
    recs = pd.concat([_fake_corruption_records("base", "digits", base, 0.1),
                      _fake_corruption_records("mine", "digits", mine, 0.05)], ignore_index=True)
    df = corruption_rows(recs, baseline="base")
    m = df[df.model == "mine"].set_index("metric")["value"]
    assert m["mce"] == pytest.approx(50.0) and m["ce_fog"] == pytest.approx(50.0)
    assert m["relative_mce"] == pytest.approx(100 * (0.1 - 0.05) / (0.2 - 0.1))
    with pytest.warns(UserWarning, match="no records"):
        corruption_rows(recs, baseline="absent")


def test_workers_give_identical_records(tmp_path):
    """--workers N moves corruption into DataLoader workers; per-sample seeds keep records equal."""
    import torch

    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import RunSpec

    opts = {"corruptions": {"corruptions": ["glass_blur", "shot_noise"], "severities": [2, 5]}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recs = []
        for w in (0, 2):
            out = run(RunSpec(model="deit", benchmark="corruptions", limit=5, batch_size=2, quiet=True,
                              num_workers=w, benchmark_options=opts, out=tmp_path / f"w{w}"))
            recs.append(rbp.load_records(out).sort_values(["condition", "sample_id"]).reset_index(drop=True))
    finally:
        torch.set_num_threads(threads)
    assert len(recs[0]) == 5 * 5 and set(recs[0].condition) == {"clean", "glass_blur/2", "glass_blur/5",
                                                                 "shot_noise/2", "shot_noise/5"}
    for col in ("sample_id", "label", "pred", "correct_top1", "correct_top5", "condition"):
        assert recs[0][col].tolist() == recs[1][col].tolist(), col


def test_worker_view_corrupts_exactly_like_the_in_process_path(digits_test):
    from robustbench_pid.benchmarks.corruptions import _CorruptedView
    from robustbench_pid.data.generators.corruptions import corrupt_batch, sample_seed

    view = _CorruptedView(digits_test, seed=0)
    for name, sev in (("glass_blur", 5), ("fog", 1), ("impulse_noise", 3)):
        x, y = view[(3, name, sev)]
        seed = sample_seed(0, name, sev, digits_test.sample_ids[3])
        ref = corrupt_batch(digits_test[3][0][None], name, sev, [seed])[0]
        assert torch.equal(x, ref) and y == digits_test[3][1] and not torch.equal(x, digits_test[3][0])

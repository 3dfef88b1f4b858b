"""Plans without data (issue 46, item 4): ``--dry-run`` prices a dataset that is not on this machine at its
published size and a model without weights as its untrained architecture, saying both; the calibration batch
is timed after a warm-up, and a forward measured slower than a forward+backward is caught."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from robustbench_pid.cli import main
from robustbench_pid.core.imagenet_info import PUBLISHED_COUNTS

RATES = "9739,4194"


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _total(text: str) -> tuple:
    m = re.search(r"total: (\d+) units, (\d+) to do: (\d+) forward and (\d+) forward\+backward", text)
    assert m, text
    return tuple(int(g) for g in m.groups())


def test_imagenet_plan_without_data_root_prices_50000_images(tmp_path: Path, capsys) -> None:
    out = tmp_path / "never"
    rc = main(["evaluate", "--model", "pid_deit", "--dataset", "imagenet", "--dry-run", "--calibration", RATES,
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and not out.exists()
    assert "50000 samples" in text
    assert "no data read: imagenet (val) is not on this machine (no --data-root given); planned at its published " \
           "size, 50,000 samples" in text
    assert "no weights loaded: pid_deit on imagenet data needs --checkpoint" in text
    units, todo, fwd, fb = _total(text)
    assert (units, todo, fwd, fb) == (98, 98, 50_000, 0)  # ceil(50,000 / 512) clean units, one forward each
    assert f"about {50_000 / 9739:.1f} s at the given calibration" in text
    # 98 units are one line per condition, not 98 lines
    assert "98 units: one line per condition" in text and not re.search(r"^[0-9a-f]{12}\s", text, re.M)


def test_empty_data_root_is_named_and_priced_at_the_published_size(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "EMPTY"
    empty.mkdir()
    rc = main(["evaluate", "--model", "deit", "--dataset", "imagenet", "--data-root", str(empty), "--dry-run",
               "--calibration", RATES, "--attack", "pgd", "--eps", "4/255", "--limit", "1000"])
    text = capsys.readouterr().out
    assert rc == 0
    assert f"imagenet (val) is not readable here (imagenet: no class folders under {empty}" in text
    assert "of which --limit takes the first 1,000" in text
    assert _total(text)[2:] == (1000 * (1 + 2), 1000 * 20)  # clean + PGD-20's clean and verdict forwards


def test_a_real_run_still_needs_its_data_and_weights(capsys) -> None:
    assert main(["evaluate", "--model", "pid_deit", "--dataset", "imagenet", "--limit", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "needs --data-root" in err[0]


@pytest.mark.parametrize("dataset, extra, samples, parts", [
    ("imagenet-c", [], 75 * PUBLISHED_COUNTS["imagenet-c"], "75 conditions x 50,000 images"),
    ("imagenet-o", [], 12_000, "in 10,000, ood 2,000"),
    ("imagenet-o", ["--subset", "60"], 60, "in 50, ood 10"),  # the published 1:5 ratio, as the dataset takes it
    ("imagenet-a", [], 7_500, None),
    ("imagenet-r", [], 30_000, None),
])
def test_robustness_sets_are_planned_at_their_published_sizes(capsys, dataset, extra, samples, parts) -> None:
    rc = main(["evaluate", "--model", "deit", "--dataset", dataset, "--dry-run", "--calibration", RATES, *extra])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert f"{samples:,} samples" in text and _total(text)[2] == samples  # one forward per sample and condition
    if parts:
        assert f"({parts})" in text


def test_plan_data_is_a_dataset_of_the_published_size() -> None:
    from robustbench_pid.run.plan_data import KnownSizeData

    ds = KnownSizeData("imagenet-o", [("in", 10), ("ood", 2)], (3, 8, 8), [5, 7], "not here", ood=True)
    assert len(ds) == 12 and ds.conditions[9] == "in" and ds.conditions[10] == "ood"
    assert [ds.ood[i] for i in (0, 11)] == [False, True]
    assert ds.sample_ids[11] == "ood/planned-1"
    x, y = ds[3]
    assert x.shape == (3, 8, 8) and 0 <= float(x.min()) and float(x.max()) <= 1 and y == 7
    assert torch.equal(ds[3][0], x)  # seeded by index: the same plan measures the same batch
    with pytest.raises(IndexError):
        ds.sample_ids[12]


def test_study_plan_prices_every_row_without_data(tmp_path: Path, capsys) -> None:
    """reproduce pidformer-table1 --dry-run on a machine without ImageNet: every row priced at its dataset's
    published size, passes as docs/studies.md counts them (IN-C: no clean condition without an ImageNet root)."""
    from robustbench_pid.studies.dryrun import row_passes
    from robustbench_pid.studies.spec import load_study

    out = tmp_path / "dry"
    rc = main(["reproduce", "pidformer-table1", "--model", "pid_deit", "--dry-run", "--calibration", RATES,
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and not out.exists()
    study = load_study("pidformer-table1")
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines()
             if ln.split()[:1] and ln.split()[0] in {r.name for r in study.rows}}
    assert list(lines) == [r.name for r in study.rows]
    published = {"imagenet": 50_000, "imagenet-a": 7_500, "imagenet-r": 30_000, "imagenet-c": 75 * 50_000,
                 "imagenet-o": 12_000}
    for r in study.rows:
        samples, fwd, fb = (float(lines[r.name][i]) for i in (2, 5, 6))
        assert samples == published[r.dataset], r.name
        f, b = row_passes(r)
        if r.dataset == "imagenet-c":
            assert (fwd, fb) == (samples, 0.0)  # 75 conditions, one forward each
        else:
            assert (fwd, fb) == (samples * f, samples * b), r.name
    assert "no data read: imagenet-c (test)" in text and "(no clean condition: it needs --imagenet-root)" in text
    assert text.count("no weights loaded") == 1 and "total: about" in text


def test_forward_slower_than_forward_backward_is_caught(monkeypatch, capsys) -> None:
    """Timing noise that makes a forward cost more than a forward+backward is measured again and, if it persists,
    priced at the forward+backward time with one warning (never a plan where a forward costs more than a step)."""
    from robustbench_pid.run import dryrun, speed
    from robustbench_pid.run.context import prepare
    from robustbench_pid.run.spec_builder import build_spec

    ctx = prepare(build_spec("deit", limit=4, batch_size=4, dry_run=True))
    calls = []

    def inverted(fns, device, reps=5, warmup=1):
        calls.append((reps, warmup))
        for fn in fns.values():
            fn()
        return {"fwd": [0.8] * reps, "fb": [0.4] * reps}

    monkeypatch.setattr(speed, "interleaved_times", inverted)
    t_f, t_fb = dryrun.calibrate(ctx)
    err = capsys.readouterr().err
    assert calls[0][1] >= 1 and len(calls) == 2  # warmed up; measured a second time with more repetitions
    assert calls[1][0] > calls[0][0]
    assert t_f == t_fb == pytest.approx(0.4 / 4)
    assert err.count("warning: calibration: a forward measured slower than a forward+backward") == 1


def test_calibration_warms_up_both_passes(monkeypatch) -> None:
    from robustbench_pid.run import dryrun, speed
    from robustbench_pid.run.context import prepare
    from robustbench_pid.run.spec_builder import build_spec

    ctx = prepare(build_spec("deit", limit=4, batch_size=4, dry_run=True))
    seen = []
    real = speed.interleaved_times

    def spy(fns, device, reps=5, warmup=1):
        seen.append((sorted(fns), warmup))
        return real(fns, device, reps=reps, warmup=warmup)

    monkeypatch.setattr(speed, "interleaved_times", spy)
    t_f, t_fb = dryrun.calibrate(ctx, reps=2)
    assert seen[0] == (["fb", "fwd"], 2) and 0 < t_f and 0 < t_fb

"""``--suite robustbench-corruptions`` (issue 64): the plan without data, the published entry beside the run with its
paired per-cell differences, and the exported entry in RobustBench's format (its CSV row re-read as RobustBench's
``corruptions_evaluation`` reads it gives the same ``corruptions_acc``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import robustbench_pid as rbp
from robustbench_pid.core import robustbench as rb
from robustbench_pid.export.model_info import check_entry
from robustbench_pid.results.summaries.leaderboard import compare, format_leaderboard

from released_c import TinyNet, write_release

ENTRY = "robustbench:corruptions/Standard"  # the pinned table: clean_acc 94.78, corruptions_acc 73.46


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rbc")
    root = write_release(tmp / "data", n=6)
    out = tmp / "run"
    rbp.evaluate(TinyNet(), name=ENTRY, dataset="cifar10", suite="robustbench-corruptions", data_root=str(root),
                 limit=6, device="cpu", out=str(out), quiet=True)
    return out


def test_a_dry_run_plans_the_750000_corrupted_and_10000_clean_images_without_the_data(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "timm:pid_deit_digits_patch4_32",
                          "--checkpoint", "embedded:pid_deit_digits", "--dataset", "cifar10", "--suite",
                          "robustbench-corruptions", "--dry-run", "--device", "cpu", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "760,000 samples (76 conditions x 10,000 images)" in out.stdout
    assert "760000 forward and 0 forward+backward image-passes" in out.stdout
    lines = [ln.split() for ln in out.stdout.splitlines() if ln.split()[-3:-2] == ["0"] and len(ln.split()) == 10]
    conds = {ln[4]: int(ln[5]) for ln in lines}
    assert conds.pop("clean") == 10_000 and len(conds) == 75 and set(conds.values()) == {10_000}
    assert not (tmp_path / "r").exists()


def test_the_published_entry_stands_beside_this_run_with_paired_cells(run: Path) -> None:
    summary, records = pd.read_csv(run / "summary.csv"), rbp.load_records(run)
    info = json.loads((run / "run.json").read_text())
    [row] = compare(summary, records, info)
    assert row["published"] == rb.published("cifar10", "corruptions", "Standard")
    assert row["published"]["clean_acc"] == "94.78" and row["published"]["corruptions_acc"] == "73.46"
    cells = {(c["corruption"], c["severity"]): c for c in row["cells"]}
    assert list(cells) == [(c, s) for c in rb.corruption_order() for s in range(1, 6)]
    def by_image(cond: str) -> pd.DataFrame:
        r = records[records["condition"] == cond]
        return r.set_index(r["sample_id"].str.rpartition("/test/")[2])

    clean = by_image("clean")
    for (c, s), cell in list(cells.items())[::7]:  # by hand: clean - cell over the same 6 test images
        got = by_image(f"{c}/{s}")["correct_top1"].astype(bool)
        ref = clean.loc[got.index, "correct_top1"].astype(bool)
        assert cell["paired_n"] == 6 and cell["accuracy"] == pytest.approx(100 * got.mean())
        assert cell["drop"] == pytest.approx(100 * (int((ref & ~got).sum()) - int((~ref & got).sum())) / 6)
    acc = float(summary[summary["metric"] == "corruptions_acc"]["value"].iloc[0])
    assert row["corruptions_acc"] == pytest.approx(acc)
    assert acc == pytest.approx(np.mean([c["accuracy"] for c in cells.values()]))
    assert row["comparable"] is False and row["reasons"] == ["6 of the leaderboard's 10,000 images per cell (--limit)"]
    text = format_leaderboard(summary, records, info)
    lines = text.splitlines()
    assert lines[1].split() == ["clean", "corruptions_acc", "n", "per", "cell"]
    assert lines[2].split() == ["published", "94.78", "73.46", "leaderboard's"]
    assert lines[3].split() == ["this", "run", f"{row['clean']:.2f}", f"{acc:.2f}", "6"]
    fog = next(ln for ln in lines if ln.split()[:1] == ["fog"]).split()
    assert fog[1:6] == [f"{cells[('fog', s)]['accuracy']:.2f}" for s in range(1, 6)]
    assert fog[7] == f"{np.mean([cells[('fog', s)]['drop'] for s in range(1, 6)]):+.2f}"
    assert "not comparable" in lines[-1] and text.count(" drop ") == 15


def test_export_writes_robustbench_fields_and_a_csv_row_that_rereads_to_corruptions_acc(run: Path,
                                                                                        tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="fields the run cannot know"):
        got = rbp.export_robustbench(run, tmp_path / "rb", model_id="Standard")
    folder = tmp_path / "rb" / "model_info" / "cifar10" / "corruptions"
    entry = json.loads((folder / "Standard.json").read_text())
    assert check_entry(entry, "corruptions") == [] and entry["dataset"] == "cifar10" and entry["eps"] is None
    summary = pd.read_csv(run / "summary.csv")
    acc = float(summary[summary["metric"] == "corruptions_acc"]["value"].iloc[0])
    clean = float(summary[(summary["attack"] == "clean") & (summary["metric"] == "top1")]["value"].iloc[0])
    assert entry["corruptions_acc"] == f"{acc:.2f}" and entry["clean_acc"] == f"{clean:.2f}"
    text = (folder / "unaggregated_results.csv").read_text().splitlines()
    assert text[0].split(",")[1:6] == ["shot_noise"] * 5 and text[1].split(",")[1:6] == ["1", "2", "3", "4", "5"]
    table = pd.read_csv(folder / "unaggregated_results.csv", header=[0, 1], index_col=0)  # as corruptions_evaluation
    table.columns = table.columns.set_levels([table.columns.levels[0], table.columns.levels[1].astype(int)])
    assert list(table.columns) == [(c, s) for c in rb.corruption_order() for s in range(1, 6)]
    assert list(table.index) == ["Standard"] and f"{100 * table.values.mean():.2f}" == entry["corruptions_acc"]
    assert 100 * table.values.mean() == pytest.approx(acc, abs=1e-9)
    assert "not RobustBench-comparable" in entry["footnote"] and got.notes


class _TinyImageNet(__import__("torch").nn.Module):
    """1000 classes from 224 px images, predictions varying with the pixels."""

    def __init__(self) -> None:
        import torch

        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc = torch.nn.Linear(3 * 8 * 8, 1000)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(self.fc.weight.shape, generator=g))
            self.fc.bias.zero_()

    def forward(self, x):
        import torch

        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x - 0.5, 8).flatten(1))


def test_imagenet_runs_robustbench_5000_list_in_its_order_with_mce(tmp_path: Path) -> None:
    from PIL import Image

    from robustbench_pid.core.imagenet_info import CORRUPTIONS_15, wnid_to_index

    ids = rb.imagenet_subset()[:3]
    rng = np.random.default_rng(0)
    for c in CORRUPTIONS_15:
        for s in range(1, 6):
            for i in ids:
                p = tmp_path / "data" / "ImageNet-C" / c / str(s) / i
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(p, quality=95)
    for i in ids:  # the clean images, through the entry's own preprocessing (resize 256, centre crop 224)
        p = tmp_path / "val" / i
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (300, 280, 3), dtype=np.uint8)).save(p, quality=95)
    df = rbp.evaluate(_TinyImageNet(), dataset="imagenet", suite="robustbench-corruptions", num_classes=1000,
                      data_root=str(tmp_path / "data"), imagenet_root=str(tmp_path / "val"), limit=3, device="cpu",
                      out=str(tmp_path / "run"), quiet=True)
    rec = rbp.load_records(tmp_path / "run")
    fog = rec[rec["condition"] == "fog/2"]
    assert list(fog["sample_id"]) == [f"fog/2/{i}" for i in ids]  # the list's order, not sorted
    assert list(fog["label"]) == [wnid_to_index()[i.split("/")[0]] for i in ids]
    cells = rec[rec["condition"] != "clean"].groupby(["corruption", "severity"])["correct_top1"].mean()
    acc = float(df[df.metric == "corruptions_acc"]["value"].iloc[0])
    assert len(cells) == 75 and acc == pytest.approx(100 * cells.mean())
    assert len(df[df.metric == "mce"]) == 1  # against AlexNet's published errors
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["leaderboard"]["n"] == 5000 and info["leaderboard"]["comparable"] is False
    assert info["leaderboard"]["reasons"] == ["3 of the leaderboard's 5,000 images per cell (--limit)"]


def test_the_suite_runs_no_attacks_and_refuses_a_wrong_entry_or_setting(tmp_path: Path) -> None:
    from robustbench_pid.errors import UserError
    from robustbench_pid.run.spec_builder import build_spec
    from robustbench_pid.run.suites import load_suite

    s = load_suite("robustbench-corruptions")
    assert s["attacks"] == [] and s["leaderboard"] == "robustbench-corruptions" and "--limit N" in s["description"]
    bad = tmp_path / "bad.toml"
    bad.write_text('leaderboard = "robustbench-corruptions"\n[[attack]]\nname = "pgd"\n')
    with pytest.raises(UserError, match="runs no attacks"):
        load_suite(str(bad))
    with pytest.raises(UserError, match="Linf entry and --suite robustbench-corruptions its corruptions leaderboard"):
        build_spec("robustbench:Standard", dataset="cifar10", suite="robustbench-corruptions", dry_run=True)
    with pytest.raises(UserError, match="drop --subset"):
        build_spec(ENTRY, dataset="cifar10", suite="robustbench-corruptions", subset=5, dry_run=True)
    with pytest.raises(UserError, match="drop --benchmark corruptions"):
        build_spec(ENTRY, dataset="cifar10", suite="robustbench-corruptions", benchmark="corruptions", dry_run=True)
    spec = build_spec(ENTRY, dataset="imagenet", suite="robustbench-corruptions", limit=7, dry_run=True)
    assert spec.dataset == "imagenet-c" and spec.benchmark_options["dataset"]["sample_list"] == "robustbench"
    assert spec.benchmark_options["dataset"]["n_per_cell"] == 7

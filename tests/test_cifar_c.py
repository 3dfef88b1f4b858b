"""CIFAR-10-C / CIFAR-100-C as RobustBench scores them (issue 64): the released arrays read with RobustBench's row
arithmetic, each cell's accuracy equal to what RobustBench's own loader (``load_cifar10c`` / ``load_cifar100c`` of the
pinned release, offline) and ``clean_accuracy`` give on the same files and model; bad files refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import robustbench_pid as rbp
from robustbench_pid.core import robustbench as rb
from robustbench_pid.errors import UserError
from robustbench_pid.hub import robustbench_pkg as rp

from released_c import ROWS, disk_bytes, write_release
from test_robustbench_models import package  # noqa: F401  (the pinned release, fetched once; a fixture)

TESTS = Path(__file__).parent
CLI_MODEL = ["--model", "timm:pid_deit_digits_patch4_32", "--checkpoint", "embedded:pid_deit_digits"]  # 32 px, 10 classes


def _env() -> dict:
    dead = "http://127.0.0.1:9"  # every proxy at a closed port: a download attempt fails loudly
    return {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead,
            "NO_PROXY": "", "no_proxy": "", "ROBUSTBENCH_PID_PACKAGES": str(rp.packages_dir()), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")])}


SCRIPT = r"""
import json, sys, torch
import robustbench_pid as rbp
from robustbench_pid.hub.robustbench_pkg import import_robustbench
from released_c import TinyNet
root, run, base, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import_robustbench()
from robustbench import data as rbdata
from robustbench.utils import clean_accuracy
load = {"cifar10": rbdata.load_cifar10c, "cifar100": rbdata.load_cifar100c}[base]
torch.manual_seed(0)
model = TinyNet(10 if base == "cifar10" else 100).eval()
ref = {}
for c in rbdata.CORRUPTIONS:
    for s in range(1, 6):
        x, y = load(n, s, root, False, [c])
        ref[f"{c}/{s}"] = 100 * clean_accuracy(model, x, y, batch_size=7, device=torch.device("cpu"))
df = rbp.evaluate(model, dataset=base, suite="robustbench-corruptions", data_root=root, limit=n, device="cpu",
                  out=run, quiet=True, batch_size=64)
top1 = df[df.metric == "top1"].set_index("attack")["value"].to_dict()
acc = float(df[df.metric == "corruptions_acc"]["value"].iloc[0])
print(json.dumps({"ref": ref, "top1": top1, "acc": acc, "order": list(rbdata.CORRUPTIONS)}))
"""


@pytest.mark.parametrize("base", ["cifar10", "cifar100"])
def test_each_cell_equals_robustbench_own_loader_and_clean_accuracy(package: Path, tmp_path: Path, base: str) -> None:
    n = 12
    root = write_release(tmp_path / "data", base, n=n)
    assert sum(disk_bytes(root / ("CIFAR-10-C" if base == "cifar10" else "CIFAR-100-C")).values()) < 20e6  # sparse
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(root), str(tmp_path / "run"), base, str(n)],
                         capture_output=True, text=True, env=_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["order"] == rb.corruption_order()
    assert len(got["ref"]) == 75 and len({round(v, 6) for v in got["ref"].values()}) > 3  # cells really differ
    for cell, want in got["ref"].items():
        assert got["top1"][cell] == pytest.approx(want, abs=1e-9), cell
    assert got["acc"] == pytest.approx(float(np.mean(list(got["ref"].values()))), abs=1e-9)


def test_rows_follow_robustbench_arithmetic_and_records_name_their_source(tmp_path: Path) -> None:
    root = write_release(tmp_path / "d", n=4)
    ds = rbp.load_dataset("cifar10-c", root=str(root), n_per_cell=4)
    assert len(ds) == 76 * 4 and ds.conditions[0] == "clean" and ds.conditions[4] == "shot_noise/1"
    arr = np.load(root / "CIFAR-10-C" / "fog.npy", mmap_mode="r")
    labels = np.load(root / "CIFAR-10-C" / "labels.npy")
    i = 1 + 4 * ds.conds.index("fog/3") + 2 - 1  # image j=2 of fog at severity 3
    cond, j, row = ds.where(i)
    assert (cond, j, row) == ("fog/3", 2, 2 * ROWS + 2)
    x, y = ds[i]
    assert np.array_equal((x.numpy() * 255).round().astype(np.uint8).transpose(1, 2, 0), arr[row]) and y == labels[j]
    batch = ds.__getitems__(list(range(4, 12)))  # two cells in one batch
    assert [int(b[1]) for b in batch] == [int(v) for v in labels[:4]] * 2
    cols = ds.record_columns([ds.sample_ids[i]])
    st = (root / "CIFAR-10-C" / "fog.npy").stat()
    assert cols == {"row": [row], "file": ["fog.npy"], "file_size": [st.st_size], "file_mtime_ns": [st.st_mtime_ns]}
    cb = (root / "cifar-10-batches-py" / "test_batch").stat()
    assert ds.record_columns(["clean/test/1"]) == {"row": [1], "file": ["test_batch"], "file_size": [cb.st_size],
                                                   "file_mtime_ns": [cb.st_mtime_ns]}
    assert ds.provenance["ignored_files"] == ["gaussian_blur.npy", "saturate.npy", "spatter.npy", "speckle_noise.npy"]


def _damage(root: Path, how: str) -> str:
    folder = root / "CIFAR-10-C"
    if how == "missing":
        (folder / "snow.npy").unlink()
        return "snow.npy"
    if how == "truncated":
        with open(folder / "frost.npy", "r+b") as f:
            f.truncate(1_000_000)
        return "frost.npy is truncated"
    if how == "damaged":
        with open(folder / "pixelate.npy", "r+b") as f:
            f.write(b"garbage!")
        return "pixelate.npy is not a readable .npy"
    if how == "shape":
        np.save(folder / "contrast.npy", np.zeros((10, 32, 32, 3), np.uint8))
        return "contrast.npy holds a (10, 32, 32, 3)"
    labels = np.load(folder / "labels.npy")
    labels[123] = 10
    np.save(folder / "labels.npy", labels)
    return "label 10 at row 123"


@pytest.mark.parametrize("how", ["missing", "truncated", "damaged", "shape", "label"])
def test_a_bad_file_is_one_error_line_exit_2_and_nothing_looks_complete(tmp_path: Path, how: str) -> None:
    root = write_release(tmp_path / "d", n=2)
    want = _damage(root, how)
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", *CLI_MODEL, "--dataset", "cifar10", "--suite", "robustbench-corruptions", "--data-root",
                          str(root), "--limit", "2", "--device", "cpu", "--quiet", "--out", str(run)],
                         capture_output=True, text=True, env=_env(), timeout=300)
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-2000:]
    assert want in errors[0], errors[0]
    assert not (run / "summary.csv").exists() and not (run / "records.parquet").exists()


def test_the_four_extra_files_are_ignored_and_a_missing_one_is_not_an_error(tmp_path: Path) -> None:
    root = write_release(tmp_path / "d", n=2)
    (root / "CIFAR-10-C" / "saturate.npy").unlink()
    (root / "CIFAR-10-C" / "spatter.npy").write_bytes(b"not an array")  # never read
    ds = rbp.load_dataset("cifar10-c", root=str(root), n_per_cell=2)
    assert list(ds.arrays) == rb.corruption_order()


def test_limit_is_per_cell_under_the_suite_only(tmp_path: Path) -> None:
    from robustbench_pid.run.spec_builder import build_spec

    spec = build_spec("deit", dataset="cifar10", suite="robustbench-corruptions", limit=3, dry_run=True)
    assert (spec.dataset, spec.benchmark, spec.limit) == ("cifar10-c", "robustbench_corruptions", None)
    assert spec.benchmark_options["dataset"] == {"n_per_cell": 3}
    with pytest.raises(UserError, match="--suite robustbench-corruptions --limit 3"):
        build_spec("deit", dataset="cifar10-c", limit=3, dry_run=True)
    with pytest.raises(UserError, match="1..10,000"):
        build_spec("deit", dataset="cifar10", suite="robustbench-corruptions", limit=20000, dry_run=True)
    with pytest.raises(UserError, match="no corruptions leaderboard|has no corruptions leaderboard"):
        build_spec("deit", dataset="digits", suite="robustbench-corruptions", dry_run=True)

"""RobustBench's zoo as a model source (issue 55 item 1): ``--model robustbench:[THREAT/]NAME`` loads the entry
through RobustBench's own loader (the pinned release, fetched as a file and imported beside this project), from a
checkpoint in RobustBench's ``<dir>/<dataset>/<threat>/<NAME>.pt`` layout, offline; a missing file is one line
naming the path. The pinned release is fetched once into the user cache (CI downloads it; these tests skip only
when PyPI cannot be reached, and say so)."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from robustbench_pid.errors import UserError
from robustbench_pid.hub import robustbench_pkg as rp
from robustbench_pid.hub.pypi import PyPIUnreachable
from robustbench_pid.models.robustbench import Entry, parse

ENTRY = "Ding2020MMA"  # the smallest single-file CIFAR-10 L-inf entry of the release (a WRN-28-4, 5.8M parameters)


@pytest.fixture(scope="module")
def package() -> Path:
    try:
        return rp.fetch_package()
    except PyPIUnreachable as exc:
        pytest.skip(f"PyPI unreachable, so RobustBench's pinned release cannot be fetched: {exc}")


def _env(tmp_path: Path) -> dict:
    """A subprocess environment with every proxy pointing at a closed port: a download attempt fails loudly."""
    dead = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead,
           "NO_PROXY": "", "no_proxy": "", "ROBUSTBENCH_PID_PACKAGES": str(rp.packages_dir()),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return env


def _cifar(root: Path, n: int = 12) -> Path:
    rng = np.random.default_rng(0)
    data, labels = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, n)]
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"batch_label": "t", "labels": labels, "data": data,
                     "filenames": [f"{i}.png" for i in range(n)]}, f, protocol=2)
    return root


def test_entry_names_parse_without_the_package() -> None:
    assert parse("robustbench:Standard", "cifar10") == Entry("Standard", "Linf", "cifar10")
    assert parse("robustbench:L2/Rony2019Decoupling", "cifar10").alias == "robustbench:L2/Rony2019Decoupling"
    assert parse("robustbench:Linf/Standard", "imagenet").alias == "robustbench:Standard"
    with pytest.raises(UserError, match="unknown RobustBench threat model 'L1'"):
        parse("robustbench:L1/Standard", "cifar10")
    with pytest.raises(UserError, match="not 'digits'"):
        parse("robustbench:Standard", "digits")
    with pytest.raises(UserError, match="expected robustbench:NAME"):
        parse("robustbench:", "cifar10")
    assert Entry("X", "L2", "cifar100").layout_path("/m") == Path("/m/cifar100/L2/X.pt")


def test_without_the_fetched_release_the_error_says_how_to_fetch_it(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="robustbench-pid fetch robustbench-package"):
        rp.import_robustbench(tmp_path / "empty")


def test_another_robustbench_imported_first_is_refused(package: Path, monkeypatch) -> None:
    import types

    other = types.ModuleType("robustbench")
    other.__file__ = "/site-packages/robustbench/__init__.py"  # torchattacks' bundled copy, say
    monkeypatch.setitem(sys.modules, "robustbench", other)
    with pytest.raises(UserError, match="another robustbench .*site-packages.* fresh process"):
        rp.import_robustbench()


def test_extraction_keeps_only_the_package_and_a_wheel_without_it_is_refused(tmp_path: Path, monkeypatch) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("robustbench/__init__.py", "")
        z.writestr("robustbench/utils.py", "X = 1\n")
        z.writestr("../escape.py", "bad")
        z.writestr("robustbench-1.1.1.dist-info/METADATA", "m")
    monkeypatch.setattr(rp, "download", lambda pin, root, index_url=None: wheel)
    got = rp.fetch_package(tmp_path / "cache")
    assert sorted(p.name for p in got.iterdir()) == [rp.MARKER, "robustbench"]
    assert not (tmp_path / "escape.py").exists() and rp.installed(tmp_path / "cache") == got
    empty = tmp_path / "e.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("other/__init__.py", "")
    monkeypatch.setattr(rp, "download", lambda pin, root, index_url=None: empty)
    with pytest.raises(rp.PinnedFileError, match="no robustbench/__init__.py"):
        rp.fetch_package(tmp_path / "cache2")
    assert rp.installed(tmp_path / "cache2") is None and not rp.package_dir(tmp_path / "cache2").exists()


def test_fetch_command_reuses_a_verified_wheel_without_the_network(package: Path, tmp_path: Path) -> None:
    to = tmp_path / "pk"
    to.mkdir()
    (to / rp.ROBUSTBENCH.file).write_bytes((rp.packages_dir() / rp.ROBUSTBENCH.file).read_bytes())
    out = subprocess.run([sys.executable, "-m", "robustbench_pid", "fetch", "robustbench-package", "--to", str(to)],
                         capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"sha256 ok ({rp.ROBUSTBENCH.sha256})" in out.stdout and rp.installed(to) is not None


SCRIPT = r"""
import hashlib, json, sys, torch
import robustbench_pid as rbp
from robustbench_pid.hub.robustbench_pkg import import_robustbench
root, data, run = sys.argv[1:4]
import_robustbench()
from robustbench.model_zoo import model_dicts
from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel
torch.manual_seed(0)
ref = model_dicts[BenchmarkDataset("cifar10")][ThreatModel("Linf")]["ENTRY"]["model"]().eval()
with torch.no_grad():  # random weights, made distinguishable from a fresh initialisation
    for p in ref.parameters():
        p.add_(0.01 * torch.randn_like(p))
path = f"{root}/cifar10/Linf/ENTRY.pt"
import os; os.makedirs(os.path.dirname(path))
torch.save({"state_dict": {"module." + k: v for k, v in ref.state_dict().items()}}, path)  # as RobustBench's files
m = rbp.load_model("robustbench:ENTRY", dataset="cifar10", checkpoint_dir=root)
x = torch.rand(3, 3, 32, 32)
with torch.no_grad():
    same = torch.equal(m(x), ref(x))
ds = rbp.load_dataset("cifar10", "test", data)
xs = torch.stack([ds[i][0] for i in range(len(ds))]); ys = torch.tensor([ds[i][1] for i in range(len(ds))])
with torch.no_grad():
    direct = float((ref(xs).argmax(1) == ys).float().mean() * 100)
df = rbp.evaluate("robustbench:ENTRY", attack="pgd", eps="8/255", steps=3, dataset="cifar10", data_root=data,
                  checkpoint_dir=root, out=run, device="cpu", quiet=True)
clean = float(df[(df.attack == "clean") & (df.metric == "top1")].value.iloc[0])
rec = rbp.load_records(run)
print(json.dumps({"same": same, "info": {k: m.info[k] for k in ("model", "checkpoint_sha256", "input_size", "mean")},
                  "sha": hashlib.sha256(open(path, "rb").read()).hexdigest(), "direct": direct, "clean": clean,
                  "models": sorted(set(rec.model)), "shas": sorted(set(rec.checkpoint_sha256))}))
""".replace("ENTRY", ENTRY)


def test_a_checkpoint_in_robustbench_layout_loads_through_its_loader_and_evaluates_offline(package: Path,
                                                                                          tmp_path: Path) -> None:
    """The harness's model is RobustBench's module with the file's weights (same logits), takes [0, 1] images
    (identity normalisation outside: the entry's own inside), and its records carry the entry and the file's
    sha256; the clean accuracy re-scores against the module called directly. Every proxy points at a closed port."""
    data = _cifar(tmp_path / "data")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "models"), str(data), str(tmp_path / "run")],
                         capture_output=True, text=True, env=_env(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    noise = [line for line in out.stderr.splitlines() if "FutureWarning" in line or "DeprecationWarning" in line]
    assert noise == [], noise  # RobustBench's imports of moved timm modules stay off the screen (issue 65)
    assert got["same"] is True
    assert got["info"] == {"model": f"robustbench:{ENTRY}", "checkpoint_sha256": got["sha"], "input_size": [3, 32, 32],
                           "mean": [0.0, 0.0, 0.0]}
    assert got["models"] == [f"robustbench:{ENTRY}"] and got["shas"] == [got["sha"]]
    assert got["clean"] == pytest.approx(got["direct"])


def test_a_missing_checkpoint_is_one_line_naming_the_path_and_a_dry_run_plans_without_it(package: Path,
                                                                                        tmp_path: Path) -> None:
    data = _cifar(tmp_path / "data")
    base = [sys.executable, "-m", "robustbench_pid", "evaluate", "--model", f"robustbench:{ENTRY}", "--dataset",
            "cifar10", "--data-root", str(data), "--checkpoint-dir", str(tmp_path / "none"), "--attack", "pgd",
            "--eps", "8/255", "--device", "cpu", "--quiet", "--out", str(tmp_path / "run")]
    out = subprocess.run(base, capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    want = tmp_path / "none" / "cifar10" / "Linf" / f"{ENTRY}.pt"
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(want) in errors[0], out.stderr[-2000:]
    assert not (tmp_path / "run" / "records.parquet").exists()
    plan = subprocess.run(base + ["--dry-run"], capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "no weights loaded" in plan.stdout + plan.stderr


def test_a_pickled_checkpoint_is_refused_unless_the_user_opts_in(package: Path, tmp_path: Path) -> None:
    script = r"""
import sys, torch, argparse
import robustbench_pid as rbp
from robustbench_pid.errors import UserError
from robustbench_pid.hub.robustbench_pkg import import_robustbench
import_robustbench()
from robustbench.model_zoo import model_dicts
from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel
root = sys.argv[1]
ref = model_dicts[BenchmarkDataset("cifar10")][ThreatModel("Linf")]["ENTRY"]["model"]()
import os; os.makedirs(f"{root}/cifar10/Linf")
torch.save({"state_dict": ref.state_dict(), "args": argparse.Namespace(lr=0.1)}, f"{root}/cifar10/Linf/ENTRY.pt")
try:
    rbp.load_model("robustbench:ENTRY", dataset="cifar10", checkpoint_dir=root)
    print("loaded")
except UserError as exc:
    print("refused:", exc)
m = rbp.load_model("robustbench:ENTRY", dataset="cifar10", checkpoint_dir=root, allow_pickle=True)
print("opted in:", m.info["model"])
""".replace("ENTRY", ENTRY)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m")], capture_output=True, text=True,
                         env=_env(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2].startswith("refused:") and "--allow-pickle" in lines[-2]
    assert lines[-1] == f"opted in: robustbench:{ENTRY}"


def test_the_pinned_wheel_is_the_published_one(package: Path) -> None:
    wheel = rp.packages_dir() / rp.ROBUSTBENCH.file
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == rp.ROBUSTBENCH.sha256
    assert (package / "robustbench" / "utils.py").is_file()

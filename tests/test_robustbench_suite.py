"""--suite robustbench: AutoAttack (standard) at the leaderboard's eps on its exact sample set. ImageNet: the 5,000
ids of RobustBench's list, in its order, on a generated ImageNet tree (missing images named, never skipped);
CIFAR-10: the test set in the batches' order, from generated pickled batches or a PNG folder; provenance says
whether a run is RobustBench-comparable."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import robustbench_pid as rbp
from robustbench_pid.core import robustbench as rb
from robustbench_pid.core.imagenet_info import wnid_to_index
from robustbench_pid.data import dataset_info
from robustbench_pid.errors import UserError
from robustbench_pid.run.suites import leaderboard_provenance, load_suite

CLASSES = rb.cifar10()["classes"]


def _cifar_arrays(n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, size=n)]


def _pickles(root: Path, data, labels) -> Path:
    """A test_batch in the python version's layout (a dict with 'data' (n, 3072) uint8 and 'labels')."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"batch_label": "testing batch 1 of 1", "labels": labels, "data": data,
                     "filenames": [f"img_{i}.png" for i in range(len(labels))]}, f, protocol=2)
    return root


def _pngs(root: Path, data, labels) -> Path:
    """The same images as a folder: test/<class>/<name><index>.png, written in shuffled order."""
    for i in np.random.default_rng(1).permutation(len(labels)):
        path = root / "test" / CLASSES[labels[i]] / f"{CLASSES[labels[i]]}_s{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(data[i].reshape(3, 32, 32).transpose(1, 2, 0)).save(path)
    return root


def test_cifar10_pickles_and_pngs_give_the_same_samples_in_the_batch_order(tmp_path):
    data, labels = _cifar_arrays()
    a = rbp.load_dataset("cifar10", "test", str(_pickles(tmp_path / "pk", data, labels)))
    b = rbp.load_dataset("cifar10", "test", str(_pngs(tmp_path / "png", data, labels)))
    assert a.sample_ids == b.sample_ids == [f"test/{i}" for i in range(12)]
    for i in range(12):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert ya == yb == labels[i] and xa.shape == (3, 32, 32)
        assert np.array_equal(xa.numpy(), xb.numpy())
        assert np.array_equal(np.round(xa.numpy() * 255).astype(np.uint8).reshape(-1), data[i])
    assert a.provenance["published_md5"] is False and a.provenance["partial"] == {"found": 12, "published": 10000}


def test_cifar10_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({"data": Payload(), "labels": [0]}, protocol=2))
    with pytest.raises(UserError, match="is not allowed in a CIFAR batch") as exc:
        rbp.load_dataset("cifar10", "test", str(tmp_path))
    assert not marker.exists() and "\n" not in str(exc.value)


@pytest.mark.parametrize("name,needle", [("truck/picture.png", "has no index at the end of its name"),
                                         ("truck/7.png", "index 7 is taken by both"),
                                         ("boats/99.png", "is no CIFAR-10 class")])
def test_cifar10_folder_refuses_what_hides_the_order(tmp_path, name, needle):
    data, labels = _cifar_arrays(8)
    root = _pngs(tmp_path, data, [7] * 8)
    path = root / "test" / name
    path.parent.mkdir(exist_ok=True)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(path)
    with pytest.raises(UserError, match=needle):
        rbp.load_dataset("cifar10", "test", str(root))


def _imagenet_tree(root: Path, ids, real: int = 0) -> Path:
    """Every listed id as a file; the first ``real`` are small JPEGs, the rest empty (never decoded here)."""
    for k, i in enumerate(ids):
        path = root / "val" / i
        path.parent.mkdir(parents=True, exist_ok=True)
        if k < real:
            Image.fromarray(np.full((20, 24, 3), 40 * k, np.uint8)).save(path)
        else:
            path.touch()
    return root


def test_imagenet_subset_missing_images_are_named_never_skipped(tmp_path):
    ids = rb.imagenet_subset()
    assert len(ids) == 5000 and len(set(ids)) == 5000
    gone = [ids[10], ids[2500], ids[4999], ids[7]]
    root = _imagenet_tree(tmp_path, [i for i in ids if i not in gone])
    with pytest.raises(UserError) as exc:
        rbp.load_dataset("imagenet", "val", str(root), model_info={}, sample_list="robustbench")
    msg = str(exc.value)
    assert "4 of the 5,000 images of RobustBench's ImageNet subset are missing" in msg and "\n" not in msg
    assert f"e.g. {ids[7]}, {ids[10]}, {ids[2500]}" in msg  # the first few, in the list's order


def test_imagenet_suite_runs_the_list_in_its_order_and_records_comparability(tmp_path):
    ids = rb.imagenet_subset()
    root = _imagenet_tree(tmp_path / "data", ids, real=3)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "timm:test_vit", "--dataset",
                        "imagenet", "--data-root", str(root), "--suite", "robustbench", "--limit", "3", "--quiet",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rec = rbp.load_records(out)
    aa = rec[rec["attack"] == "autoattack"]
    assert aa["sample_id"].tolist() == list(ids[:3])
    assert aa["label"].tolist() == [wnid_to_index()[i.split("/")[0]] for i in ids[:3]]
    assert aa["eps"].unique().tolist() == pytest.approx([4 / 255])
    info = json.loads((out / "run.json").read_text())
    board = info["leaderboard"]
    assert board["name"] == "robustbench" and board["eps"] == "4/255" and board["comparable"] is False
    assert board["reasons"] == ["3 of the leaderboard's 5,000 images (--limit)"]
    assert rb.facts()["source"]["commit"] in board["source"]
    listed = info["dataset_provenance"]["sample_list"]
    assert listed["sha256"] == "d4121626d07722a0126c35b1563042e46a546f1a05ce705f2cdc635896d58574"


def test_cifar10_suite_runs_at_8_255_and_says_why_it_is_not_comparable(tmp_path):
    data, labels = _cifar_arrays(10)
    root = _pickles(tmp_path / "data", data, labels)
    out = tmp_path / "run"
    rbp.evaluate(model="timm:pid_deit_digits_patch4_32", checkpoint="embedded:pid_deit_digits", dataset="cifar10",
                 data_root=str(root), suite="robustbench", limit=4, save_adv=True, out=out, quiet=True)
    rec = rbp.load_records(out)
    assert rec.loc[rec["attack"] == "autoattack", "eps"].unique().tolist() == pytest.approx([8 / 255])
    assert rec.loc[rec["attack"] == "autoattack", "sample_id"].tolist() == [f"test/{i}" for i in range(4)]
    board = json.loads((out / "run.json").read_text())["leaderboard"]
    assert board["comparable"] is False and board["reasons"] == [
        "4 of the leaderboard's 10,000 images (--limit)", "the cifar10 files are not the published ones (md5)"]
    with pytest.warns(UserWarning, match="fields the run cannot know"):
        done = rbp.export_robustbench(out, tmp_path / "rb", model_id="Mine2025Digits")
    entry = done.entry
    assert (tmp_path / "rb" / "model_info" / "cifar10" / "Linf" / "Mine2025Digits.json").is_file()
    assert entry["dataset"] == "cifar10" and entry["eps"] == "8/255"
    assert "not RobustBench-comparable: 4 of the leaderboard's 10,000 images (--limit)" in entry["footnote"]


def test_a_full_published_run_is_comparable():
    spec = SimpleNamespace(suite="robustbench", dataset="cifar10", limit=None, precision="fp32")
    got = leaderboard_provenance(spec, 10000, {"published_md5": True})
    assert got["comparable"] is True and got["reasons"] == [] and got["eps"] == "8/255" and got["n"] == 10000
    bf16 = leaderboard_provenance(SimpleNamespace(**{**vars(spec), "precision": "bf16"}), 10000, {})
    assert bf16["comparable"] is False and "--precision bf16" in bf16["reasons"][0]
    assert leaderboard_provenance(SimpleNamespace(**{**vars(spec), "suite": "autoattack"}), 10000, {}) is None


def test_the_suite_is_refused_where_it_would_measure_something_else(tmp_path):
    from robustbench_pid.run.spec_builder import build_spec

    with pytest.raises(UserError, match="RobustBench has no Linf leaderboard this project can run on dataset 'digits'"):
        build_spec("pid_deit", suite="robustbench")
    with pytest.raises(UserError, match="drop --subset"):
        build_spec("pid_deit", suite="robustbench", dataset="imagenet", data_root=str(tmp_path), subset=10)
    with pytest.raises(UserError, match="use --protocol standard"):
        build_spec("pid_deit", suite="robustbench", dataset="imagenet", data_root=str(tmp_path), protocol="paper")
    spec = build_spec("pid_deit", suite="robustbench", dataset="imagenet", data_root=str(tmp_path))
    assert spec.benchmark_options["dataset"] == {"sample_list": "robustbench"}
    assert [(a.attack, a.params["eps"]) for a in spec.attacks] == [("autoattack", pytest.approx(4 / 255))]
    with pytest.raises(UserError, match="does not take a sample list"):
        rbp.load_dataset("imagenet-v2", "test", str(tmp_path), sample_list="robustbench")
    bad = tmp_path / "lb.toml"
    bad.write_text('leaderboard = "robustbench"\n[[attack]]\nname = "autoattack"\neps = "8/255"\n')
    with pytest.raises(UserError, match="a leaderboard suite takes the leaderboard's eps"):
        load_suite(str(bad), "imagenet")
    bad.write_text('leaderboard = "elsewhere"\n[[attack]]\nname = "autoattack"\n')
    with pytest.raises(UserError, match="'elsewhere' is not a leaderboard this project knows"):
        load_suite(str(bad))


def _cifar100_pickles(root: Path, data, labels, key: str = "fine_labels") -> Path:
    """cifar-100-python/test in the python version's layout ('data', 'fine_labels', 'coarse_labels', 'filenames')."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    with open(folder / "test", "wb") as f:
        pickle.dump({"batch_label": "testing batch 1 of 1", key: labels, "coarse_labels": [v // 5 for v in labels],
                     "data": data, "filenames": [f"img_{i}.png" for i in range(len(labels))]}, f, protocol=2)
    return root


def test_cifar100_pickles_and_pngs_give_the_same_samples_in_the_published_order(tmp_path):
    fine = rb.cifar("cifar100")["classes"]
    assert len(fine) == 100 and fine[0] == "apple" and fine[99] == "worm" and fine == sorted(fine)
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=(9, 3072), dtype=np.uint8)
    labels = [0, 99, 42, 7, 63, 99, 11, 58, 30]  # beyond CIFAR-10's 0..9
    a = rbp.load_dataset("cifar100", "test", str(_cifar100_pickles(tmp_path / "pk", data, labels)))
    for i in np.random.default_rng(1).permutation(len(labels)):  # the same images as test/<class>/<name><index>.png
        path = tmp_path / "png" / "test" / fine[labels[i]] / f"{fine[labels[i]]}_{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(data[i].reshape(3, 32, 32).transpose(1, 2, 0)).save(path)
    b = rbp.load_dataset("cifar100", "test", str(tmp_path / "png"))
    assert a.sample_ids == b.sample_ids == [f"test/{i}" for i in range(9)]
    for i in range(9):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert ya == yb == labels[i] and np.array_equal(xa.numpy(), xb.numpy())
        assert np.array_equal(np.round(xa.numpy() * 255).astype(np.uint8).reshape(-1), data[i])
    assert a.provenance["dataset"] == "cifar100" and a.provenance["published_md5"] is False
    assert dataset_info("cifar100").num_classes == 100 and dataset_info("cifar10").num_classes == 10


def test_a_cifar100_file_without_fine_labels_or_with_a_label_past_99_is_refused_in_one_line(tmp_path):
    data = np.zeros((2, 3072), np.uint8)
    with pytest.raises(UserError, match="must be the python version's pickled file \\(cifar-100-python/, with "
                                        "'fine_labels'\\)") as exc:
        rbp.load_dataset("cifar100", "test", str(_cifar100_pickles(tmp_path / "a", data, [1, 2], key="labels")))
    assert "\n" not in str(exc.value)
    with pytest.raises(UserError, match="2 images but 2 labels in 0..99"):
        rbp.load_dataset("cifar100", "test", str(_cifar100_pickles(tmp_path / "b", data, [1, 100])))
    with pytest.raises(UserError, match="is no CIFAR-100 class"):
        (tmp_path / "c" / "test" / "airplane").mkdir(parents=True)
        rbp.load_dataset("cifar100", "test", str(tmp_path / "c"))


def test_the_cifar100_leaderboard_plans_its_10000_test_images_at_8_255_in_a_dry_run_without_the_data():
    board = rb.leaderboard("cifar100")
    assert (board["threat_model"], board["eps"], board["n"]) == ("Linf", "8/255", 10000)
    r = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "timm:test_vit", "--dataset",
                        "cifar100", "--suite", "robustbench", "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "planned at its published size, 10,000 samples" in out and "on cifar100 (test), 10000 samples" in out
    units = [line for line in out.splitlines() if " autoattack " in line and " todo " in line]
    assert units and all(" 8/255 " in u for u in units)
    spans = [u.split()[5].split(":") for u in units]  # unit, shard, attack, eps, condition, samples a:b
    assert sum(int(b) - int(a) for a, b in spans) == 10000

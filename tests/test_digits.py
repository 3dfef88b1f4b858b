"""The embedded digits default: deterministic, stratified split; embedded checkpoints verified."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from robustbench_pid import load_dataset, load_model
from robustbench_pid.hub.checkpoints import checkpoints_dir, read_manifest
from robustbench_pid.data.digits import split_indices
from robustbench_pid.errors import CheckpointError, UserError


def test_split_is_deterministic_stratified_and_disjoint() -> None:
    from sklearn.datasets import load_digits

    y = load_digits().target
    s = split_indices()
    train, test = s["train"], s["test"]
    assert len(train) == 1437 and len(test) == 360
    assert not set(train) & set(test) and len(set(train) | set(test)) == 1797
    # stratified: every class's share in test is within one sample of its share overall
    for c in range(10):
        expected = (y == c).sum() * 360 / 1797
        assert abs((y[test] == c).sum() - expected) <= 1
    # deterministic: rebuilt from scratch gives the same rows (cache cleared)
    split_indices.cache_clear()
    again = split_indices()
    assert np.array_equal(again["test"], test) and np.array_equal(again["train"], train)


def test_dataset_images_labels_ids() -> None:
    ds = load_dataset("digits", "test")
    assert len(ds) == 360 and ds.images.shape == (360, 3, 32, 32)
    assert ds.images.min() >= 0 and ds.images.max() <= 1 and ds.images.max() > 0.9
    assert torch.equal(ds.images[:, 0], ds.images[:, 1])  # grey in 3 channels
    x, y = ds[5]
    assert x.shape == (3, 32, 32) and isinstance(y, int)
    from sklearn.datasets import load_digits

    assert y == load_digits().target[int(ds.sample_ids[5])]
    with pytest.raises(UserError, match="no split"):
        load_dataset("digits", "validation")


@pytest.mark.parametrize("name", ["deit_digits", "pid_deit_digits"])
def test_embedded_checkpoints_verify_and_reach_manifest_accuracy(name: str, digits_test) -> None:
    entry = read_manifest()[name]
    assert entry["clean_test_top1"] >= 0.93
    assert entry["dataset"] == "digits" and entry["split"]["n_test"] == 360
    for key in ("arch", "arch_kwargs", "recipe", "sha256", "versions"):
        assert key in entry
    model = load_model(entry["model"])
    assert model.info["checkpoint_sha256"] == entry["sha256"]
    with torch.inference_mode():
        pred = model(digits_test.images).argmax(1)
    acc = (pred == digits_test.labels).float().mean().item()
    assert acc == pytest.approx(entry["clean_test_top1"], abs=1e-6)
    if entry["model"] == "pid_deit":
        assert model.info["arch_kwargs"]["pid"] == {"lambda_p": 0.8, "lambda_i": 0.5, "lambda_d": 0.05,
                                                    "beta": 0.1, "first_derivative": "zero-error"}


def test_tampered_checkpoint_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(checkpoints_dir(), tmp_path / "ck")
    target = tmp_path / "ck" / "deit_digits.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    monkeypatch.setattr("robustbench_pid.hub.checkpoints.shipped_dir", lambda name: tmp_path / "ck")
    with pytest.raises(CheckpointError, match="sha256"):
        load_model("deit")


def test_models_take_unit_range_and_normalize_inside(deit_model) -> None:
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        direct = deit_model.net((x - 0.5) / 0.5)
        wrapped = deit_model(x)
    torch.testing.assert_close(direct, wrapped)
    assert not any(p.requires_grad for p in deit_model.parameters())
    assert not deit_model.training


def test_imagenet_alias_needs_checkpoint() -> None:
    from robustbench_pid.models.zoo import resolve_model

    with pytest.raises(UserError, match="--checkpoint"):
        resolve_model("pid_deit", "imagenet")
    r = resolve_model("pid_deit", "digits")
    assert r.arch == "pid_deit_digits_patch4_32" and r.checkpoint == "embedded:pid_deit_digits"
    assert resolve_model("deit", "imagenet", "x.pth").arch == "deit_tiny_patch16_224"

"""Training any zoo family: pinned recipes (both sides of each claim identical), a tiny run of a new
family end to end (manifest record = the file it wrote), and bad input refused where it enters."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from robustbench_pid.cli import main
from robustbench_pid.errors import UserError
from robustbench_pid.models.zoo import zoo
from robustbench_pid.studies.spec import load_study
from robustbench_pid.train import FAMILIES, Recipe, embedded_name, family_of, recipe_for, train, trainable

ROOT = Path(__file__).resolve().parents[1]


def test_every_alias_has_one_family_and_its_embedded_default_is_what_train_writes() -> None:
    members = [m for ms, _ in FAMILIES.values() for m in ms]
    assert sorted(members) == sorted(set(members)) == sorted(zoo.names()) == list(trainable())
    assert len(members) == 16  # 13 architectures, softmax / PID DeiT trained adversarially, and the CNN (cnn_at)
    for alias in zoo.names():
        assert zoo.get(alias).default_checkpoints["digits"] == f"embedded:{embedded_name(alias)}"


def test_both_sides_of_every_claim_train_with_the_same_recipe() -> None:
    study = load_study("claims-digits")
    model = {c.name: c.model for c in study.columns}
    for p in study.pairs:
        a, b = model[p.baseline], model[p.method]
        assert family_of(a) == family_of(b), p.claim
        assert recipe_for(a) == recipe_for(b), p.claim
    # RPC-AsymViT is compared with softmax DeiT: it trains as DeiT does
    assert family_of("rpc_deit") == family_of("rpc_symasym_deit") == family_of("deit")


def test_a_tiny_run_of_a_new_family_records_what_it_wrote(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from robustbench_pid import load_dataset, load_model
    from robustbench_pid.loaders import sha256_file

    entry = train("rpc_symvit_all", Recipe(epochs=1, warmup_epochs=1, batch_size=16), tmp_path,
                  log=lambda *_: None, limit=32)
    path = tmp_path / entry["file"]
    assert entry["file"] == f"rpc_symvit_all_digits-{entry['sha256'][:12]}.safetensors"  # torch.hub's convention
    assert entry["sha256"] == sha256_file(path)
    assert entry["family"] == "symvit" and entry["model"] == "rpc_symvit_all"
    assert entry["split"]["n_train"] == 32 and entry["split"]["n_test"] == 360
    assert entry["recipe_is_pinned"] is False and entry["recipe"]["epochs"] == 1
    assert entry["arch_kwargs"]["rpc"] == {"pap_iterations": 2, "pap_lambda": 3.0, "rpc_layers": "all",
                                           "pap_convention": "authors"}
    assert set(entry["versions"]) >= {"torch", "timm", "scikit-learn", "robustbench_pid", "python"}
    assert json.loads((tmp_path / "manifest.json").read_text())["rpc_symvit_all_digits"] == entry
    assert all(torch.isfinite(t).all() for t in load_file(str(path)).values())
    # the recorded clean top-1 is the file's, measured independently on all 360 test digits
    model = load_model("rpc_symvit_all", str(path))
    ds = load_dataset("digits", "test")
    with torch.inference_mode():
        top1 = (model(ds.images).argmax(1) == ds.labels).double().mean().item()
    assert abs(top1 - entry["clean_test_top1"]) < 1e-6


def test_recipes_and_models_without_one_are_refused() -> None:
    with pytest.raises(UserError, match="epochs=0 must be >= 1"):
        Recipe(epochs=0)
    with pytest.raises(UserError, match="label_smoothing"):
        Recipe(label_smoothing=1.5)
    with pytest.raises(UserError, match="no training recipe for model 'vit_tiny'"):
        train("vit_tiny", None, Path("/nonexistent"))


def test_cli_train_takes_every_alias_and_refuses_bad_values(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(["train", "--model", "nope"])
    assert e.value.code == 2 and "rpc_symasym_deit" in capsys.readouterr().err
    assert main(["train", "--model", "symfan", "--epochs", "0", "--out", str(tmp_path)]) == 2
    assert "error: recipe epochs=0 must be >= 1" in capsys.readouterr().err
    assert main(["train", "--model", "symfan", "--limit", "0", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "manifest.json").exists()  # nothing half-written


@pytest.mark.slow
def test_retraining_a_family_with_its_pinned_recipe_gives_a_record_like_the_shipped_one(tmp_path: Path) -> None:
    """symvit with the pinned recipe (minutes): the record names the same recipe and split as the shipped
    entry, its clean top-1 is the file's (measured independently) and at least 95%. The sha256 itself may
    differ on another CPU type or library version (float rounding), so it is not compared."""
    from robustbench_pid import load_dataset, load_model
    from robustbench_pid.hub.checkpoints import read_manifest

    entry = train("symvit", None, tmp_path, log=lambda *_: None)
    shipped = read_manifest()["symvit_digits"]
    for key in ("recipe", "split", "family", "arch", "arch_kwargs", "recipe_is_pinned"):
        assert entry[key] == shipped[key], key
    model = load_model("symvit", str(tmp_path / entry["file"]))
    ds = load_dataset("digits", "test")
    with torch.inference_mode():
        top1 = (model(ds.images).argmax(1) == ds.labels).double().mean().item()
    assert abs(top1 - entry["clean_test_top1"]) < 1e-6 and top1 >= 0.95

"""`train` never loses the shipped weights, commits a checkpoint and its manifest entry together, refuses settings
that would train a NaN network, and a damaged manifest or checkpoint is one error line, never a traceback.

Trainings here run on 16 digits for one epoch (seconds); every folder is a tmp folder or the working folder of
the test, never the package's checkpoints/ (whose files the last test checks against their manifest)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

from robustbench_pid.cli import main
from robustbench_pid.errors import CheckpointError, UserError
from robustbench_pid.hub import checkpoints as ck
from robustbench_pid.train import Recipe, train
from robustbench_pid.train.recipes import Adversarial, alias_recipe, base_model, trained_alias

TINY = Recipe(epochs=1, warmup_epochs=1, batch_size=16)
QUIET = dict(log=lambda *_: None, limit=16)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_train_writes_to_a_folder_of_yours_by_default_never_the_package(tmp_path, monkeypatch, capsys):
    shipped = ck.checkpoints_dir()
    before = {p.name: _sha(p) for p in shipped.iterdir() if p.is_file()}
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--model", "deit", "--epochs", "1", "--warmup-epochs", "1", "--limit", "16"]) == 0
    entry = json.loads((tmp_path / "trained" / "manifest.json").read_text())["deit_digits"]
    assert (tmp_path / "trained" / entry["file"]).is_file()
    assert {p.name: _sha(p) for p in shipped.iterdir() if p.is_file()} == before  # the shipped files untouched
    # naming the package folder as --out is refused with the flag that does it on purpose
    assert main(["train", "--model", "deit", "--epochs", "1", "--out", str(shipped)]) == 2
    assert "--into-package" in capsys.readouterr().err
    assert main(["train", "--model", "deit", "--epochs", "1", "--out", ""]) == 2
    assert "--out '' names no folder" in capsys.readouterr().err
    assert main(["train", "--model", "deit", "--into-package", "--out", str(tmp_path / "x")]) == 2
    assert "drop --out" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["train", "--model", "deit", "--epochs", "1", "--out", str(tmp_path / "afile")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert {p.name: _sha(p) for p in shipped.iterdir() if p.is_file()} == before


def test_a_retraining_replaces_the_old_file_only_after_its_manifest_entry_is_in_place(tmp_path):
    first = train("deit", TINY, tmp_path, **QUIET)
    second = train("deit", Recipe(epochs=1, warmup_epochs=1, batch_size=16, seed=1), tmp_path, **QUIET)
    assert first["file"] != second["file"]  # another sha256, another file name
    assert not (tmp_path / first["file"]).exists() and (tmp_path / second["file"]).is_file()
    assert json.loads((tmp_path / "manifest.json").read_text())["deit_digits"]["sha256"] == second["sha256"]


@pytest.mark.parametrize("stage", ["weights", "manifest"])
def test_a_failure_at_either_write_leaves_the_old_checkpoint_and_entry_whole(tmp_path, monkeypatch, stage):
    old = train("deit", TINY, tmp_path, **QUIET)
    manifest_before = (tmp_path / "manifest.json").read_bytes()
    real_replace = os.replace

    def full_disk(src, dst, *a, **k):
        name = Path(dst).name
        if (stage == "weights" and name.endswith(".safetensors")) or (stage == "manifest" and name == "manifest.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(ck.os, "replace", full_disk)
    with pytest.raises(CheckpointError, match="no space left on the device.*nothing was changed there") as e:
        train("deit", Recipe(epochs=1, warmup_epochs=1, batch_size=16, seed=3), tmp_path, **QUIET)
    assert "work unit" not in str(e.value)  # train has none: the message is about the checkpoint
    assert (tmp_path / "manifest.json").read_bytes() == manifest_before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == sorted(
        [old["file"], "manifest.json"])  # no temporary or half-committed file left
    assert _sha(tmp_path / old["file"]) == old["sha256"]


def test_non_finite_or_out_of_range_training_settings_are_refused(tmp_path, capsys):
    for flag, value in (("--lr", "inf"), ("--weight-decay", "inf"), ("--lr", "nan"), ("--label-smoothing", "nan")):
        assert main(["train", "--model", "symfan", flag, value, "--out", str(tmp_path)]) == 2, flag
        assert "must be a finite number" in capsys.readouterr().err
    assert main(["train", "--model", "deit", "--adv-eps", "0.03", "--out", str(tmp_path)]) == 2
    assert "add --adversarial" in capsys.readouterr().err
    assert main(["train", "--model", "deit", "--adversarial", "--adv-eps", "inf", "--out", str(tmp_path)]) == 2
    assert "--adv-eps inf: must be a finite number" in capsys.readouterr().err
    assert main(["train", "--model", "deit", "--adversarial", "--adv-eps", "2", "--out", str(tmp_path)]) == 2
    assert "finite number in (0, 1]" in capsys.readouterr().err
    with pytest.raises(UserError, match="adversarial training needs steps >= 1"):
        Adversarial(steps=0)
    assert not (tmp_path / "manifest.json").exists()


def test_adversarial_members_and_flag_name_the_same_recipe():
    assert trained_alias("fan", True) == "fan_at" and trained_alias("deit_at", True) == "deit_at"
    assert base_model("pid_deit_at") == "pid_deit" and base_model("fan_at") == "fan"
    assert alias_recipe("deit_at") == alias_recipe("pid_deit_at")  # both sides of the AT claim train alike
    assert alias_recipe("deit_at").adversarial == Adversarial()
    assert alias_recipe("fan_at").epochs == alias_recipe("fan").epochs and alias_recipe("fan_at").adversarial
    assert Adversarial().eps_at(0) == pytest.approx(0.8 / 255) and Adversarial().eps_at(10) == pytest.approx(8 / 255)
    # the CNN has no plain member: cnn_at is its own family, trained adversarially at its large eps
    assert trained_alias("cnn_at", True) == trained_alias("cnn_at", False) == "cnn_at"
    assert base_model("cnn_at") == "cnn_at"
    assert alias_recipe("cnn_at").adversarial.eps == 6 * Adversarial().eps
    with pytest.raises(UserError, match="no training recipe for model 'cnn'"):
        trained_alias("cnn", True)


@pytest.mark.parametrize("content, needle", [
    (b"", "not valid JSON (empty"),
    (b'{"deit_digits": {"file": "a.safetensors", "sha', "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[]", "must be a JSON object"),
    (b'{"deit_digits": 3}', "entry 'deit_digits' must be an object"),
    (b'{"deit_digits": {"file": "deit_digits.safetensors"}}', "no sha256"),
    (b'{"deit_digits": {"file": "../x", "sha256": "' + b"0" * 64 + b'"}}', "no plain file name"),
])
def test_a_damaged_manifest_is_one_error_naming_the_fix(tmp_path, monkeypatch, content, needle, capsys):
    (tmp_path / "manifest.json").write_bytes(content)
    monkeypatch.setattr(ck, "checkpoints_dir", lambda: tmp_path)
    with pytest.raises(CheckpointError) as e:
        ck.read_manifest()
    assert needle in str(e.value)
    assert main(["evaluate", "--model", "deit", "--limit", "2", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err and "restore" in err


def test_a_truncated_checkpoint_whose_hash_was_edited_to_match_is_one_error(tmp_path, monkeypatch, capsys):
    shipped = ck.read_manifest()["deit_digits"]
    data = (ck.checkpoints_dir() / shipped["file"]).read_bytes()[:1000]
    (tmp_path / "deit_digits.safetensors").write_bytes(data)
    entry = {**shipped, "file": "deit_digits.safetensors", "sha256": hashlib.sha256(data).hexdigest()}
    (tmp_path / "manifest.json").write_text(json.dumps({"deit_digits": entry}))
    monkeypatch.setattr(ck, "checkpoints_dir", lambda: tmp_path)
    import robustbench_pid.loaders.embedded as emb

    monkeypatch.setattr(emb, "checkpoints_dir", lambda: tmp_path)
    assert main(["evaluate", "--model", "deit", "--limit", "2", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "not a readable safetensors file" in err and "Traceback" not in err and err.count("error:") == 1


def test_the_shipped_checkpoints_match_their_manifest():
    """Every shipped weights file is byte for byte what its manifest entry says (run with the suite, so a test or
    script that wrote into checkpoints/ by accident fails here)."""
    man = ck.read_manifest()
    names = {p.name for p in ck.checkpoints_dir().glob("*.safetensors")}
    assert names == {e["file"] for e in man.values()}  # no stray or missing file
    for name, e in man.items():
        assert _sha(ck.checkpoints_dir() / e["file"]) == e["sha256"], name


def test_any_family_trains_adversarially_reproducibly_and_records_the_recipe(tmp_path):
    """``fan_at``-style aliases: the base architecture with PGD adversarial training; the recipe's adversarial block
    is in the manifest, the PGD draws come from the seeded generator (two trainings give the same bytes), and the
    file loads as the base model's checkpoint."""
    import torch

    from robustbench_pid import load_dataset, load_model

    recipe = Recipe(epochs=1, warmup_epochs=1, batch_size=16, adversarial=Adversarial(eps_warmup_epochs=1, steps=2))
    a = train("symvit_at", recipe, tmp_path / "a", **QUIET)
    b = train("symvit_at", recipe, tmp_path / "b", **QUIET)
    assert a["sha256"] == b["sha256"] and a["model"] == "symvit_at" and a["family"] == "symvit"
    assert a["recipe"]["adversarial"] == {"eps": 8 / 255, "steps": 2, "step_size": 2 / 255, "eps_warmup_epochs": 1}
    assert a["recipe_is_pinned"] is False and a["file"].startswith("symvit_at_digits-")
    standard = train("symvit", TINY, tmp_path / "c", **QUIET)
    assert standard["sha256"] != a["sha256"] and "adversarial" not in standard["recipe"]
    model = load_model("symvit", str(tmp_path / "a" / a["file"]))
    ds = load_dataset("digits", "test")
    with torch.inference_mode():
        top1 = (model(ds.images).argmax(1) == ds.labels).double().mean().item()
    assert abs(top1 - a["clean_test_top1"]) < 1e-6


def test_a_run_shorter_than_the_warmup_scales_it_says_so_and_logs_every_epoch(tmp_path, monkeypatch, capsys):
    """--epochs 2 with the recipe's warmup_epochs 5 would warm up for the whole run (the learning rate never decays):
    the warm-up keeps the recipe's share (5 of 80 -> 0 epochs), a note says so, the manifest records it, and each
    epoch prints a line with the time left; an explicit --warmup-epochs is kept as given."""
    monkeypatch.chdir(tmp_path)
    pinned = alias_recipe("deit")
    assert main(["train", "--model", "deit", "--epochs", "2", "--batch-size", "16", "--limit", "16"]) == 0
    io = capsys.readouterr()
    scaled = int(2 * pinned.warmup_epochs / pinned.epochs)
    assert (f"--epochs 2 is not longer than the recipe's warmup_epochs {pinned.warmup_epochs}" in io.err
            and f"warming up for {scaled} epoch(s)" in io.err)
    assert [ln.split(" loss")[0] for ln in io.out.splitlines() if " epoch " in ln] == ["[deit] epoch 1/2",
                                                                                      "[deit] epoch 2/2"]
    assert all("s left)" in ln for ln in io.out.splitlines() if " epoch " in ln)
    entry = json.loads((tmp_path / "trained" / "manifest.json").read_text())["deit_digits"]
    assert entry["recipe"]["warmup_epochs"] == scaled
    assert main(["train", "--model", "deit", "--epochs", "2", "--warmup-epochs", "2", "--batch-size", "16",
                 "--limit", "16", "--out", "again"]) == 0
    assert "warming up" not in capsys.readouterr().err
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["deit_digits"]["recipe"]["warmup_epochs"] == 2

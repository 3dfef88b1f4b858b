"""--save-adv: every attacked sample's final image kept per condition, keyed by sample id, sha256 in run.json;
re-scoring the saved images with the model gives every recorded verdict back; 8 bits only where the verdict is
unchanged; damaged files and wrong inputs are one line each."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.attacks.base import still_correct
from robustbench_pid.benchmarks.adv_images import eight_bit, keep_adversarial
from robustbench_pid.errors import UserError
from robustbench_pid.results.files.adversarial import SIDECAR
from robustbench_pid.specs import Unit

FAST = {"steps": 25, "sweep_steps": 6, "square_queries": 100, "square_budget": 200, "eot_iter": 4, "spsa_iterations": 5,
        "spsa_samples": 16}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """PGD and FGSM (worst case) and noise (not) at 4/255 on 24 digits in two units of 12, images kept."""
    out = tmp_path_factory.mktemp("save") / "run"
    rbp.evaluate(model="pid_deit", attack=["pgd", "fgsm", "noise"], eps="4/255", limit=24, chunk_size=12,
                 save_adv=True, out=out, quiet=True)
    return out


def _rescored(run, attack, model, eps="4/255"):
    adv = rbp.load_adversarial(run, attack, eps)
    rec = rbp.load_records(run)
    rec = rec[(rec["attack"] == attack) & (rec["benchmark"] == adv.condition["benchmark"])].reset_index(drop=True)
    with torch.inference_mode():
        logits = model(adv.images).float()
    return adv, rec, logits


@pytest.mark.parametrize("attack", ["pgd", "fgsm", "noise"])
def test_saved_images_rescore_to_every_recorded_verdict(saved, pid_model, attack):
    adv, rec, logits = _rescored(saved, attack, pid_model)
    assert adv.sample_ids == rec["sample_id"].astype(str).tolist() and len(adv) == 24
    assert torch.equal(adv.labels, torch.as_tensor(rec["label"].to_numpy()))
    assert adv.images.dtype == torch.float32 and adv.images.shape == (24, 3, 32, 32)
    assert float(adv.images.min()) >= 0 and float(adv.images.max()) <= 1
    y = adv.labels
    assert logits.argmax(1).tolist() == rec["pred"].tolist()
    top1, top5 = still_correct(logits, y, 1).numpy(), still_correct(logits, y, 5).numpy()
    if attack != "noise":  # worst case: robust only if correct clean too
        top1 &= rec["clean_correct_top1"].to_numpy(bool)
        top5 &= rec["clean_correct_top5"].to_numpy(bool)
    assert top1.tolist() == rec["correct_top1"].astype(bool).tolist()
    assert top5.tolist() == rec["correct_top5"].astype(bool).tolist()
    # inside the ball of the clean image (8-bit ones at most as far out as the attack's own point)
    clean = rbp.load_dataset("digits", "test").images[:24]
    assert float((adv.images - clean).abs().amax()) <= 4 / 255 + 1e-6


def test_files_per_unit_with_their_sha256_in_run_json(saved):
    info = json.loads((saved / "run.json").read_text())
    files = info["adversarial_sha256"]
    assert len(files) == 6  # 3 conditions x 2 units; the clean units keep none
    assert sorted(p.name for p in (saved / "adversarial").iterdir()) == sorted(k.split("/")[1] for k in files)
    adv = rbp.load_adversarial(saved, "pgd", 4 / 255)
    assert 0 < adv.stored_u8 <= 24  # most points fit the 8-bit grid without changing their verdict


def test_converge_keeps_each_samples_worst_case(tmp_path, pid_model):
    out = tmp_path / "conv"
    rbp.evaluate(model="pid_deit", attack="pgd", eps="8/255", steps=3, limit=8, converge=True, converge_opt=FAST,
                 save_adv=True, out=out, quiet=True)
    adv = rbp.load_adversarial(out, "converge")
    rec = rbp.load_records(out)
    rec = rec[rec["attack"] == "converge"].reset_index(drop=True)
    with torch.inference_mode():
        logits = pid_model(adv.images).float()
    assert adv.sample_ids == rec["sample_id"].astype(str).tolist()
    assert still_correct(logits, adv.labels, 1).tolist() == rec["correct_top1"].astype(bool).tolist()
    # the ladder's own attack keeps its images too; two conditions, so naming one is required
    with pytest.raises(UserError, match="2 conditions with adversarial images match"):
        rbp.load_adversarial(out)


def test_damaged_file_is_refused_with_one_line(saved, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(saved, run)
    info = json.loads((run / "run.json").read_text())
    rel = next(iter(info["adversarial_sha256"]))
    data = bytearray((run / rel).read_bytes())
    data[-5] ^= 0xFF
    (run / rel).write_bytes(bytes(data))
    rec = rbp.load_records(run)
    attack = rec.loc[rec["unit"] == rel.split("/")[1][:-len(".safetensors")], "attack"].iloc[0]
    with pytest.raises(UserError, match="does not match the sha256 recorded in run.json") as exc:
        rbp.load_adversarial(run, attack, "4/255")
    assert "\n" not in str(exc.value) and rel.split("/")[1] in str(exc.value)
    (run / rel).unlink()
    with pytest.raises(UserError, match="is missing"):
        rbp.load_adversarial(run, attack, "4/255")


def test_readers_refuse_runs_without_images_and_bad_arguments(saved, tmp_path):
    plain = tmp_path / "plain"
    rbp.evaluate(model="pid_deit", attack="fgsm", eps="4/255", limit=4, out=plain, quiet=True)
    with pytest.raises(UserError, match="was run without --save-adv.*re-run its evaluate command with --save-adv"):
        rbp.load_adversarial(plain)
    with pytest.raises(UserError, match="holds no run.json: give a run folder"):
        rbp.load_adversarial(tmp_path)
    with pytest.raises(UserError, match="is a file"):
        rbp.load_adversarial(saved / "run.json")
    with pytest.raises(UserError, match="no condition with adversarial images matches.*its conditions: "):
        rbp.load_adversarial(saved, "cw", "4/255")
    with pytest.raises(UserError, match="eps must be a number"):
        rbp.load_adversarial(saved, "pgd", True)
    info = json.loads((saved / "run.json").read_text())
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / "run.json").write_text(json.dumps({**info, "status": "running"}))
    with pytest.raises(UserError, match="run is not complete"):
        rbp.load_adversarial(incomplete)


@pytest.mark.parametrize("kw,needle", [
    (dict(benchmark="corruptions"), "--save-adv keeps the adversarial images of attacks; this run has none"),
    (dict(attack=None, eps=None), "no --attack/--suite"),
    (dict(protocol="paper"), "paper protocol's perturbed tensors are none"),
    (dict(save_adv="yes"), "save_adv must be True or False"),
])
def test_save_adv_inputs_are_checked_where_they_enter(kw, needle):
    from robustbench_pid.run.spec_builder import build_spec

    args = {"attack": "pgd", "eps": "4/255", "save_adv": True, **kw}
    with pytest.raises(UserError, match=needle):
        build_spec("pid_deit", **args)


def test_cli_save_adv_error_is_one_line():
    r = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "pid_deit", "--save-adv",
                        "--limit", "4"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: --save-adv keeps")


class _Threshold(torch.nn.Module):
    """Class 1 while the first pixel is below 0.501, else class 0: a verdict that rounding can flip."""

    def forward(self, x):
        s = (x[:, 0, 0, 0] - 0.501) * 1e4
        return torch.stack([s, -s, -s - 1, -s - 2, -s - 3, -s - 4], 1)


def test_eight_bits_only_where_the_verdict_and_the_ball_survive():
    """How the 8-bit choice is checked: a point whose rounding crosses the model's boundary, and a ball too
    small to hold a grid value, stay float32; the others are stored in 8 bits, and all read back as given."""
    x = torch.full((3, 3, 2, 2), 100 / 255)
    x_adv = x.clone()
    x[0, 0, 0, 0] = 0.4999
    x_adv[0, 0, 0, 0] = 0.5005  # 127.63 / 255 -> rounds to 128 / 255 = 0.50196: across the threshold
    x[1, 0, 0, 0] = x_adv[1, 0, 0, 0] = 0.3  # far from it: 8 bits change nothing
    x[2] = x_adv[2] = 100.4 / 255  # not on the grid, and the ball (0.1 / 255) holds no grid value
    eps = [4 / 255, 4 / 255, 0.1 / 255]
    ctx = SimpleNamespace(spec=SimpleNamespace(save_adv=True), sidecars={}, batch_size=8,
                          verdict_model=lambda: _Threshold())
    y = torch.tensor([1, 1, 1])
    for i in range(3):
        unit = Unit("adversarial", "pgd", eps[i], "{}", "", 0, 3, key=f"{i:064x}")
        keep_adversarial(ctx, unit, [f"s{i}"], x[i:i + 1], x_adv[i:i + 1], y[i:i + 1], "linf", eps[i])
    stored = [bool(ctx.sidecars[f"{i:064x}"][SIDECAR].as_u8[0][0]) for i in range(3)]
    assert stored == [False, True, False]
    q = eight_bit(x[2:], x_adv[2:], "linf", eps[2])
    assert float((q.float() / 255 - x[2:]).abs().max()) > eps[2]  # why the third one could not be 8-bit
    off = SimpleNamespace(spec=SimpleNamespace(save_adv=False), sidecars={})
    keep_adversarial(off, Unit("adversarial", "pgd", 0.0, "{}", "", 0, 1, key="k"), ["a"], x[:1], x[:1], y[:1],
                     "linf", 0.0)
    assert off.sidecars == {}


def test_reader_sees_what_was_written(tmp_path):
    """The file's two halves reassemble in unit order: 8-bit values as k/255 in float32, float32 bit for bit."""
    from robustbench_pid.results.files.adversarial import ImageParts, _decode
    from robustbench_pid.results.files.integrity import sha256_bytes

    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, size=(4, 3, 5, 5), dtype=np.uint8)
    f32 = rng.random((4, 3, 5, 5), dtype=np.float32)
    parts = ImageParts()
    parts.add(["a", "b"], u8[:2], f32[:2], np.array([True, False]))
    parts.add(["c", "d"], u8[2:], f32[2:], np.array([False, True]))
    data = parts.encode("0" * 64)
    (tmp_path / "f.safetensors").write_bytes(data)
    ids, images, n_u8 = _decode(tmp_path / "f.safetensors", sha256_bytes(data))
    assert ids == ["a", "b", "c", "d"] and n_u8 == 2
    assert np.array_equal(images[[1, 2]], f32[[1, 2]])
    assert np.array_equal(images[[0, 3]], u8[[0, 3]].astype(np.float32) / np.float32(255))


def test_reproduce_keeps_the_images_of_its_attack_rows(tmp_path, capsys):
    """reproduce --save-adv: each standard-protocol attack row keeps its images; the clean row is named as
    keeping none; a paper-protocol study without --converge is refused before anything runs."""
    from robustbench_pid.cli import main

    out = tmp_path / "study"
    assert main(["reproduce", "digits-smoke", "--model", "pid_deit", "--only", "clean", "--only", "fgsm-2",
                 "--limit", "4", "--quiet", "--save-adv", "--out", str(out)]) == 0
    assert "note: --save-adv: rows clean keep no images" not in capsys.readouterr().out  # --quiet
    rows = {p.parent.name: p.parent for p in out.rglob("run.json")}
    assert "adversarial_sha256" in json.loads((rows["fgsm-2"] / "run.json").read_text())
    assert "adversarial_sha256" not in json.loads((rows["clean"] / "run.json").read_text())
    assert len(rbp.load_adversarial(rows["fgsm-2"])) == 4
    assert main(["reproduce", "digits-smoke", "--model", "pid_deit", "--protocol", "paper", "--limit", "4", "--quiet",
                 "--save-adv", "--out", str(tmp_path / "paper")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --save-adv: no row of study 'digits-smoke' keeps images (paper protocol")
    assert err.strip().count("\n") == 0
    assert not (tmp_path / "paper").exists()


def test_shards_keep_their_units_images_and_merge_checks_them(tmp_path):
    """Two shards write their units' images; the one that finishes the run records them all; a unit whose image
    file was damaged before the merge stops it with the unit named (recompute it)."""
    from robustbench_pid.results.files.merge import merge

    out = tmp_path / "sharded"
    opts = dict(model="pid_deit", attack="fgsm", eps="4/255", limit=12, chunk_size=4, save_adv=True, out=out,
                quiet=True)
    with pytest.raises(UserError, match="computed only its shard"):
        rbp.evaluate(shard="0/2", **opts)
    assert not (out / "summary.csv").exists()
    rbp.evaluate(shard="1/2", **opts)  # the last shard to finish writes the tables and run.json
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and len(info["adversarial_sha256"]) == 3
    assert rbp.load_adversarial(out).sample_ids == rbp.load_dataset("digits").sample_ids[:12]
    victim = out / next(iter(info["adversarial_sha256"]))
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(UserError, match="does not match the sha256 recorded when it was written; delete .*units"):
        merge(out)

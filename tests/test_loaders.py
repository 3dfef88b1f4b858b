"""Checkpoint loaders: every format round-trips, foreign layouts adapt, unsafe pickles are refused,
mismatches are named, plugins register through the entry-point group, timm: fails clearly offline."""
from __future__ import annotations

import argparse
import hashlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict

import pytest
import timm
import torch
from safetensors.torch import save_file

import robustbench_pid  # noqa: F401  (registers the models)
from robustbench_pid.errors import CheckpointError, UserError
from robustbench_pid.loaders import ENTRY_POINT_GROUP, load_weights, loaders, state_dict_sha256

ARCH = "deit_digits_patch4_32"


def _net(seed: int, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(ARCH, **kw).eval()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _same(a: torch.nn.Module, b: torch.nn.Module, skip=()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        if k not in skip:
            assert torch.equal(sa[k], sb[k]), k


def _save(obj, path: Path) -> Path:
    if path.suffix == ".safetensors":
        save_file(obj, str(path))
    else:
        torch.save(obj, path)
    return path


FORMATS = {
    # name: (file suffix, wrap(sd) -> object saved, expected checkpoint_format)
    "plain-safetensors": (".safetensors", lambda sd: sd, "state_dict"),
    "plain-pth": (".pth", lambda sd: sd, "state_dict"),
    "plain-bin": (".bin", lambda sd: sd, "state_dict"),
    "model-pt": (".pt", lambda sd: {"model": sd, "epoch": 3}, "model"),
    "state_dict-pth": (".pth", lambda sd: {"state_dict": sd, "epoch": 7, "arch": ARCH}, "state_dict"),
    "state_dict_ema-pth": (".pth", lambda sd: {"state_dict_ema": sd, "epoch": 7}, "state_dict_ema"),
    "module-prefix-pth": (".pth", lambda sd: {"model": {f"module.{k}": v for k, v in sd.items()}}, "model"),
    "module-prefix-safetensors": (".safetensors", lambda sd: {f"module.{k}": v for k, v in sd.items()}, "state_dict"),
    "normalized-wrapper": (".safetensors", lambda sd: {**{f"net.{k}": v for k, v in sd.items()},
                                                        "mean": torch.zeros(1, 3, 1, 1), "std": torch.ones(1, 3, 1, 1)},
                           "state_dict"),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_round_trip_every_format(fmt: str, tmp_path: Path) -> None:
    suffix, wrap, expected_format = FORMATS[fmt]
    src, dst = _net(1), _net(2)
    path = _save(wrap({k: v.clone() for k, v in src.state_dict().items()}), tmp_path / f"ck{suffix}")
    info = load_weights(dst, str(path))
    _same(src, dst)
    assert info["checkpoint"] == str(path)
    assert info["checkpoint_sha256"] == _sha(path)
    assert info["checkpoint_format"] == expected_format
    assert info["strict"] is True and info["load_problems"] == []
    assert info["loaded_keys"] == len(src.state_dict())
    if "module" in fmt:
        assert "stripped 'module.' prefix" in info["checkpoint_adaptations"]
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))


def test_pick_a_wrapper_key_with_hash_suffix(tmp_path: Path) -> None:
    """``file.pth#state_dict_ema`` takes the EMA weights although raw weights are present too."""
    raw, ema = _net(1), _net(2)
    path = _save({"state_dict": raw.state_dict(), "state_dict_ema": ema.state_dict(), "epoch": 9}, tmp_path / "t.pth")
    dst = _net(3)
    assert load_weights(dst, str(path))["checkpoint_format"] == "state_dict"
    _same(raw, dst)
    info = load_weights(dst, f"{path}#state_dict_ema")
    _same(ema, dst)
    assert info["checkpoint_format"] == "state_dict_ema" and info["checkpoint_sha256"] == _sha(path)
    with pytest.raises(CheckpointError, match="no state dict under key 'ema'.*'state_dict', 'state_dict_ema'"):
        load_weights(dst, f"{path}#ema")


def test_lightning_style_prefix_is_stripped(tmp_path: Path) -> None:
    src = _net(4)
    path = _save({"state_dict": {f"model.{k}": v for k, v in src.state_dict().items()}, "epoch": 1},
                 tmp_path / "last.ckpt")
    dst = _net(5)
    info = load_weights(dst, str(path))
    _same(src, dst)
    assert any("stripped 'model.' prefix" in a for a in info["checkpoint_adaptations"])


def test_deit_release_style_checkpoint_loads_into_deit_tiny(tmp_path: Path) -> None:
    """The DeiT release ships {'model': state_dict} with timm ViT keys (qkv 3*dim rows)."""
    torch.manual_seed(0)
    src = timm.create_model("deit_tiny_patch16_224").eval()
    path = _save({"model": src.state_dict()}, tmp_path / "deit_tiny_patch16_224-a1311bcf.pth")
    dst = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    info = load_weights(dst, str(path))
    _same(src, dst)
    assert info["checkpoint_format"] == "model" and info["load_problems"] == []
    # the same file fits PID DeiT-tiny (the PID terms add no parameters)
    pid = timm.create_model("pid_deit_tiny_patch16_224").eval()
    assert load_weights(pid, str(path))["load_problems"] == []
    assert torch.equal(pid.blocks[11].attn.qkv.weight, src.blocks[11].attn.qkv.weight)


def test_position_embedding_resized_by_timm_filter(tmp_path: Path) -> None:
    from timm.layers import resample_abs_pos_embed

    src = _net(3)  # 32x32 input, patch 4: 8x8 grid + cls = 65 tokens
    path = _save(src.state_dict(), tmp_path / "ck.safetensors")
    dst = _net(4, img_size=48)  # 12x12 grid + cls = 145 tokens
    with pytest.raises(CheckpointError, match="pos_embed resized by timm's filter to fit"):
        load_weights(dst, str(path))  # strict: weights made for another input size are not taken silently
    info = load_weights(dst, str(path), strict=False)
    assert dst.pos_embed.shape == (1, 145, 64)
    expected = resample_abs_pos_embed(src.pos_embed.detach(), new_size=(12, 12), old_size=(8, 8),
                                      num_prefix_tokens=1, interpolation="bicubic", antialias=True)
    assert torch.allclose(dst.pos_embed, expected, atol=1e-6)
    assert torch.equal(dst.pos_embed[0, 0], src.pos_embed[0, 0])  # the class token's entry is kept
    assert any("pos_embed resized" in a and "(1, 65, 64) -> (1, 145, 64)" in a for a in info["checkpoint_adaptations"])
    _same(src, dst, skip=("pos_embed",))


def _args_checkpoint(net: torch.nn.Module, path: Path) -> Path:
    """What the DeiT / RPC-attention training scripts save: the args namespace is pickled too."""
    sd = net.state_dict()
    args = argparse.Namespace(model="deit_tiny_patch16_224", lr=5e-4, epochs=300, robust=True, n=6, lambd=4.0)
    torch.save({"model": sd, "optimizer": {"state": {}, "param_groups": []}, "lr_scheduler": {"last_epoch": 3},
                "epoch": 3, "model_ema": sd, "scaler": {}, "args": args}, path)
    return path


def test_args_namespace_checkpoint_needs_allow_pickle(tmp_path: Path) -> None:
    src = _net(5)
    path = _args_checkpoint(src, tmp_path / "checkpoint.pth")
    dst = _net(6)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(CheckpointError) as err:
        load_weights(dst, str(path))
    msg = str(err.value)
    assert "argparse.Namespace" in msg and "--allow-pickle" in msg and "arbitrary code" in msg
    assert all(torch.equal(before[k], v) for k, v in dst.state_dict().items())  # nothing was loaded
    info = load_weights(dst, str(path), allow_pickle=True)
    _same(src, dst)
    assert info["checkpoint_format"] == "model"
    assert "read with full unpickling (--allow-pickle)" in info["checkpoint_adaptations"]


class _Evil:
    """Unpickling this creates a file: a stand-in for any code a malicious checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_refused_without_the_flag(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"model": _net(0).state_dict(), "payload": _Evil(marker)}, path)
    with pytest.raises(CheckpointError) as err:
        load_weights(_net(1), str(path))
    assert "--allow-pickle" in str(err.value)
    assert not marker.exists()
    # the file really is malicious: a full unpickle runs the payload (so the refusal above mattered)
    load_weights(_net(1), str(path), allow_pickle=True)
    assert marker.exists()


def test_mismatched_keys_are_named(tmp_path: Path) -> None:
    sd = _net(0).state_dict()
    sd.pop("blocks.0.norm1.weight")
    sd["blocks.9.extra.weight"] = torch.zeros(3)
    path = _save(sd, tmp_path / "ck.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_weights(_net(1), str(path))
    msg = str(err.value)
    assert "missing keys (1): blocks.0.norm1.weight" in msg
    assert "unexpected keys (1): blocks.9.extra.weight" in msg
    assert "--non-strict" in msg


def test_class_count_mismatch_in_words_and_non_strict_records_it(tmp_path: Path) -> None:
    src = _net(0, num_classes=7)
    path = _save(src.state_dict(), tmp_path / "ck7.safetensors")
    dst = _net(1)  # 10 classes
    head_before = dst.head.weight.clone()
    with pytest.raises(CheckpointError) as err:
        load_weights(dst, str(path))
    msg = str(err.value)
    assert "class-count mismatch" in msg and "has 7 classes but the model has 10" in msg
    assert "head.weight (checkpoint (7, 64) vs model (10, 64))" in msg
    info = load_weights(dst, str(path), strict=False)
    assert info["strict"] is False
    assert any("class-count mismatch" in p for p in info["load_problems"])
    assert torch.equal(dst.head.weight, head_before)  # the head that does not fit stays as it was
    assert torch.equal(dst.blocks[3].mlp.fc2.weight, src.blocks[3].mlp.fc2.weight)  # the rest loaded


def test_non_strict_is_recorded_in_model_info(tmp_path: Path) -> None:
    from robustbench_pid import load_model

    sd = _net(0).state_dict()
    sd.pop("norm.bias")
    path = _save(sd, tmp_path / "partial.safetensors")
    with pytest.raises(CheckpointError, match="missing keys \\(1\\): norm.bias"):
        load_model("deit", str(path))
    m = load_model("deit", str(path), strict=False)
    assert m.info["strict"] is False and m.info["load_problems"] == ["missing keys (1): norm.bias"]
    assert m.info["checkpoint_sha256"] == _sha(path)


def test_symmetric_checkpoint_into_deit_says_which_model(tmp_path: Path) -> None:
    sym = timm.create_model("symvit_digits_patch4_32")
    path = _save(sym.state_dict(), tmp_path / "symvit.safetensors")
    with pytest.raises(CheckpointError) as err:
        load_weights(_net(0), str(path))
    msg = str(err.value)
    assert "symmetric attention" in msg and "--model symvit" in msg
    assert "blocks.0.attn.qkv.weight (checkpoint (128, 64) vs model (192, 64))" in msg


def test_bad_files_give_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint file not found"):
        load_weights(_net(0), str(tmp_path / "nope.pth"))
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unsupported checkpoint format '.npz'"):
        load_weights(_net(0), str(tmp_path / "w.npz"))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_weights(_net(0), str(tmp_path / "junk.safetensors"))
    torch.save({"epoch": 3, "note": "no weights here"}, tmp_path / "empty.pth")
    with pytest.raises(CheckpointError, match="no state dict found"):
        load_weights(_net(0), str(tmp_path / "empty.pth"))
    with pytest.raises(CheckpointError, match="no loader for scheme 'nosuch'"):
        load_weights(_net(0), "nosuch:thing")


# --- third-party loaders through the entry-point group ----------------------------------------
PLUGIN = '''
import torch

CALLS = []

def load(name, *, allow_pickle=False):
    CALLS.append((name, allow_pickle))
    torch.manual_seed(int(name))
    import timm
    return {"model": timm.create_model("deit_digits_patch4_32").state_dict()}
'''


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, eps) -> None:
    (tmp_path / "rbp_fake_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = metadata.entry_points

    def fake(**kw):
        if kw.get("group") == ENTRY_POINT_GROUP:
            return metadata.EntryPoints(eps)
        return real(**kw)

    monkeypatch.setattr(metadata, "entry_points", fake)
    monkeypatch.setattr(loaders, "_items", dict(loaders._items))  # restored after the test


def test_third_party_loader_via_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ep = metadata.EntryPoint(name="fakehub", value="rbp_fake_plugin:load", group=ENTRY_POINT_GROUP)
    _fake_entry_points(monkeypatch, tmp_path, [ep])
    dst = _net(1)
    info = load_weights(dst, "fakehub:42", allow_pickle=False)
    plugin = sys.modules["rbp_fake_plugin"]
    assert plugin.CALLS == [("42", False)]
    torch.manual_seed(42)
    ref = timm.create_model(ARCH).eval()
    _same(ref, dst)
    assert info["checkpoint_source"] == "fakehub" and info["checkpoint_format"] == "model"
    assert info["checkpoint_sha256"] == state_dict_sha256(ref.state_dict())  # content hash: no file
    from robustbench_pid.loaders import loader_names

    assert {"embedded", "file", "timm", "fakehub"} <= set(loader_names())


def test_broken_plugin_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ep = metadata.EntryPoint(name="brokenhub", value="rbp_no_such_module:load", group=ENTRY_POINT_GROUP)
    _fake_entry_points(monkeypatch, tmp_path, [ep])
    with pytest.raises(CheckpointError, match="plugin 'brokenhub' failed to load: rbp_no_such_module:load"):
        load_weights(_net(0), "brokenhub:x")
    src = _net(3)  # built-in loaders still work
    path = _save(src.state_dict(), tmp_path / "ok.safetensors")
    assert load_weights(_net(4), str(path))["load_problems"] == []


# --- timm: pretrained weights -------------------------------------------------------------------
@pytest.fixture()
def empty_hub_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_timm_weights_offline_says_how_to_pass_a_file(empty_hub_cache: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        load_weights(timm.create_model("deit_tiny_patch16_224"), "timm:deit_tiny_patch16_224")
    msg = str(err.value)
    assert "HF_HUB_OFFLINE=1" in msg and "--checkpoint /path/to/the/file" in msg
    assert "timm/deit_tiny_patch16_224.fb_in1k" in msg  # which file to fetch elsewhere


def test_timm_weights_come_from_the_hub_cache(empty_hub_cache: Path) -> None:
    """Offline with the file cached (as after one online run): loaded, hashed, checked like a local file."""
    torch.manual_seed(0)
    src = timm.create_model("test_vit").eval()  # timm's 0.37M-parameter test ViT, hub id timm/test_vit.r160_in1k
    snap = empty_hub_cache / "models--timm--test_vit.r160_in1k"
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    target = snap / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    target.mkdir(parents=True)
    save_file(src.state_dict(), str(target / "model.safetensors"))
    dst = timm.create_model("test_vit").eval()
    info = load_weights(dst, "timm:test_vit")
    assert info["checkpoint_source"] == "timm" and info["load_problems"] == []
    assert info["checkpoint_sha256"] == _sha(target / "model.safetensors")
    assert "timm pretrained timm/test_vit.r160_in1k" in info["checkpoint_adaptations"]
    _same(src, dst)


def test_timm_unknown_names(empty_hub_cache: Path) -> None:
    with pytest.raises(CheckpointError, match="timm has no model 'not_a_model'"):
        load_weights(_net(0), "timm:not_a_model")
    with pytest.raises(CheckpointError, match="publishes no pretrained weights"):
        load_weights(_net(0), f"timm:{ARCH}")


def test_evaluate_cli_args_checkpoint_and_sha_in_every_record(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """End to end: refused without --allow-pickle (exit 2, one line), loaded with it, sha256 in every row."""
    from robustbench_pid.hub.checkpoints import checkpoints_dir
    from robustbench_pid.cli import evaluate_main
    from robustbench_pid.models.zoo import build_model
    from robustbench_pid.results.store import load_records

    from safetensors.torch import load_file as st_load

    net = build_model("deit_digits_patch4_32")
    net.load_state_dict(st_load(str(checkpoints_dir() / "deit_digits.safetensors")))
    path = _args_checkpoint(net, tmp_path / "checkpoint.pth")
    base = ["--model", "deit", "--checkpoint", str(path), "--limit", "8", "--quiet"]
    assert evaluate_main(base + ["--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--allow-pickle" in err and "Traceback" not in err
    assert evaluate_main(base + ["--allow-pickle", "--out", str(tmp_path / "ok")]) == 0
    recs = load_records(tmp_path / "ok")
    assert len(recs) == 8 and (recs["checkpoint_sha256"] == _sha(path)).all()
    assert recs["clean_correct_top1"].mean() >= 7 / 8  # the embedded weights really were loaded


class _Creates:
    """Unpickling this calls open(path, "w"): a harmless stand-in for code hidden in a checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("flag", ["false", "no", 0, 1, None])
def test_only_a_real_true_opts_in_to_unpickling(flag, tmp_path: Path) -> None:
    """In Python "false" is truthy: a string, a number or None must not opt in to running a pickle's code, through
    the loader and through rbp.evaluate alike; nothing runs and nothing is loaded."""
    import robustbench_pid as rbp
    from robustbench_pid.models import pid_vit  # noqa: F401  (registers the digits architecture _net builds)

    marker = tmp_path / "ran"
    path = tmp_path / "evil.pth"
    torch.save({"model": _net(1).state_dict(), "payload": _Creates(marker)}, path)
    dst = _net(2)
    with pytest.raises(CheckpointError, match="allow_pickle must be True or False"):
        load_weights(dst, str(path), allow_pickle=flag)
    with pytest.raises(UserError, match="allow_pickle must be True or False"):
        rbp.evaluate(model="deit", checkpoint=str(path), allow_pickle=flag, limit=4, out=tmp_path / "run")
    assert not marker.exists() and not (tmp_path / "run").exists()

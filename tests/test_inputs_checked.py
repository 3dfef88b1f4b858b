"""Issue 23, the input half: every input is checked where it enters (CLI and Python API), and a bad
one ends in one ``UserError`` naming the problem and the fix before any record is written (or, for
a batch found bad mid-run, with the folder never marked complete). Tiny tensors and a linear model
for the API cases; ``--limit 8`` digits for the CLI cases."""
from __future__ import annotations

import json
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import robustbench_pid as rbp
from robustbench_pid.cli import evaluate_main, main
from robustbench_pid.errors import UserError
from robustbench_pid.results.report.diagnostics import DiagnosticWarning

pytestmark = pytest.mark.usefixtures("one_thread")

N = 16


class Linear(nn.Module):
    """A tiny classifier of 3x8x8 images, or one that breaks the output contract (``mode``)."""

    def __init__(self, classes: int = 5, mode: str = "") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3 * 8 * 8, classes)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1))
        if self.mode == "batch":
            return out[:1]
        if self.mode == "detached":
            return out.detach()
        if self.mode == "integer":
            return out.round().long()
        if self.mode == "constant":  # depends on x only through a zero factor: one class for every image
            return out * 0 + torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0])
        return out


class Pairs(torch.utils.data.Dataset):
    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def _xy(n: int = N):
    g = torch.Generator().manual_seed(1)
    return torch.rand(n, 3, 8, 8, generator=g), torch.arange(n) % 5


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _evaluate(tmp_path: Path, **kw):
    return rbp.evaluate(device="cpu", out=tmp_path / "run", **kw)


# --- item 1: labels and num_classes -------------------------------------------------------------------
@pytest.mark.parametrize("case,says", [
    ("minus_one", ["labels must be class indices", "found -1", "sample 0", "not a class: drop or relabel"]),
    ("float", ["labels must be whole class indices, found 1.7", "would be truncated", "integer labels"]),
    ("too_big", ["labels up to 7", "the model outputs 5 classes", "class indices 0..4"]),
    ("num_classes", ["num_classes=10 but the model outputs 5 classes", "drop num_classes="]),
])
def test_bad_labels_and_num_classes_refused_before_any_record(case, says, tmp_path):
    x, y = _xy()
    kw = {}
    if case == "minus_one":
        y = torch.full((N,), -1)
    elif case == "float":
        y = torch.full((N,), 1.7)
    elif case == "too_big":
        y = torch.full((N,), 7)
    else:
        kw["num_classes"] = 10
    with pytest.raises(UserError) as exc:
        _evaluate(tmp_path, model=Linear(), data=(x, y), attack="fgsm", eps="2/255", **kw)
    for s in says:
        assert s in str(exc.value), str(exc.value)
    assert not (tmp_path / "run").exists()  # refused before the run folder was started


def test_whole_float_labels_are_accepted(tmp_path):
    x, y = _xy()
    df = _evaluate(tmp_path, model=Linear(), data=(x, y.float()))
    assert int(df.loc[df.metric == "top1", "n"].iloc[0]) == N


# --- item 2: the [0, 1] range on every batch ---------------------------------------------------------------
def test_range_checked_on_every_batch_of_a_data_object(tmp_path):
    x, _ = _xy(128)
    x[100:, 0, 0, 0] = 1.0
    x[100:] *= 255  # 0..255 pixels from sample 100 on: the first batches are fine
    y = torch.arange(128) % 5
    with pytest.raises(UserError) as exc:
        _evaluate(tmp_path, model=Linear(), data=(x, y), batch_size=32)
    msg = str(exc.value)
    assert "images must be in [0, 1]" in msg and "28 samples 100, 101, 102, 103, 104 and 23 more" in msg
    assert "found values in [" in msg and ", 255]" in msg and "x / 255" in msg and "mean=/std=" in msg
    assert not (tmp_path / "run").exists()


def test_range_checked_on_every_batch_a_run_reads(tmp_path, capsys, monkeypatch):
    """A registered dataset whose second batch leaves [0, 1]: one error line naming the samples,
    the run stops there and its folder is not complete."""
    import robustbench_pid.run.context as context

    real = context.load_dataset

    def scaled(*a, **kw):
        ds = real(*a, **kw)
        ds.images = ds.images.clone()
        ds.images[8:] *= 255
        return ds

    monkeypatch.setattr(context, "load_dataset", scaled)
    out = tmp_path / "run"
    assert evaluate_main(["--model", "deit", "--limit", "16", "--batch-size", "8", "--chunk-size", "8", "--quiet",
                          "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "dataset 'digits', batch 2 (positions 8..15): images must be in [0, 1]" in line
    assert "8 samples " in line and "check the files and the transform" in line
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert not (out / "summary.csv").exists() and not (out / "records.parquet").exists()


# --- item 3: rbp.attack ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case,says", [
    ("label_99", "labels must be class indices 0..4 (the model has 5 outputs), found 99"),
    ("label_minus_1", "labels must be class indices 0, 1, 2, ..., found -1"),
    ("x_255", "images must be in [0, 1], found values in ["),
])
def test_attack_refuses_bad_labels_and_range(case, says):
    x, y = _xy()
    if case == "label_99":
        y = torch.full((N,), 99)
    elif case == "label_minus_1":
        y = torch.full((N,), -1)
    else:
        x = x * 255
    with pytest.raises(UserError, match=None) as exc:
        rbp.attack(Linear(), x, y, "pgd", eps=4 / 255, steps=2)
    assert says in str(exc.value), str(exc.value)


def test_attack_takes_numpy_and_moves_the_images():
    x, y = _xy()
    adv = rbp.attack(Linear(), x.numpy(), y.numpy(), "pgd", eps=4 / 255, steps=2)
    assert isinstance(adv, torch.Tensor) and adv.shape == x.shape
    assert 0 < float((adv - x).abs().max()) <= 4 / 255 + 1e-6


# --- item 4: data= required, diagnostics come back with the API --------------------------------------------
def test_model_object_needs_data():
    with pytest.raises(UserError, match=r"needs data=: your images and labels as tensors \(x, y\)") as exc:
        rbp.evaluate(model=Linear())
    assert "dataset='digits'" in str(exc.value)


def test_diagnostics_attached_and_error_finding_warned(tmp_path):
    x, y = _xy()
    with pytest.warns(DiagnosticWarning, match=r"\[error\] constant-predictions: Linear .* predicted as class 2"):
        df = rbp.evaluate(model=Linear(mode="constant"), data=(x, y), device="cpu", out=tmp_path / "a")
    codes = [f["code"] for f in df.attrs["diagnostics"]]
    assert codes == ["constant-predictions"] and df.attrs["diagnostics"][0]["severity"] == "error"
    assert "[error] constant-predictions" in df.attrs["diagnostics_text"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)  # quiet=True: in the attribute, not warned
        df = rbp.evaluate(model=Linear(mode="constant"), data=(x, y), device="cpu", out=tmp_path / "a", quiet=True)
    assert [f["code"] for f in df.attrs["diagnostics"]] == ["constant-predictions"]
    ok = rbp.evaluate(model=Linear(), data=(x, y), device="cpu", out=tmp_path / "b")
    assert ok.attrs["diagnostics"] == []  # clean accuracy only: no gradient-masking check had anything to check
    assert "no gradient-masking check could run" in ok.attrs["diagnostics_text"]


# --- item 10: model outputs, meta device, mean/std, layouts, numpy -----------------------------------------
@pytest.mark.parametrize("case,says", [
    ("batch", "returned Tensor (1, 5) for a batch of 2 images; it must return logits of shape (batch, classes)"),
    ("detached", "output has no gradient with respect to its input"),
    ("integer", "returned torch.int64 outputs; it must return float logits"),
    ("meta", "has parameters on the meta device"),
    ("mean_2", "mean=/std= have 2 value(s) but the images have 3 channel(s): give one value per channel of the "
               "images (the normalisation the model was trained with), or leave mean=/std= out"),
    ("channels_last", "looks channels-last (H, W, C last); images must be (N, C, H, W) with the channels first: "
                      "pass x.permute(0, 3, 1, 2)"),
    ("uint8_numpy", "x is torch.uint8; images must be float tensors in [0, 1]: for 0..255 pixels pass "
                    "x.astype(np.float32) / 255"),  # the fix for the caller's numpy array, not a tensor's
    ("channels_last_numpy", "looks channels-last (H, W, C last); images must be (N, C, H, W) with the channels first: "
                            "pass x.transpose(0, 3, 1, 2)"),
    ("wrong_size", "the model failed on a batch of shape (2, 3, 4, 4)"),
    ("dataset_hwc", "data= item 0: the image has shape (8, 8, 3), which looks channels-last (H, W, C last); images "
                    "must be (C, H, W) with the channels first: pass image.transpose(2, 0, 1)"),
    ("registered_1_channel", "normalisation (mean=/std=) has 3 values but the images have 1 channel(s): model 'deit' "
                             "takes 3-channel images; give it 3-channel images (grayscale to RGB: x.repeat(1, 3, 1, 1))"),
])
def test_bad_model_outputs_and_inputs_one_error(case, says, tmp_path):
    x, y = _xy()
    kw: dict = dict(model=Linear(mode=case if case in ("batch", "detached", "integer") else ""), data=(x, y),
                    attack="pgd", eps="2/255", steps=1)
    if case == "meta":
        with torch.device("meta"):
            kw["model"] = Linear()
    elif case == "mean_2":
        kw.update(mean=[0, 0], std=[1, 1])
    elif case == "channels_last":
        kw["data"] = (x.permute(0, 2, 3, 1), y)
    elif case == "channels_last_numpy":
        kw["data"] = (x.permute(0, 2, 3, 1).numpy(), y.numpy())
    elif case == "uint8_numpy":
        kw["data"] = ((x.numpy() * 255).astype(np.uint8), y.numpy())
    elif case == "wrong_size":
        kw["data"] = (x[:, :, :4, :4], y)
    elif case == "dataset_hwc":
        kw["data"] = Pairs(x.permute(0, 2, 3, 1).numpy(), y)  # numpy HWC items, as from PIL/OpenCV
    elif case == "registered_1_channel":
        kw.update(model=rbp.load_model("deit"), data=(torch.rand(N, 1, 32, 32), y))
    with pytest.raises(UserError) as exc:
        _evaluate(tmp_path, **kw)
    assert says in str(exc.value), str(exc.value)
    assert not (tmp_path / "run").exists()


def test_numpy_data_is_converted(tmp_path):
    x, y = _xy()
    a = rbp.evaluate(model=Linear(), data=(x.numpy(), y.numpy()), device="cpu", out=tmp_path / "np")
    b = rbp.evaluate(model=Linear(), data=(x, y), device="cpu", out=tmp_path / "t")
    pd.testing.assert_series_equal(a["value"], b["value"])


def test_model_arg_depth_negative_one_error_line(tmp_path, capsys):
    assert evaluate_main(["--model", "deit", "--model-arg", "depth=-3", "--limit", "8", "--quiet",
                          "--out", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "architecture argument depth=-3 must be > 0" in line and "--model-arg depth=VALUE" in line


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG claiming width x height pixels (PIL refuses it at open: no need for the pixels)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))


@pytest.mark.parametrize("skip", [True, False])
def test_decompression_bomb_png_skipped_or_one_error_line(skip, tmp_path, capsys):
    from test_imagenet_datasets import WN, tree

    root = tree(tmp_path / "val", [WN[0], WN[1]], per=2, size=(40, 40))
    bomb = root / WN[1] / "huge.png"
    _png_header_only(bomb, 20000, 20000)
    out = tmp_path / "run"
    args = ["--model", "timm:test_vit", "--dataset", "imagenet", "--split", "val", "--data-root", str(root),
            "--quiet", "--out", str(out)] + (["--skip-unreadable"] if skip else [])
    if skip:
        assert evaluate_main(args) == 0
        assert "note: 1 unreadable image(s) were skipped" in capsys.readouterr().out
        s = pd.read_csv(out / "summary.csv")
        assert (s["n_skipped"] == 1).all() and (s.loc[s.metric == "top1", "n"] == 4).all()
    else:
        assert evaluate_main(args) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"cannot read image {bomb}" in line and "decompression bomb" in line and "--skip-unreadable" in line
        if (out / "run.json").exists():  # the image is read when its batch is: the run stops there
            assert json.loads((out / "run.json").read_text())["status"] == "running"
        assert not (out / "summary.csv").exists()


# --- item 11: corrupt .pth, --eps 0, strict booleans in suites ---------------------------------------------
@pytest.mark.parametrize("content", [b"\x80\x02" + bytes(range(226, 256)) * 4, b"\0" * 100, b"not a checkpoint"])
def test_corrupt_pth_is_reported_corrupt_not_as_a_pickle(content, tmp_path, capsys):
    path = tmp_path / "bad.pth"
    path.write_bytes(content)
    assert evaluate_main(["--model", "deit", "--checkpoint", str(path), "--limit", "8", "--quiet",
                          "--out", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "cannot read checkpoint: the file is corrupt, truncated or not a PyTorch checkpoint" in line
    assert "--allow-pickle" not in line and "pickles" not in line and "Download or copy it again" in line


def test_truncated_torch_save_is_corrupt(tmp_path):
    from robustbench_pid.errors import CheckpointError
    from robustbench_pid.loaders.file import load_file

    path = tmp_path / "t.pth"
    torch.save({"w": torch.ones(4)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="is corrupt, truncated or not a PyTorch checkpoint") as exc:
        load_file(str(path))
    assert "allow-pickle" not in str(exc.value)


def test_eps_zero_refused_like_steps_zero(tmp_path, capsys):
    assert evaluate_main(["--model", "deit", "--attack", "pgd", "--eps", "0", "--limit", "8", "--quiet",
                          "--out", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "attack 'pgd': eps must be > 0, got 0" in line and "repeat clean accuracy" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("setting,says", [("random_start = 1", "setting 'random_start' must be true or false (bool), "
                                                                "got 1"),
                                          ("early_stop = 0.0", "setting 'early_stop' must be true or false (bool)"),
                                          ("steps = true", "setting 'steps' must be a whole number (int), got True")])
def test_suite_booleans_are_strict(setting, says, tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text(f'[[attack]]\nname = "pgd"\neps = "2/255"\n{setting}\n')
    assert evaluate_main(["--model", "deit", "--suite", str(suite), "--limit", "8", "--quiet",
                          "--out", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "[[attack]] #1" in line and says in line, line


# --- item 13: did-you-mean for models, eps as k/255 ----------------------------------------------------------
@pytest.mark.parametrize("typo,meant", [("pid_dit", "pid_deit"), ("deitt", "deit"), ("timm:resnet1", "timm:resnet18")])
def test_model_typo_did_you_mean(typo, meant, tmp_path, capsys):
    assert evaluate_main(["--model", typo, "--limit", "8", "--quiet", "--out", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"Did you mean {meant!r}?" in line, line


def test_eps_shown_as_k_over_255(tmp_path, capsys):
    assert evaluate_main(["--model", "deit", "--attack", "fgsm", "--eps", "0.5/255", "--limit", "8", "--quiet",
                          "--out", str(tmp_path / "run")]) == 0
    table = capsys.readouterr().out
    assert " 0.5/255 " in table and "0.00196078" not in table
    assert main(["list", "attacks"]) == 0
    text = capsys.readouterr().out
    assert "eps=3/255" in text and "eps=4/255" in text and "0.0117647" not in text and "0.01568" not in text
    assert "eps=0.3" in text  # noise: a short decimal stays one


def test_eps_text_fractions():
    from robustbench_pid.core.labels import eps_text

    assert [eps_text(v, "linf") for v in (0.5 / 255, 1.5 / 255, 3 / 255, 0.3, 0.1, 0.03)] == [
        "0.5/255", "1.5/255", "3/255", "0.3", "0.1", "0.03"]
    assert eps_text(0.5 / 255, "l2") == "0.00196078"  # only L-inf eps is in pixel levels


def test_registered_model_on_wrong_images_in_attack_and_name_with_data(tmp_path):
    x, y = _xy()
    with pytest.raises(UserError, match=r"the model failed on a batch of shape \(2, 3, 8, 8\)"):
        rbp.attack("deit", x, y, "fgsm", eps=2 / 255)
    with pytest.raises(UserError, match=r"data= goes with a model object; .* model=rbp.load_model\('deit', dataset"):
        _evaluate(tmp_path, model="deit", data=(x, y))


@pytest.mark.parametrize("kw,says", [
    ({"seed": 1.5}, "seed must be a whole number (int), got 1.5"),
    ({"seed": -1}, "--seed must be >= 0"),
    ({"limit": True}, "limit must be a whole number (int), got True"),
    ({"batch_size": 2.5}, "batch_size must be a whole number (int), got 2.5"),
    ({"workers": 0.5}, "workers must be a whole number (int), got 0.5"),
    ({"non_strict": "false"}, "non_strict must be True or False, got 'false'"),
    ({"indicators": "no"}, "indicators must be True or False, got 'no'"),
    ({"device": "mps"}, "unknown device 'mps'; use auto, cpu, cuda or cuda:N"),
    ({"device": "meta"}, "unknown device 'meta'"),
])
def test_api_switches_counts_and_device_refused_before_any_folder(kw, says, tmp_path):
    """Through the Python API a value the CLI's parser would refuse is refused too, before anything is written:
    no truthy string for a switch, no float or bool for a count, no device the runner is not built for."""
    with pytest.raises(UserError) as err:
        rbp.evaluate(model="deit", attack="fgsm", eps="2/255", **{"limit": 4, **kw}, out=tmp_path / "run")
    assert says in str(err.value)
    assert not (tmp_path / "run").exists()


def test_api_takes_numpy_counts_and_switches_as_python_ones(tmp_path):
    df = rbp.evaluate(model="deit", attack="fgsm", eps="2/255", limit=np.int64(4), seed=np.int32(3),
                      quiet=np.True_, out=tmp_path / "run")
    info = json.loads((Path(df.attrs["run_dir"]) / "run.json").read_text())
    assert info["seed"] == 3 and isinstance(info["seed"], int) and int(df[df["attack"] == "clean"]["n"].iloc[0]) == 4


class Later(Linear):
    """Keeps the output contract for its first ``good`` calls, then breaks it (``mode``)."""

    def __init__(self, mode: str, good: int = 2) -> None:
        super().__init__()
        self.late, self.good, self.calls = mode, good, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = super().forward(x)
        if self.calls <= self.good:
            return out
        return {"tuple": (out, out), "dict": {"logits": out}, "wider": torch.cat([out, out], 1),
                "flat": out.flatten()}[self.late]


@pytest.mark.parametrize("protocol", ["standard", "paper"])
@pytest.mark.parametrize("mode, got", [("tuple", "returned tuple on forward call 3"),
                                       ("dict", "returned dict on forward call 3"),
                                       ("wider", "returned Tensor (16, 10) torch.float32 on forward call 3"),
                                       ("flat", "returned Tensor (80,) torch.float32 on forward call 3")])
def test_a_model_that_breaks_its_output_after_the_probe_is_one_error(tmp_path, protocol, mode, got):
    """The probe checks two calls; a model returning a tuple (another head, a flat vector) only later was an
    AttributeError traceback inside the attack. Every call is checked now, the paper protocol's .net calls too."""
    x, y = _xy()
    with pytest.raises(UserError) as exc:
        _evaluate(tmp_path, model=Later(mode), data=(x, y), attack="pgd", eps="2/255", steps=2, protocol=protocol)
    msg = str(exc.value)
    assert got in msg and "(its earlier calls returned (batch, 5) logits)" in msg and "\n" not in msg, msg
    assert "on every call" in msg
    ok = _evaluate(tmp_path / "ok", model=Later("tuple", good=10 ** 6), data=(x, y), attack="pgd", eps="2/255",
                   steps=2, protocol=protocol)
    assert set(ok["attack"]) == {"clean", "pgd"}
    with pytest.raises(UserError, match="returned tuple on forward call 3"):
        rbp.attack(Later("tuple"), x, y, "pgd", eps=2 / 255, steps=2)


class Gray(nn.Module):
    """A classifier of C-channel 8x8 images in [0, 1] (no normalisation of its own to wrap)."""

    def __init__(self, channels: int = 1, classes: int = 5) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(channels * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_a_model_object_of_any_channel_count_runs_unnormalised_by_default(tmp_path, channels):
    """Issue 44: a 1-channel model object was refused without mean=/std=; the default is no normalisation whatever the
    channel count, so the run evaluates the model itself (its clean predictions are the model's own)."""
    torch.manual_seed(1)
    x, y = torch.rand(N, channels, 8, 8), torch.randint(0, 5, (N,))
    net = Gray(channels)
    df = _evaluate(tmp_path, model=net, data=(x, y), attack="pgd", eps="4/255", steps=2)
    clean = df[(df["attack"] == "clean") & (df["metric"] == "top1")]["value"].item()
    assert clean == pytest.approx(100 * (net(x).argmax(1) == y).float().mean().item())
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["model_config"]["mean"] == [] and info["model_config"]["std"] == []  # recorded: no normalisation
    adv = rbp.attack(net, x, y, "pgd", eps=4 / 255, steps=2)
    assert adv.shape == x.shape and float((adv - x).abs().max()) <= 4 / 255 + 1e-6
    z = rbp.attack(net, x, y, "fgsm", eps=4 / 255, protocol="paper")  # the "normalised" tensor is the image itself
    assert float((z - x).abs().max()) == pytest.approx(4 / 255, abs=1e-6)


def test_mean_std_must_have_one_value_per_channel_of_the_data_and_the_fixes_named_work(tmp_path):
    """mean=[0.5], std=[0.5] on 3-channel images was broadcast silently (another function than the model's); a
    1-channel model given three values was told to repeat its images to 3 channels, which crashed in the model."""
    x3, y = _xy()
    with pytest.raises(UserError, match=r"mean=/std= have 1 value\(s\) but the images have 3 channel\(s\)"):
        _evaluate(tmp_path, model=Linear(), data=(x3, y), mean=[0.5], std=[0.5])
    with pytest.raises(UserError, match=r"mean=/std= have 1 value\(s\) but the images have 3 channel\(s\)"):
        rbp.attack(Linear(), x3, y, "fgsm", eps=2 / 255, mean=[0.5], std=[0.5])
    with pytest.raises(UserError, match="need one finite number per channel"):
        _evaluate(tmp_path, model=Linear(), data=(x3, y), mean=[], std=[])
    x1 = x3[:, :1]
    with pytest.raises(UserError) as exc:
        _evaluate(tmp_path, model=Gray(1), data=(x1, y), mean=[0.5] * 3, std=[0.5] * 3)
    msg = str(exc.value)
    assert "have 3 value(s) but the images have 1 channel(s)" in msg and "repeat" not in msg
    assert "or leave mean=/std= out for a model that takes [0, 1] images as they are" in msg
    assert not (tmp_path / "run").exists()
    _evaluate(tmp_path / "a", model=Gray(1), data=(x1, y))  # the fix it names: leave them out
    _evaluate(tmp_path / "b", model=Gray(1), data=(x1, y), mean=[0.5], std=[0.5])  # or one value per channel
    # a registered 3-channel model given grayscale images: the repeat it names runs
    deit, g = rbp.load_model("deit"), torch.rand(4, 1, 32, 32)
    with pytest.raises(UserError, match=r"give it 3-channel images \(grayscale to RGB: x.repeat\(1, 3, 1, 1\)\)"):
        _evaluate(tmp_path / "c", model=deit, data=(g, y[:4]))
    _evaluate(tmp_path / "d", model=deit, data=(g.repeat(1, 3, 1, 1), y[:4]))


def test_an_unnormalised_model_objects_identity_is_unchanged():
    """The identity normalisation became one broadcast value; the content hash of a model object without
    mean=/std= is what it was (three zeros and ones), so its run folders still resume."""
    from robustbench_pid.models.wrapper import Normalized
    from robustbench_pid.run.objects import state_sha256, wrap_model

    net = Linear()
    assert wrap_model(net).info["checkpoint_sha256"] == state_sha256(Normalized(net, [0.0] * 3, [1.0] * 3))
    assert wrap_model(net, [0.0] * 3, [1.0] * 3).info["checkpoint_sha256"] == \
        state_sha256(Normalized(net, [0.0] * 3, [1.0] * 3))

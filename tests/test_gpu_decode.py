"""``--decode gpu`` (issue 48, item 1): the batched tensor decoder (``data/batch_decode.py``) run on the CPU, where
``torchvision.io.decode_jpeg`` reads the same libjpeg-turbo output as PIL, against the PIL path of the ImageNet
datasets; the run's identity and provenance; the one-line refusals where it enters. The CUDA test at the end
measures the same agreement with nvjpeg on a GPU.

Measured on this repository's CPU (torchvision 0.29, 12 generated photo-like JPEGs): decoded pixels are identical;
the resize of uint8 tensors rounds differently from PIL's: DeiT's (bicubic, shorter side 256, crop 224) max
|diff| 2/255, mean 0.0044/255 (0.4% of values differ by 1/255); the squash crop mode's max 4/255, mean 0.08/255.
ImageNet-C's 224x224 files (no resize) are identical, and the clean top-1 verdicts of a seeded random-init
PID DeiT-tiny are the same sample for sample."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Dict, List

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import robustbench_pid as rbp
from robustbench_pid.cli import main as cli_main
from robustbench_pid.data.batch_decode import BatchDecoder, EncodedFiles, collate_encoded, decode_datasets
from robustbench_pid.errors import UserError
from robustbench_pid.results.files.run_files import default_out
from robustbench_pid.run.spec_builder import build_spec
from robustbench_pid.specs import RunSpec

DEIT = {"input_size": (3, 224, 224), "interpolation": "bicubic", "crop_pct": 0.875}
SMALL = {"input_size": (3, 160, 160), "interpolation": "bilinear", "crop_pct": 0.95}
CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """12 photo-like JPEGs at ImageNet validation sizes (500x375, 375x500, ...), the layout --dataset imagenet reads."""
    from robustbench_pid.data.generators.jpeg_tree import build_tree

    root = tmp_path_factory.mktemp("jpeg_tree")
    build_tree(root, 12, seed=3)
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """Seeded random PID DeiT-tiny weights (ImageNet head), every matrix drawn from N(0, 0.02): timm's own init
    predicts one class for every image; these predict 4 classes on the 12 images (top-2 logit gaps down to 0.008;
    the two decoders' logits differ by at most 2e-4). Weights from N(0, 0.3) make a chaotic network instead
    (logits moved by 1.9 by the 1/255 differences; one verdict of 12 flips): no model a study evaluates."""
    from robustbench_pid.models.zoo import build_model

    torch.manual_seed(0)
    net = build_model("pid_deit_tiny_patch16_224", num_classes=1000)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    path = tmp_path_factory.mktemp("ck") / "pid_deit_tiny_random.pth"
    torch.save(net.state_dict(), path)
    return path


def _load(name: str, root: Path, info: Dict, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "a partial copy": a generated tree is one
        return rbp.load_dataset(name, root=str(root), model_info=info, **kw)


def _both(ds, info: Dict, device: str = "cpu"):
    """(PIL path, tensor path on ``device``) images of the whole dataset, on the CPU."""
    pil = torch.stack([ds[i][0] for i in range(len(ds))])
    enc = EncodedFiles(ds)
    batch, labels = collate_encoded([enc[i] for i in range(len(ds))])
    assert labels.tolist() == [int(ds[i][1]) for i in range(len(ds))]
    return pil, BatchDecoder(info, torch.device(device))(batch).cpu()


def test_the_tensor_path_gives_the_pil_path_pixels_within_one_level(tree: Path) -> None:
    # (model config, max |diff| in levels of 1/255, mean |diff| bound): measured 2 / 0.0044, 1 / 0.0020, 4 / 0.081
    for info, top, mean in ((DEIT, 2, 0.01), (SMALL, 1, 0.005), ({**DEIT, "crop_mode": "squash"}, 4, 0.1)):
        ds = _load("imagenet", tree, info)
        pil, dev = _both(ds, info)
        side = info["input_size"][-1]
        assert dev.shape == pil.shape == (12, 3, side, side) and dev.dtype == torch.float32
        diff = (dev - pil).abs() * 255
        # the decoded pixels are libjpeg-turbo's on both sides; only the resize's rounding differs
        assert float(diff.max()) <= top + 1e-4, info
        assert float(diff.mean()) < mean, info
        assert float((diff > 1.5).float().mean()) < 1e-4, info  # a 2-level difference: a handful of pixels


def test_imagenet_c_files_are_decoded_unchanged_and_a_wrong_size_is_the_cpu_error(tmp_path: Path, tree: Path) -> None:
    from robustbench_pid.core.imagenet_info import imagenet_wnids

    wnids = imagenet_wnids()
    rng = np.random.default_rng(0)
    clean = tmp_path / "val"
    for k, w in enumerate(wnids[:2]):
        for s in range(1, 6):
            d = tmp_path / "c" / "fog" / str(s) / w
            d.mkdir(parents=True)
            arr = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
            Image.fromarray(arr).save(d / f"img_{k}.JPEG", quality=85)
        (clean / w).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(clean / w / f"img_{k}.JPEG")
    ds = _load("imagenet-c", tmp_path / "c", DEIT, corruptions=["fog"], imagenet_root=str(clean))
    assert ds.conditions[0] == "clean" and len(ds) == 12
    pil, dev = _both(ds, DEIT)
    assert torch.equal(pil[2:], dev[2:])  # 224x224 files: decoded, never resized, bit for bit
    assert float((pil[:2] - dev[:2]).abs().max()) * 255 <= 1.0 + 1e-4  # the clean condition: the eval transform
    small_pil, small_dev = _both(_load("imagenet-c", tmp_path / "c", SMALL, corruptions=["fog"]), SMALL)
    assert small_dev.shape == (10, 3, 160, 160) and float((small_pil - small_dev).abs().max()) * 255 <= 1.0 + 1e-4
    bad = tmp_path / "c" / "fog" / "3" / wnids[0] / "img_0.JPEG"
    Image.fromarray(rng.integers(0, 256, (200, 224, 3), dtype=np.uint8)).save(bad)
    enc = EncodedFiles(ds)
    with pytest.raises(UserError, match=r"img_0.JPEG is 224x200, not 224x224 as every ImageNet-C file is"):
        BatchDecoder(DEIT, torch.device("cpu"))(collate_encoded([enc[i] for i in range(len(ds))])[0])


def test_png_greyscale_and_unreadable_files_take_the_cpu_path(tmp_path: Path) -> None:
    from robustbench_pid.core.imagenet_info import imagenet_wnids

    w = imagenet_wnids()[5]
    (tmp_path / w).mkdir()
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (300, 280, 3), dtype=np.uint8)).save(tmp_path / w / "a.png")
    Image.fromarray(rng.integers(0, 256, (260, 300), dtype=np.uint8)).save(tmp_path / w / "b.JPEG")  # greyscale
    ds = _load("imagenet", tmp_path, DEIT)
    with pytest.warns(UserWarning, match=r"a.png is not a JPEG the cpu decoder reads; decoded on the CPU"):
        pil, dev = _both(ds, DEIT)
    assert float((pil - dev).abs().max()) * 255 <= 1.0 + 1e-4
    (tmp_path / w / "b.JPEG").write_bytes(b"\xff\xd8 not a jpeg")
    enc = EncodedFiles(ds)
    with pytest.warns(UserWarning), pytest.raises(UserError, match=r"cannot read image .*b.JPEG.*--skip-unreadable"):
        BatchDecoder(DEIT, torch.device("cpu"))(collate_encoded([enc[i] for i in range(len(ds))])[0])


def _records(out: Path) -> pd.DataFrame:
    r = pd.read_parquet(out / "records.parquet")
    return r.sort_values("sample_id").reset_index(drop=True)


def test_a_run_decoding_on_the_device_agrees_and_its_folder_keeps_its_decoder(tmp_path: Path, tree: Path,
                                                                               checkpoint: Path, monkeypatch) -> None:
    """The runner's --decode gpu path (file bytes through the loader, decoded in the main process) with the device
    the CPU: the entry's CUDA check is the only thing switched off."""
    from robustbench_pid.run import context, runner

    base = dict(model="pid_deit", checkpoint=str(checkpoint), dataset="imagenet", split="val", data_root=str(tree),
                benchmark="adversarial", batch_size=5, chunk_size=6, device="cpu", quiet=True)
    runner.run(RunSpec(**base, out=tmp_path / "cpu"))
    monkeypatch.setattr(context, "check_decode", lambda *a, **k: None)
    runner.run(RunSpec(**base, out=tmp_path / "gpu", decode="gpu"))
    cpu, dev = _records(tmp_path / "cpu"), _records(tmp_path / "gpu")
    assert len(cpu) == len(dev) == 12 and cpu["sample_id"].tolist() == dev["sample_id"].tolist()
    assert cpu["pred"].tolist() == dev["pred"].tolist()  # clean top-1 verdicts, sample for sample
    assert cpu["correct_top5"].tolist() == dev["correct_top5"].tolist()
    assert cpu["pred"].nunique() >= 3  # a model that tells the images apart, not one answer for all
    run_cpu = json.loads((tmp_path / "cpu" / "run.json").read_text())
    run_gpu = json.loads((tmp_path / "gpu" / "run.json").read_text())
    assert run_cpu["decode"]["decode"] == "cpu" and "decode" not in run_cpu["spec"]
    assert run_gpu["spec"]["decode"] == "gpu" and run_gpu["decode"]["decode"] == "gpu"
    assert run_gpu["decode"]["device"] == "cpu" and run_gpu["decode"]["center_crop"] == 224
    assert run_gpu["decode"]["resize"]["size"] == 256 and run_gpu["decode"]["resize"]["interpolation"] == "bicubic"
    # another decoder is another measurement: the cpu folder refuses the gpu run, naming the setting
    with pytest.raises(UserError, match=r"another configuration \(decode: cpu -> gpu\)"):
        runner.run(RunSpec(**base, out=tmp_path / "cpu", decode="gpu"))
    assert run_cpu["plan_hash"] != run_gpu["plan_hash"]


def test_the_decoder_names_the_run_folder_and_cpu_keeps_the_old_name(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kw = dict(dataset="imagenet", data_root="/nowhere", attack="pgd", eps="4/255", dry_run=True)
    cpu, gpu = build_spec("pid_deit", **kw), build_spec("pid_deit", decode="gpu", **kw)
    assert "decode" not in cpu.as_dict() and gpu.as_dict()["decode"] == "gpu"
    assert default_out(cpu) == default_out(build_spec("pid_deit", decode="cpu", **kw)) != default_out(gpu)


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_without_cuda_decode_gpu_is_one_error_line_and_writes_nothing(tmp_path: Path, tree: Path, capsys,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    rc = cli_main(["evaluate", "--model", "pid_deit", "--dataset", "imagenet", "--data-root", str(tree),
                   "--decode", "gpu", "--out", str(out), "--quiet"])
    assert rc == 2 and not out.exists()
    assert _one_error(capsys) == ("error: --decode gpu needs a CUDA device (torch.cuda.is_available() is False); "
                                  "drop --decode gpu or run on a GPU machine")
    with pytest.raises(UserError, match="needs a CUDA device"):  # the Python API: the same check
        rbp.evaluate("pid_deit", dataset="imagenet", data_root=str(tree), decode="gpu", out=str(out))
    assert not out.exists()


@pytest.mark.parametrize("kw,says", [
    (dict(decode="tpu"), r"--decode 'tpu': choose cpu .* or gpu"),
    (dict(dataset="digits", data_root=None), r"--decode gpu reads JPEG files \(datasets imagenet, imagenet-a,.*"
                                             r"dataset 'digits' is not read from files: drop --decode gpu"),
    (dict(benchmark="corruptions"), r"corruptions benchmark corrupts CPU images .*drop --decode gpu"),
    (dict(device="cpu"), r"--decode gpu decodes on the run's GPU but --device cpu runs on the CPU"),
])
def test_decode_settings_that_cannot_run_are_refused_where_they_enter(kw, says, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what is refused here is not the missing GPU
    args = {"dataset": "imagenet", "data_root": "/nowhere", "decode": "gpu", "dry_run": True, **kw}
    with pytest.raises(UserError, match=says):
        build_spec("pid_deit", **args)


def test_a_data_object_and_a_border_crop_model_are_refused(monkeypatch) -> None:
    from robustbench_pid.data.batch_decode import tensor_steps

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 3))
    x, y = torch.rand(4, 3, 4, 4), torch.tensor([0, 1, 2, 0])
    with pytest.raises(UserError, match="a data object is read as it is: drop decode='gpu'"):
        rbp.evaluate(net, data=(x, y), decode="gpu", quiet=True)
    with pytest.raises(UserError, match="crop_mode is 'border'.*only the CPU path implements; drop --decode gpu"):
        tensor_steps({**DEIT, "crop_mode": "border"})
    assert set(decode_datasets()) >= {"imagenet", "imagenet-a", "imagenet-r", "imagenet-o", "imagenet-c"}


@pytest.mark.skipif(not CUDA, reason="measures nvjpeg and the CUDA resize against PIL: needs a CUDA device")
def test_cuda_decode_agrees_with_the_pil_path(tree: Path, checkpoint: Path) -> None:
    """nvjpeg's IDCT and upsampling and the float resize on CUDA round differently from libjpeg-turbo and PIL: the
    bounds are loose; scripts/bench_decode.py states the measured differences."""
    from robustbench_pid.models import load_model

    ds = _load("imagenet", tree, DEIT)
    pil, dev = _both(ds, DEIT, "cuda")
    diff = (dev - pil).abs() * 255
    assert float(diff.max()) <= 32 and float(diff.mean()) <= 2.0, (float(diff.max()), float(diff.mean()))
    model = load_model("pid_deit", str(checkpoint), "imagenet").cuda().eval()
    with torch.inference_mode():
        a = model(pil.cuda()).argmax(1)
        b = model(dev.cuda()).argmax(1)
    assert int((a == b).sum()) >= len(a) - 1  # a random-init model: at most one near-tie may flip

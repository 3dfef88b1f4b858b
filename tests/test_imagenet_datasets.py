"""ImageNet-family datasets on synthetic trees in each real layout (tiny JPEGs, real wnid names)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from robustbench_pid import load_dataset
from robustbench_pid.data.imagenet import IMAGENET_ROOT_ENV, choose_subset
from robustbench_pid.errors import UserError
from robustbench_pid.core.imagenet_info import CORRUPTIONS_15, imagenet_wnids, subset_indices, subset_wnids

DEIT_INFO = {"input_size": [3, 224, 224], "crop_pct": 0.875, "interpolation": "bicubic"}
WN = imagenet_wnids()


def jpeg(path: Path, size=(20, 16), seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, quality=90)
    return path


def tree(root: Path, folders, per: int = 2, ext: str = ".JPEG", size=(20, 16)) -> Path:
    for i, f in enumerate(folders):
        for k in range(per):
            jpeg(root / str(f) / f"img_{k}{ext}", size=size, seed=i * 10 + k)
    return root


def test_imagenet_val_labels_transform_and_provenance(tmp_path):
    chosen = [WN[0], WN[417], WN[999]]
    tree(tmp_path / "val", chosen[::-1], size=(300, 260))  # the val/ level is optional
    ds = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO)
    assert len(ds) == 6
    for i, sid in enumerate(ds.sample_ids):
        wnid = sid.split("/")[0]
        assert ds.labels[i] == WN.index(wnid) == sorted(WN).index(wnid)
    assert sorted(set(ds.labels)) == [0, 417, 999]
    x, y = ds[0]
    assert x.shape == (3, 224, 224) and 0 <= float(x.min()) and float(x.max()) <= 1 and y == 0
    t = ds.provenance["transform"]
    assert (t["resize"], t["center_crop"], t["interpolation"]) == (256, 224, "bicubic")
    assert ds.provenance["n_classes_present"] == 3 and len(ds.provenance["sample_ids_sha256"]) == 64
    # another model config: 160 px, crop .95, bilinear -> Resize 168
    ds2 = load_dataset("imagenet", "val", str(tmp_path / "val"),
                       model_info={"input_size": [3, 160, 160], "crop_pct": 0.95, "interpolation": "bilinear"})
    assert ds2.provenance["transform"]["resize"] == 168 and ds2[0][0].shape == (3, 160, 160)


def test_subset_is_seeded_documented_and_recorded(tmp_path):
    tree(tmp_path, WN[:10], per=3)
    a = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO, subset=7, subset_seed=0)
    b = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO, subset=7, subset_seed=0)
    c = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO, subset=7, subset_seed=1)
    full = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO)
    assert a.sample_ids == b.sample_ids != c.sample_ids and len(a) == 7
    pos = sorted(np.random.default_rng(0).choice(30, size=7, replace=False))
    assert a.sample_ids == [full.sample_ids[i] for i in pos] == [full.sample_ids[i] for i in choose_subset(30, 7, 0)]
    assert a.provenance["subset"]["n"] == 7 and a.provenance["subset"]["seed"] == 0 and a.provenance["n_found"] == 30


@pytest.mark.parametrize("name,key", [("imagenet-a", "a"), ("imagenet-r", "r")])
def test_a_r_labels_and_mask(tmp_path, name, key):
    wn = subset_wnids(key)
    tree(tmp_path, [wn[0], wn[57], wn[199]], ext=".jpg")
    ds = load_dataset(name, "test", str(tmp_path), model_info=DEIT_INFO)
    assert ds.logit_indices == list(subset_indices(key))
    for sid, lab in zip(ds.sample_ids, ds.labels):
        assert lab == WN.index(sid.split("/")[0]) and lab in ds.logit_indices


def test_a_rejects_classes_outside_its_200(tmp_path):
    outside = next(w for w in WN if w not in subset_wnids("a"))
    tree(tmp_path, [subset_wnids("a")[0], outside])
    with pytest.raises(UserError, match=f"{outside}.*one of the 200 imagenet-a classes"):
        load_dataset("imagenet-a", "test", str(tmp_path), model_info=DEIT_INFO)


def test_imagenet_o_in_distribution_is_the_200_o_folders(tmp_path, monkeypatch):
    o = subset_wnids("o")
    tree(tmp_path / "o", [o[3], o[150]], per=2)
    not_o = [w for w in WN if w not in o][:5]
    tree(tmp_path / "in" / "val", list(o) + not_o, per=1, size=(8, 8))
    # the dataset reads no environment: the variable is only the default the spec builder fills in
    monkeypatch.setenv(IMAGENET_ROOT_ENV, str(tmp_path / "in"))
    with pytest.raises(UserError, match=f"--imagenet-root DIR.*default is \\${IMAGENET_ROOT_ENV}"):
        load_dataset("imagenet-o", "test", str(tmp_path / "o"), model_info=DEIT_INFO)
    ds = load_dataset("imagenet-o", "test", str(tmp_path / "o"), model_info=DEIT_INFO,
                      imagenet_root=str(tmp_path / "in"))
    ind = [s for s, f in zip(ds.sample_ids, ds.ood) if not f]
    ood = [s for s, f in zip(ds.sample_ids, ds.ood) if f]
    assert len(ind) == 200 and len(ood) == 4
    assert sorted(s.split("/")[1] for s in ind) == sorted(o)  # exactly the 200 O wnids, none of the others
    assert not any(w in s for s in ind for w in not_o)
    assert ds.logit_indices == list(subset_indices("o"))
    assert all(lab == WN.index(s.split("/")[1]) for s, lab in zip(ds.sample_ids, ds.labels))
    assert set(ds.conditions) == {"in", "ood"}
    # a missing O folder in the ImageNet root is named
    (tmp_path / "in2").mkdir()
    with pytest.raises(UserError, match=f"{o[0]}.*missing"):
        load_dataset("imagenet-o", "test", str(tmp_path / "o"), model_info=DEIT_INFO,
                     imagenet_root=str(tmp_path / "in2"))
    sub = load_dataset("imagenet-o", "test", str(tmp_path / "o"), model_info=DEIT_INFO, subset=24, subset_seed=0,
                       imagenet_root=str(tmp_path / "in"))
    assert sub.provenance["subset"]["n_ood"] == 1 and sub.provenance["subset"]["n_in"] == 23
    with pytest.raises(UserError, match="--subset 1 is too small: AUPR needs images of both halves"):
        load_dataset("imagenet-o", "test", str(tmp_path / "o"), model_info=DEIT_INFO, subset=1,
                     imagenet_root=str(tmp_path / "in"))


def _imagenet_c_tree(root: Path, wnids, per: int = 1, corruptions=CORRUPTIONS_15, category: bool = True):
    cats = {"gaussian_noise": "noise", "shot_noise": "noise", "impulse_noise": "noise", "defocus_blur": "blur"}
    for c in corruptions:
        base = root / cats[c] / c if (category and c in cats) else root / c
        for s in range(1, 6):
            tree(base / str(s), wnids, per=per, size=(224, 224))
    return root


def test_imagenet_c_layout_labels_no_resize(tmp_path, monkeypatch):
    monkeypatch.delenv(IMAGENET_ROOT_ENV, raising=False)
    wn = [WN[1], WN[998]]
    _imagenet_c_tree(tmp_path, wn)
    ds = load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO)
    assert len(ds) == 15 * 5 * 2 * 1
    assert ds.provenance["transform"]["resize"] is None
    conds = list(dict.fromkeys(ds.conditions))
    assert conds == [f"{c}/{s}" for c in CORRUPTIONS_15 for s in range(1, 6)]  # standard order, contiguous
    for sid, lab, cond in zip(ds.sample_ids, ds.labels, ds.conditions):
        c, s, w, _ = sid.split("/")
        assert f"{c}/{s}" == cond and lab == WN.index(w)
    x, _ = ds[0]
    assert x.shape == (3, 224, 224)
    ref = torch.from_numpy(np.array(Image.open(ds.path(0)).convert("RGB"))).permute(2, 0, 1) / 255.0
    assert torch.allclose(x, ref)  # read as is: no resize, no crop at 224
    sub = load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO, subset=1, subset_seed=3)
    keys = {s.split("/", 2)[2] for s in sub.sample_ids}
    assert len(sub) == 75 and len(keys) == 1  # the same image in every condition


def test_imagenet_c_clean_condition_from_imagenet_root(tmp_path, monkeypatch):
    wn = [WN[5]]
    _imagenet_c_tree(tmp_path / "c", wn, category=False)
    tree(tmp_path / "val", wn, per=1, size=(300, 300))
    monkeypatch.setenv(IMAGENET_ROOT_ENV, str(tmp_path / "val"))  # not read by the dataset: no clean condition
    assert "clean" not in load_dataset("imagenet-c", "test", str(tmp_path / "c"), model_info=DEIT_INFO).conditions
    ds = load_dataset("imagenet-c", "test", str(tmp_path / "c"), model_info=DEIT_INFO, imagenet_root=str(tmp_path / "val"))
    assert ds.conditions[0] == "clean" and ds.sample_ids[0] == f"clean/{wn[0]}/img_0.JPEG"
    assert ds[0][0].shape == (3, 224, 224) and ds.provenance["clean_transform"]["resize"] == 256


def test_imagenet_c_conditions_must_hold_the_same_images_and_skip_keeps_them_paired(tmp_path, monkeypatch):
    monkeypatch.delenv(IMAGENET_ROOT_ENV, raising=False)
    _imagenet_c_tree(tmp_path, [WN[0], WN[1]], per=2, category=False)
    gone = tmp_path / "frost" / "4" / WN[1] / "img_0.JPEG"
    data = gone.read_bytes()
    gone.unlink()
    with pytest.raises(UserError, match=f"{gone} is missing"):
        load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO)
    gone.write_bytes(data[:200])  # now present but truncated
    ds = load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO)
    with pytest.raises(UserError, match=f"cannot read image {gone}"):
        ds[ds.sample_ids.index(f"frost/4/{WN[1]}/img_0.JPEG")]
    ok = load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO, skip_unreadable=True)
    assert ok.n_unreadable == 1 and ok.provenance["unreadable"] == [str(gone)]
    assert len(ok) == 75 * 3 and not any(s.endswith(f"{WN[1]}/img_0.JPEG") for s in ok.sample_ids)


@pytest.mark.parametrize("problem,needle", [
    ("missing_corruption", r"corruption folder\(s\) missing.*: fog"),
    ("missing_severity", "severity folder .*snow/3 is missing"),
    ("unknown_folder", "rain is neither a corruption folder"),
])
def test_imagenet_c_bad_layouts(tmp_path, problem, needle):
    import shutil

    _imagenet_c_tree(tmp_path, [WN[0]], category=False)
    if problem == "missing_corruption":
        shutil.rmtree(tmp_path / "fog")
    elif problem == "missing_severity":
        shutil.rmtree(tmp_path / "snow" / "3")
    else:
        (tmp_path / "rain").mkdir()
    with pytest.raises(UserError, match=needle):
        load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO)


def test_imagenet_v2_labels_are_int_folder(tmp_path):
    tree(tmp_path, [0, 2, 10, 999], ext=".jpeg")
    ds = load_dataset("imagenet-v2", "test", str(tmp_path), model_info=DEIT_INFO)
    assert [s.split("/")[0] for s in ds.sample_ids][::2] == ["0", "2", "10", "999"]  # numeric order
    assert all(lab == int(s.split("/")[0]) for s, lab in zip(ds.sample_ids, ds.labels))
    (tmp_path / "n01440764").mkdir()
    with pytest.raises(UserError, match="not a class folder 0..999"):
        load_dataset("imagenet-v2", "test", str(tmp_path), model_info=DEIT_INFO)


def test_imagenet_sketch(tmp_path):
    tree(tmp_path / "sketch", [WN[10], WN[20]], per=1, size=(50, 80))
    ds = load_dataset("imagenet-sketch", "test", str(tmp_path), model_info=DEIT_INFO)
    assert ds.labels == [10, 20] and ds[1][0].shape == (3, 224, 224)


def test_bad_input_messages_name_the_path(tmp_path):
    with pytest.raises(UserError, match="needs --data-root"):
        load_dataset("imagenet", "val", None, model_info=DEIT_INFO)
    with pytest.raises(UserError, match=f"{tmp_path / 'nope'} does not exist"):
        load_dataset("imagenet", "val", str(tmp_path / "nope"), model_info=DEIT_INFO)
    tree(tmp_path / "a", [WN[0], "not_a_wnid"])
    with pytest.raises(UserError, match="not_a_wnid is not an ImageNet class"):
        load_dataset("imagenet", "val", str(tmp_path / "a"), model_info=DEIT_INFO)
    tree(tmp_path / "b", [WN[0]])
    (tmp_path / "b" / WN[1]).mkdir()
    with pytest.raises(UserError, match=f"class folder {tmp_path / 'b' / WN[1]} holds no images"):
        load_dataset("imagenet", "val", str(tmp_path / "b"), model_info=DEIT_INFO)


def test_unreadable_images_hard_error_or_skipped_and_counted(tmp_path):
    tree(tmp_path, [WN[0], WN[1]], per=2, size=(64, 64))
    bad = tmp_path / WN[1] / "img_1.JPEG"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 3])  # truncated
    junk = tmp_path / WN[0] / "img_9.JPEG"
    junk.write_bytes(b"not a jpeg")
    ds = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO)
    assert len(ds) == 5
    with pytest.raises(UserError, match=f"cannot read image {bad}.*--skip-unreadable"):
        ds[ds.sample_ids.index(f"{WN[1]}/img_1.JPEG")]
    with pytest.raises(UserError, match=f"cannot read image {junk}"):
        ds[ds.sample_ids.index(f"{WN[0]}/img_9.JPEG")]
    ok = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO, skip_unreadable=True)
    assert len(ok) == 3 and ok.n_unreadable == 2
    assert ok.provenance["n_unreadable"] == 2 and sorted(ok.provenance["unreadable"]) == sorted([str(bad), str(junk)])
    for i in range(len(ok)):
        assert ok[i][0].shape == (3, 224, 224)


def test_unreadable_image_in_a_worker_gives_the_one_line_message(tmp_path):
    from torch.utils.data import DataLoader

    from robustbench_pid.errors import without_worker_traceback

    tree(tmp_path, [WN[0]], per=2, size=(8, 8))
    bad = tmp_path / WN[0] / "img_1.JPEG"
    bad.write_bytes(b"junk")
    ds = load_dataset("imagenet", "val", str(tmp_path), model_info=DEIT_INFO)
    with pytest.raises(UserError) as info:
        for _ in without_worker_traceback(DataLoader(ds, batch_size=2, num_workers=1)):
            pass
    msg = str(info.value)
    assert msg.startswith(f"cannot read image {bad}") and "Traceback" not in msg


def test_imagenet_root_env_is_only_the_option_default_and_is_in_the_spec_and_hash(tmp_path, monkeypatch):
    from robustbench_pid.results.files.run_files import default_out
    from robustbench_pid.run.spec_builder import build_spec

    def spec(dataset="imagenet-c", **kw):
        root = {} if dataset == "digits" else {"data_root": str(tmp_path / "c")}
        return build_spec("timm:test_vit", dataset=dataset, **root, **kw)

    monkeypatch.delenv(IMAGENET_ROOT_ENV, raising=False)
    without = spec()
    assert "dataset" not in without.benchmark_options
    monkeypatch.setenv(IMAGENET_ROOT_ENV, str(tmp_path / "val"))
    with_env = spec()
    assert with_env.benchmark_options["dataset"] == {"imagenet_root": str(tmp_path / "val")}
    assert default_out(with_env) != default_out(without)  # another condition set, another run folder
    assert with_env == spec(imagenet_root=str(tmp_path / "val"))  # the env var is exactly the option's default
    explicit = spec(imagenet_root=str(tmp_path / "other"))
    assert explicit.benchmark_options["dataset"] == {"imagenet_root": str(tmp_path / "other")}  # option wins
    o = spec("imagenet-o")
    assert o.benchmark_options["dataset"] == {"imagenet_root": str(tmp_path / "val")}
    # datasets that read no ImageNet root ignore the variable entirely: same spec, same folder
    for name in ("digits", "imagenet", "imagenet-a"):
        a = spec(name)
        monkeypatch.delenv(IMAGENET_ROOT_ENV)
        assert spec(name) == a and "dataset" not in a.benchmark_options
        monkeypatch.setenv(IMAGENET_ROOT_ENV, str(tmp_path / "val"))
    # ... and refuse it when asked for explicitly
    with pytest.raises(UserError, match="does not take --imagenet-root .*only imagenet-o and imagenet-c"):
        spec("imagenet-a", imagenet_root=str(tmp_path / "val"))


def test_every_dataset_states_its_splits_and_refuses_others(tmp_path):
    from robustbench_pid.data import datasets
    from robustbench_pid.run.spec_builder import build_spec

    splits = {name: info.splits for name, info in datasets.items()}
    assert splits == {"digits": ("test", "train"), "cifar10": ("test", "train"), "cifar100": ("test", "train"),
                      "imagenet": ("val",), "cifar10-c": ("test",), "cifar100-c": ("test",),
                      **{n: ("test",) for n in ("imagenet-a", "imagenet-c", "imagenet-o", "imagenet-r",
                                                "imagenet-sketch", "imagenet-v2")}}
    tree(tmp_path, [WN[0]], per=1)
    with pytest.raises(UserError, match="dataset 'imagenet' has no split 'test'; valid splits: val"):
        load_dataset("imagenet", "test", str(tmp_path), model_info=DEIT_INFO)
    with pytest.raises(UserError, match="dataset 'imagenet-sketch' has no split 'val'; valid splits: test"):
        load_dataset("imagenet-sketch", "val", str(tmp_path), model_info=DEIT_INFO)
    assert len(load_dataset("imagenet", None, str(tmp_path), model_info=DEIT_INFO)) == 1  # its default: val
    # the spec carries the dataset's own default split, checked before any work
    assert build_spec("timm:test_vit", dataset="imagenet", data_root=str(tmp_path)).split == "val"
    assert build_spec("timm:test_vit", dataset="imagenet-r", data_root=str(tmp_path)).split == "test"
    assert build_spec("pid_deit").split == "test" and build_spec("pid_deit", split="train").split == "train"
    with pytest.raises(UserError, match="has no split 'val'; valid splits: test, train"):
        build_spec("pid_deit", split="val")


@pytest.mark.parametrize("dataset,kw,needle", [
    ("digits", {"skip_unreadable": True}, "'digits' does not take --skip-unreadable .*no image files"),
    ("digits", {"subset": 10, "subset_seed": 0}, "'digits' does not take --subset .*use --limit N"),
    ("imagenet", {"imagenet_root": "x"}, "'imagenet' does not take --imagenet-root .*only imagenet-o and imagenet-c"),
    ("imagenet", {"corruptions": ["fog"]}, "'imagenet' does not take dataset option 'corruptions' .*its options: "
                                           "subset, subset_seed, skip_unreadable"),
    ("imagenet-c", {"severities": [1]}, "dataset option 'severities' .*corruptions, imagenet_root, clean"),
])
def test_unknown_dataset_options_are_refused(tmp_path, dataset, kw, needle):
    root = None if dataset == "digits" else str(tmp_path)
    with pytest.raises(UserError, match=needle):
        load_dataset(dataset, None, root, model_info=DEIT_INFO, **kw)


def test_a_data_root_for_a_built_in_dataset_is_refused(tmp_path):
    from robustbench_pid.run.spec_builder import build_spec

    with pytest.raises(UserError, match="'digits' is built in and reads no --data-root; drop it"):
        load_dataset("digits", "test", str(tmp_path))
    with pytest.raises(UserError, match="'digits' does not take --skip-unreadable"):
        build_spec("pid_deit", skip_unreadable=True)  # refused when the spec is built, before any work


@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
def test_eval_transform_honours_timms_crop_mode_pixel_for_pixel(crop_mode):
    """timm configs name how an image meets the input square (centre crop, squash, or pad): the transform is
    timm's own, pixel for pixel (here normalised as the model does it), and the mode is recorded."""
    from timm.data import create_transform

    from robustbench_pid.data.imagenet import eval_transform

    info = {"input_size": [3, 32, 32], "crop_pct": 0.9, "interpolation": "bicubic", "crop_mode": crop_mode,
            "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, size=(30, 50, 3), dtype=np.uint8))
    tf, desc = eval_transform(info)
    theirs = create_transform(32, is_training=False, interpolation="bicubic", crop_pct=0.9, crop_mode=crop_mode,
                              mean=info["mean"], std=info["std"])(img)
    mean, std = torch.tensor(info["mean"])[:, None, None], torch.tensor(info["std"])[:, None, None]
    ours = tf(img)
    assert ours.shape == (3, 32, 32) and desc["crop_mode"] == crop_mode
    assert torch.allclose((ours - mean) / std, theirs, atol=1e-6)
    if crop_mode == "border":  # the 30-row image is padded with the mean colour above and below
        assert torch.allclose(ours[:, 0, 0], torch.tensor([124, 116, 104]) / 255.0)


def test_unknown_crop_mode_is_refused_and_timm_configs_reach_the_transform():
    import robustbench_pid as rbp
    from robustbench_pid.data.imagenet import eval_transform

    with pytest.raises(UserError, match="crop_mode 'stretch' is not supported.*center, squash, border"):
        eval_transform({**DEIT_INFO, "crop_mode": "stretch"})
    with pytest.warns(UserWarning, match="no checkpoint"):
        m = rbp.load_model("timm:convnext_tiny.in12k_ft_in1k_384")  # timm's config: 384 px, crop 1.0, squash
    assert (m.info["crop_mode"], m.info["crop_pct"], m.info["input_size"]) == ("squash", 1.0, [3, 384, 384])
    _, desc = eval_transform(m.info)
    assert (desc["crop_mode"], desc["resize"], desc["center_crop"]) == ("squash", 384, 384)
    assert eval_transform(DEIT_INFO)[1]["crop_mode"] == "center"  # a config that names none: timm's default

"""A benchmark runs only on the datasets whose samples it scores correctly, and the data readers refuse or
flag what would otherwise turn into a number of another protocol (tiny synthetic trees in the real layouts)."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from robustbench_pid import load_dataset
from robustbench_pid.benchmarks import benchmark_names, check_dataset, get_benchmark
from robustbench_pid.core.imagenet_info import ALEXNET_MEAN_ERR, CORRUPTIONS_15, SEVERITIES, subset_wnids
from robustbench_pid.data import dataset_info, datasets
from robustbench_pid.errors import UserError
from robustbench_pid.results.stats.metrics import mean_corruption_error, relative_mean_corruption_error
from robustbench_pid.results.summaries.corruptions import corruption_rows
from robustbench_pid.results.tables.comparisons import mce_statistic
from robustbench_pid.run.spec_builder import build_spec

from test_benchmarks_imagenet import _fake_corruption_records
from test_imagenet_datasets import WN, _imagenet_c_tree, jpeg, tree

INFO_384 = {"input_size": [3, 384, 384], "crop_pct": 1.0, "interpolation": "bicubic"}
DEIT_INFO = {"input_size": [3, 224, 224], "crop_pct": 0.875, "interpolation": "bicubic"}


@pytest.mark.parametrize("benchmark,dataset,fix", [
    ("adversarial", "imagenet-a", "restricted"),      # top-1 over 1000 logits is not IN-A's protocol
    ("adversarial", "imagenet-r", "restricted"),
    ("corruptions", "imagenet-c", "imagenet_c"),      # ImageNet-C files corrupted once more
    ("restricted", "imagenet-o", "ood"),              # OOD images have no true class
    ("imagenet_c", "imagenet-a", "restricted"),
    ("converge", "imagenet-o", "ood"),
    ("ood", "imagenet", "adversarial"),
    ("restricted", "digits", "adversarial"),
])
def test_a_benchmark_refuses_a_dataset_it_would_score_wrongly_and_names_the_fitting_ones(benchmark, dataset, fix):
    with pytest.raises(UserError, match=f"benchmark '{benchmark}' does not run on dataset '{dataset}'.*{fix}"):
        check_dataset(benchmark, dataset)
    root = {} if dataset == "digits" else {"data_root": "/nonexistent"}
    said = "is the convergence ladder, run by --converge" if benchmark == "converge" else "does not run on dataset"
    with pytest.raises(UserError, match=said):  # the ladder is never a --benchmark of its own
        build_spec("deit", dataset=dataset, benchmark=benchmark, **root)


def test_every_dataset_default_benchmark_fits_it_and_data_objects_are_not_checked():
    for name in datasets.names():
        info = dataset_info(name)
        assert info.samples in get_benchmark(info.default_benchmark).samples, name
    assert all(get_benchmark(b).samples for b in benchmark_names())
    check_dataset("adversarial", "my-own-data")  # a data object's name only labels its records


@pytest.mark.parametrize("dataset", ["imagenet-c", "imagenet-o"])
def test_limit_is_refused_where_the_first_samples_are_one_condition_or_one_half(dataset):
    with pytest.raises(UserError, match=f"--limit 8 on {dataset} would take .*use --subset 8"):
        build_spec("deit", dataset=dataset, data_root="/nonexistent", limit=8)


def test_imagenet_c_is_never_padded_a_larger_model_gets_the_whole_image_resized(tmp_path, monkeypatch):
    monkeypatch.delenv("ROBUSTBENCH_PID_IMAGENET_ROOT", raising=False)
    _imagenet_c_tree(tmp_path, [WN[2]], category=False)
    with pytest.warns(UserWarning, match="1 of the published 50,000 images of imagenet-c"):
        ds = load_dataset("imagenet-c", "test", str(tmp_path), model_info=INFO_384)
    x, _ = ds[0]
    assert x.shape == (3, 384, 384)
    assert (x.abs().sum(0) == 0).float().mean() < 0.01  # no zero border (CenterCrop(384) of 224 padded 66%)
    img = Image.open(ds.path(0)).convert("RGB")
    ref = torch.from_numpy(np.array(img.resize((384, 384), Image.BICUBIC))).permute(2, 0, 1) / 255.0
    assert (x - ref).abs().mean() < 0.02  # the whole image, resized (torchvision's antialiased bicubic vs PIL's)
    assert "224x224 -> 384x384" in ds.provenance["transform"]["resize"]
    assert ds.provenance["partial"] == {"imagenet-c": {"found": 1, "published": 50000}}


def test_imagenet_c_file_of_another_size_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("ROBUSTBENCH_PID_IMAGENET_ROOT", raising=False)
    _imagenet_c_tree(tmp_path, [WN[2]], category=False)
    bad = tmp_path / "fog" / "3" / WN[2] / "img_0.JPEG"
    jpeg(bad, size=(256, 256))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO)
    i = list(ds.sample_ids).index(f"fog/3/{WN[2]}/img_0.JPEG")
    with pytest.raises(UserError, match=f"{bad} is 256x256, not 224x224"):
        ds[i]


def test_imagenet_c_corruption_in_two_folders_is_refused(tmp_path):
    _imagenet_c_tree(tmp_path, [WN[2]], category=False)
    tree(tmp_path / "extra" / "fog" / "1", [WN[2]], per=1, size=(224, 224))
    with pytest.raises(UserError, match="corruption 'fog' is both .*extra/fog and .*fog; keep one"):
        load_dataset("imagenet-c", "test", str(tmp_path), model_info=DEIT_INFO)


def test_a_partial_tree_and_unread_files_are_said_and_a_subset_is_not_partial(tmp_path):
    a = subset_wnids("a")
    tree(tmp_path, [a[0], a[1]], per=2, ext=".jpg")
    (tmp_path / a[0] / "extra.webp").write_bytes(b"x")
    with pytest.warns(UserWarning) as seen:
        ds = load_dataset("imagenet-a", "test", str(tmp_path), model_info=DEIT_INFO)
    text = " | ".join(str(w.message) for w in seen)
    assert "4 of the published 7,500 images of imagenet-a" in text and "1 file(s)" in text and "extra.webp" in text
    assert ds.provenance["partial"] == {"imagenet-a": {"found": 4, "published": 7500}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sub = load_dataset("imagenet-a", "test", str(tmp_path), model_info=DEIT_INFO, subset=2)
    assert "partial" not in sub.provenance


def test_err_of_a_corruption_is_reported_only_over_all_five_severities():
    errs = {c: [0.2] * len(SEVERITIES) for c in CORRUPTIONS_15}
    errs["fog"] = [0.0, 0.0]  # a run cut short: severities 3..5 missing
    rows = corruption_rows(_fake_corruption_records("m", "imagenet-c", errs, 0.1)).set_index("metric")
    assert "err_fog" not in rows.index and "mce" not in rows.index
    assert rows.loc["err_snow", "value"] == pytest.approx(20.0)


def test_corruption_metrics_refuse_percent_and_partial_severities():
    c = "fog"
    assert mean_corruption_error({c: [0.5] * 5}) == pytest.approx(100 * 0.5 / ALEXNET_MEAN_ERR[c])
    assert mean_corruption_error({c: 0.5}) == pytest.approx(100 * 0.5 / ALEXNET_MEAN_ERR[c])  # a mean, as published
    with pytest.raises(ValueError, match=r"rates in \[0, 1\]"):
        mean_corruption_error({c: [50.0] * 5})
    with pytest.raises(ValueError, match="1 severities of errors against a baseline over 5"):
        mean_corruption_error({c: [0.5]})
    with pytest.raises(ValueError, match="2 severities of errors against a baseline over 3"):
        mean_corruption_error({c: [0.5, 0.4]}, baseline={c: [0.6, 0.7, 0.8]})
    with pytest.raises(ValueError, match="the clean error must be rates"):
        relative_mean_corruption_error({c: [0.5] * 5}, clean_error=20.0)


def test_mce_interval_is_alexnet_normalised_only_where_the_summary_is():
    assert mce_statistic(["fog/1"], "imagenet-c")[1] == "mCE (AlexNet-normalized)"
    for other in ("imagenet-sketch", "imagenet-v2", "digits"):
        stat, why = mce_statistic(["fog/1"], other)
        assert stat is None and "--ce-baseline" in why


def test_ce_against_a_model_baseline_pairs_severities_by_name_and_needs_all_five():
    """Outside ImageNet the CE baseline is another model's run: severities {1, 3} of one are not divided by
    {1, 2} of the other, and a CE over 2 of the 5 severities is not reported (nor an mCE over it)."""
    from robustbench_pid.results.summaries.corruptions import corruption_rows

    five = {c: [0.1, 0.2, 0.3, 0.4, 0.5] for c in ("fog", "snow")}
    m = _fake_corruption_records("m", "digits-c", {"fog": [0.2, 0.4], "snow": five["snow"]}, 0.1)
    fog2 = (m["corruption"] == "fog") & (m["severity"] == 2)
    m.loc[fog2, "severity"], m.loc[fog2, "condition"], m.loc[fog2, "attack"] = 3, "fog/3", "fog/3"  # m: fog at 1, 3
    b = _fake_corruption_records("b", "digits-c", {"fog": [0.2, 0.4], "snow": five["snow"]}, 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = corruption_rows(pd.concat([m, b], ignore_index=True), baseline="b")
    got = rows[rows["model"] == "m"].set_index("metric")
    assert "ce_fog" not in got.index and "err_fog" not in got.index
    assert got.loc["ce_snow", "value"] == pytest.approx(100.0)  # the same errors as the baseline, all 5 severities

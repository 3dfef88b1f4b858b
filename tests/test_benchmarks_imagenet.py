"""ImageNet benchmarks end to end on synthetic trees with a tiny random 1000-class timm model:
masked top-1/5 (IN-A/-R), OOD scores and AUPR (IN-O), CE/mCE from the ImageNet-C layout."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import average_precision_score

import robustbench_pid as rbp
from robustbench_pid.core.imagenet_info import ALEXNET_MEAN_ERR, CORRUPTIONS_15, imagenet_wnids, subset_indices, subset_wnids
from robustbench_pid.results.stats.metrics import mean_corruption_error, relative_mean_corruption_error
from robustbench_pid.run.runner import run
from robustbench_pid.specs import RunSpec

from test_imagenet_datasets import _imagenet_c_tree, tree  # noqa: E402

MODEL = "timm:test_vit"  # 160 px, 1000 classes, random weights: enough to check the bookkeeping
WN = imagenet_wnids()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Fixed random weights, so the run and the test's own forward pass use the same model."""
    from safetensors.torch import save_file

    from robustbench_pid.models.zoo import build_model

    torch.manual_seed(0)
    net = build_model("test_vit", num_classes=1000)
    path = tmp_path_factory.mktemp("ckpt") / "test_vit.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return str(path)


def _spec(tmp_path, dataset, root, ckpt, **kw):
    # on the CPU, explicitly: the records are compared with the test's own CPU forward passes
    return RunSpec(model=MODEL, checkpoint=ckpt, dataset=dataset, data_root=str(root), out=tmp_path / "run",
                   quiet=True, batch_size=16, device="cpu", **kw)


def _logits(model, ds):
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    with torch.inference_mode():
        return model(x).float()


def test_restricted_imagenet_r_masked_topk(tmp_path, ckpt):
    from robustbench_pid.data import dataset_info

    assert dataset_info("imagenet-r").default_benchmark == "restricted"
    wn = subset_wnids("r")
    tree(tmp_path / "r", [wn[i] for i in (0, 9, 77, 150, 199)], per=2, ext=".jpg", size=(40, 30))
    out = run(_spec(tmp_path, "imagenet-r", tmp_path / "r", benchmark="restricted", ckpt=ckpt))
    rec = rbp.load_records(out)
    model = rbp.load_model(MODEL, ckpt, dataset="imagenet-r")
    ds = rbp.load_dataset("imagenet-r", "test", str(tmp_path / "r"), model_info=model.info)
    logits = _logits(model, ds)
    idx = torch.tensor(subset_indices("r"))
    masked = logits[:, idx]
    pred = idx[masked.argmax(1)].numpy()
    top5 = idx[masked.topk(5, 1).indices].numpy()
    rec = rec.set_index("sample_id").loc[ds.sample_ids]
    assert (rec["pred"].to_numpy() == pred).all() and set(pred) <= set(subset_indices("r"))
    y = np.array(ds.labels)
    assert (rec["correct_top1"].to_numpy() == (pred == y)).all()
    assert (rec["correct_top5"].to_numpy() == (top5 == y[:, None]).any(1)).all()
    df = rbp.load_results(out)
    top1 = df[df.metric == "top1"].value.item()
    assert top1 == pytest.approx(100 * (pred == y).mean())
    assert df[df.metric == "skipped_unreadable"].value.item() == 0


def test_ood_imagenet_o_scores_and_aupr(tmp_path, ckpt):
    o = subset_wnids("o")
    tree(tmp_path / "o", [o[0], o[100]], per=20, size=(12, 12))  # 40 OOD : 200 in = the published 1:5
    tree(tmp_path / "in", list(o), per=1, size=(8, 8))
    in_root = {"dataset": {"imagenet_root": str(tmp_path / "in")}}
    # --subset 36 keeps the published 1:5 OOD : in ratio -> 6 OOD + 30 in-distribution images
    out = run(_spec(tmp_path, "imagenet-o", tmp_path / "o", benchmark="ood", ckpt=ckpt, subset=36,
                    benchmark_options=in_root))
    rec = rbp.load_records(out)
    assert len(rec) == 36 and rec["ood"].sum() == 6 and "score" in rec
    model = rbp.load_model(MODEL, ckpt, dataset="imagenet-o")
    ds = rbp.load_dataset("imagenet-o", "test", str(tmp_path / "o"), model_info=model.info, subset=36,
                          subset_seed=0, imagenet_root=str(tmp_path / "in"))
    logits = _logits(model, ds)
    idx = torch.tensor(subset_indices("o"))
    score = -torch.softmax(logits[:, idx], 1).amax(1).numpy()
    r = rec.set_index("sample_id").loc[ds.sample_ids]
    assert np.allclose(r["score"].to_numpy(), score, atol=1e-6)
    df = rbp.load_results(out)
    m = df.set_index("metric")["value"]
    assert m["aupr"] == pytest.approx(100 * average_precision_score(np.array(ds.ood, dtype=int), score), abs=1e-4)
    assert m["chance_aupr"] == pytest.approx(100 * 6 / 36)
    assert 0 <= m["auroc"] <= 100 and 0 <= m["fpr95"] <= 100
    # in-distribution accuracy only counts in-distribution rows
    assert df[df.metric == "top1"].n.item() == 30


@pytest.mark.slow  # 76 work units: ~20-60 s on 2 busy cores
def test_imagenet_c_mce_from_records(tmp_path, ckpt):
    wn = [WN[3], WN[700]]
    _imagenet_c_tree(tmp_path / "c", wn, per=1)
    tree(tmp_path / "val", wn, per=1, size=(240, 240))
    out = run(_spec(tmp_path, "imagenet-c", tmp_path / "c", benchmark="imagenet_c", chunk_size=4, ckpt=ckpt,
                    benchmark_options={"dataset": {"imagenet_root": str(tmp_path / "val")}}))
    rec = rbp.load_records(out)
    assert len(rec) == 2 * (1 + 75)
    assert set(rec.condition) == {"clean"} | {f"{c}/{s}" for c in CORRUPTIONS_15 for s in range(1, 6)}
    df = rbp.load_results(out).set_index("metric")
    errs = {c: [1 - rec[rec.condition == f"{c}/{s}"].correct_top1.mean() for s in range(1, 6)] for c in CORRUPTIONS_15}
    clean_err = 1 - rec[rec.condition == "clean"].correct_top1.mean()
    assert df.loc["mce", "value"] == pytest.approx(mean_corruption_error(errs))
    assert df.loc["relative_mce", "value"] == pytest.approx(relative_mean_corruption_error(errs, clean_err))
    for c in CORRUPTIONS_15:
        assert df.loc[f"ce_{c}", "value"] == pytest.approx(100 * np.mean(errs[c]) / ALEXNET_MEAN_ERR[c])
        assert df.loc[f"ce_{c}", "ce_baseline"] == "alexnet"
    assert df.loc["mean_err", "value"] == pytest.approx(100 * np.mean([np.mean(v) for v in errs.values()]))


def _fake_corruption_records(model: str, dataset: str, errs, clean_err: float, n: int = 20, run_id=None):
    """Records whose per-condition error rates are exactly ``errs`` (n samples per condition)."""
    rows = []
    conds = [("", 0, clean_err)] + [(c, s + 1, e) for c, es in errs.items() for s, e in enumerate(es)]
    for c, s, e in conds:
        wrong = int(round(e * n))
        for i in range(n):
            rows.append({"run_id": run_id or f"{model}_run", "model": model, "checkpoint_sha256": "x", "dataset": dataset,
                         "split": "test", "protocol": "standard", "benchmark": "corruptions",
                         "attack": f"{c}/{s}" if c else "clean", "eps": 0.0, "condition": f"{c}/{s}" if c else "clean",
                         "sample_id": str(i), "corruption": c, "severity": s,
                         "correct_top1": i >= wrong, "correct_top5": True})
    return pd.DataFrame(rows)


def test_corruption_rows_alexnet_for_imagenet_family():
    from robustbench_pid.results.summaries.corruptions import corruption_rows

    errs = {c: [0.1, 0.2, 0.3, 0.4, 0.5] for c in CORRUPTIONS_15}
    df = corruption_rows(_fake_corruption_records("m", "imagenet-c", errs, 0.1)).set_index("metric")
    expected = 100 * np.mean([0.3 / ALEXNET_MEAN_ERR[c] for c in CORRUPTIONS_15])
    assert df.loc["mce", "value"] == pytest.approx(expected)
    assert df.loc["relative_mce", "value"] == pytest.approx(
        100 * np.mean([(0.3 - 0.1) / (ALEXNET_MEAN_ERR[c] - 0.4348) for c in CORRUPTIONS_15]))
    assert df.loc["err_fog", "value"] == pytest.approx(30.0) and df.loc["mean_err", "value"] == pytest.approx(30.0)
    # digits: AlexNet does not apply -> unnormalized errors only
    d = corruption_rows(_fake_corruption_records("m", "digits", errs, 0.1))
    assert "mce" not in set(d.metric) and "mean_err" in set(d.metric)

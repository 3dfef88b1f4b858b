"""Rank-collapse metric, hooks and benchmark: exact values on constructed models, brute-force checks."""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import robustbench_pid  # noqa: F401
from robustbench_pid.probes.rank_collapse import layer_cosines, pairwise_cosine, token_representations
from robustbench_pid.results.report.plots import draw_rank_collapse
from robustbench_pid.models.pid_vit import PidGains, PidVisionTransformer
from robustbench_pid.models.wrapper import Normalized

SMALL = dict(img_size=16, patch_size=4, embed_dim=24, depth=3, num_heads=3, num_classes=5, mlp_ratio=2.0)


def brute_cosine(x: torch.Tensor) -> float:
    """1/(N(N-1)) sum_{i != j} cos(x_i, x_j), as written in PIDformer A.6."""
    n = x.shape[0]
    s = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                s += float(x[i] @ x[j] / (x[i].norm() * x[j].norm()))
    return s / (n * (n - 1))


def test_identical_tokens_give_one_and_orthogonal_give_zero() -> None:
    t = torch.randn(1, 7)
    assert pairwise_cosine(t.expand(5, 7)).item() == pytest.approx(1.0, abs=1e-12)
    assert pairwise_cosine(torch.eye(6)).item() == pytest.approx(0.0, abs=1e-12)
    # opposite pairs: +u, -u -> cos -1 for both ordered pairs
    assert pairwise_cosine(torch.stack([t[0], -t[0]])).item() == pytest.approx(-1.0, abs=1e-12)


def test_metric_matches_the_pairwise_formula() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 11, 5) + 0.7  # a shared offset: clearly non-zero similarity
    got = pairwise_cosine(x)
    assert got.shape == (3,)
    for b in range(3):
        assert got[b].item() == pytest.approx(brute_cosine(x[b].double()), abs=1e-10)


def test_zero_tokens_count_as_orthogonal() -> None:
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
    # pairs: (0,1),(1,0) -> 1; every pair with the zero token -> 0; 6 ordered pairs
    assert pairwise_cosine(x).item() == pytest.approx(2 / 6, abs=1e-12)


def _identity_blocks(m: VisionTransformer) -> None:
    """Make every block the identity: the residual branches' output projections are zero."""
    for blk in m.blocks:
        for lin in (blk.attn.proj, blk.mlp.fc2):
            lin.weight.zero_()
            lin.bias.zero_()


@torch.no_grad()
def test_model_with_identical_tokens_has_similarity_one_at_every_layer() -> None:
    torch.manual_seed(0)
    m = VisionTransformer(**SMALL).eval()
    b = torch.randn(24)
    m.patch_embed.proj.weight.zero_()
    m.patch_embed.proj.bias.copy_(b)
    m.pos_embed.zero_()
    m.cls_token.copy_(b.view(1, 1, -1))  # every token is b; attention and MLP keep them identical
    x = torch.rand(2, 3, 16, 16)
    _, cos = layer_cosines(Normalized(m, (0.5,) * 3, (0.5,) * 3), x)
    assert cos.shape == (4, 2)  # layers 0..3, two images
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-6)


@torch.no_grad()
def test_model_with_orthogonal_tokens_has_similarity_zero_at_every_layer() -> None:
    torch.manual_seed(0)
    m = VisionTransformer(**SMALL).eval()  # 16 patches + cls = 17 tokens in 24 dims
    m.patch_embed.proj.weight.zero_()
    m.patch_embed.proj.bias.zero_()
    m.cls_token.copy_(torch.eye(24)[0].view(1, 1, -1))
    m.pos_embed.copy_(torch.cat([torch.zeros(1, 24), torch.eye(24)[1:17]]).unsqueeze(0))
    _identity_blocks(m)
    _, cos = layer_cosines(m, torch.rand(3, 3, 16, 16))
    assert torch.allclose(cos, torch.zeros_like(cos), atol=1e-7)


@torch.no_grad()
def test_hooks_capture_block_outputs_of_pid_and_softmax_models() -> None:
    torch.manual_seed(1)
    pid = PidVisionTransformer(gains=PidGains(), **SMALL).eval()
    x = torch.rand(2, 3, 16, 16)
    logits, reps = token_representations(pid, x)
    assert torch.equal(logits, pid(x))  # hooks change nothing
    assert sorted(reps) == [0, 1, 2, 3]
    assert torch.allclose(pid.norm(reps[3])[:, 0] @ pid.head.weight.T + pid.head.bias, logits, atol=1e-5)
    assert torch.equal(reps[0], pid._pos_embed(pid.patch_embed(x)))
    assert not pid.blocks[0]._forward_hooks and not pid.blocks[0]._forward_pre_hooks  # removed afterwards


def test_select_images_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from robustbench_pid.benchmarks.rank_collapse import select_images

    def ctx(dataset: str, n: int, **spec) -> SimpleNamespace:
        s = SimpleNamespace(dataset=dataset, seed=0, limit=None, subset=None, benchmark_options={})
        s.__dict__.update(spec)
        return SimpleNamespace(spec=s, indices=list(range(n)))

    c = ctx("digits", 360)
    assert select_images(c) == "all of the evaluated set" and len(c.indices) == 360
    fake_imagenet = SimpleNamespace(family="imagenet")
    import robustbench_pid.data as data

    orig = data.dataset_info
    monkeypatch.setattr(data, "dataset_info", lambda name: fake_imagenet if name == "fake-in" else orig(name))
    a, b = ctx("fake-in", 50000), ctx("fake-in", 50000)
    select_images(a)
    select_images(b)
    assert len(a.indices) == 1000 and a.indices == b.indices == sorted(set(a.indices))  # seeded, no repeats
    c = ctx("fake-in", 50000, seed=1)
    select_images(c)
    assert c.indices != a.indices
    d = ctx("fake-in", 300, limit=300)
    select_images(d)
    assert len(d.indices) == 300  # the user chose the images
    e = ctx("fake-in", 5000, benchmark_options={"rank_collapse": {"n_images": 20}})
    assert select_images(e).startswith("random 20") and len(e.indices) == 20


@pytest.fixture(scope="module")
def rc_runs(tmp_path_factory: pytest.TempPathFactory):
    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import RunSpec

    root = tmp_path_factory.mktemp("rc")
    outs = {}
    for model in ("deit", "pid_deit"):
        # on the CPU, explicitly: the records are compared with a CPU brute force to 1e-6
        outs[model] = run(RunSpec(model=model, benchmark="rank-collapse", limit=24, batch_size=16, chunk_size=16,
                                  out=root / model, quiet=True, device="cpu"))
    return outs


def test_benchmark_records_and_tidy_rows(rc_runs, digits_test) -> None:
    from robustbench_pid import load_model
    from robustbench_pid.results.store import load_records, load_results

    out = rc_runs["deit"]
    recs = load_records(out)
    assert len(recs) == 24 * 5  # 24 images x layers 0..4
    assert set(recs["metric"]) == {"token_cosine"} and sorted(recs["layer"].unique()) == [0, 1, 2, 3, 4]
    assert recs.groupby("layer")["sample_id"].nunique().eq(24).all()
    tidy = load_results(out)
    assert list(tidy["layer"]) == [0, 1, 2, 3, 4] and set(tidy["metric"]) == {"token_cosine"}
    assert list(tidy["condition"]) == [f"layer={i:02d}" for i in range(5)]
    assert (tidy["n"] == 24).all() and (tidy["attack"] == "clean").all()
    # independent check of layer 4 for image 5: brute force on the hooked block output
    model = load_model("deit")
    x = digits_test.images[:24]
    _, reps = token_representations(model, x)
    ref4 = [brute_cosine(reps[4][i].double()) for i in range(24)]
    sid5 = digits_test.sample_ids[5]
    got = recs[(recs.layer == 4) & (recs.sample_id == sid5)]["value"].item()
    assert got == pytest.approx(ref4[5], abs=1e-6)
    assert tidy.loc[tidy.layer == 4, "value"].item() == pytest.approx(sum(ref4) / 24, abs=1e-6)
    row = tidy[tidy.layer == 4].iloc[0]
    v = recs[recs.layer == 4]["value"]
    half = 1.959963984540054 * v.std(ddof=1) / math.sqrt(24)
    assert row.ci_low == pytest.approx(row.value - half) and row.ci_high == pytest.approx(row.value + half)


def test_plot_several_models_on_one_figure(rc_runs, tmp_path: Path) -> None:
    from robustbench_pid.probes.rank_collapse import main
    from robustbench_pid.results.store import load_results

    df = pd.concat([load_results(p) for p in rc_runs.values()], ignore_index=True)
    path = draw_rank_collapse(df, tmp_path / "fig" / "rc.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    from matplotlib.image import imread

    assert imread(str(path)).shape[:2] == (504, 768)  # 6.4 x 4.2 in at 120 dpi
    assert main(["plot", *map(str, rc_runs.values()), "-o", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").read_bytes()[:4] == b"\x89PNG"
    from robustbench_pid.errors import UserError

    with pytest.raises(UserError, match="no token_cosine rows"):
        draw_rank_collapse(df[df.metric == "nothing"], tmp_path / "x.png")

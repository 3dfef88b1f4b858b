"""Rung 0 read from the user's row (design 9): the walk notes each sample's first top-1 break, rung 0 reads the
row's verdicts and passes only the breaks the row's final point no longer shows, and a unit whose row ran in
another process walks it again to the same records. On the tiny MLP of conftest.py (CPU)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
import robustbench_pid.benchmarks.adversarial as adversarial
import robustbench_pid.benchmarks.converge as converge_mod
import robustbench_pid.benchmarks.walk as walk
from robustbench_pid.attacks import make_attack
from robustbench_pid.benchmarks.ladder.rung0 import RowWalk, rung0_verdicts

EPS = 0.1
FAST = {"steps": 25, "sweep_steps": 6, "square_queries": 100, "square_budget": 200, "eot_iter": 4,
        "spsa_iterations": 5, "spsa_samples": 16}


def test_the_walk_notes_each_samples_first_top1_break_exactly_where_a_top1_walk_stops(plain, digits8):
    """PGD stopping at top-5 (the row) passes each sample's first top-1 break on its way: the point where the same
    walk stopping at top-1 (what rung 0 walked until design 8) ends, for every sample it broke."""
    x, y = digits8[0][:96], digits8[1][:96]
    row = make_attack("pgd", eps=EPS, steps=10)
    row.keep_first_break = True
    row(plain, x, y, generator=torch.Generator().manual_seed(3))
    top1 = make_attack("pgd", eps=EPS, steps=10, stop_topk=1)
    end = top1(plain, x, y, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stopped = plain(end).argmax(1) != y  # broken where the top-1 walk stopped (or at its last step)
    seen = row.stats["first_break_seen"]
    assert 10 < int(seen.sum()) < len(y)
    assert torch.equal(row.stats["first_break"][seen], end[seen])
    # a sample the top-1 walk's checks never saw broken was walked to the end by both: no first break noted
    # (it may still break at the last step, which the verdict pass sees)
    assert not bool((seen & ~stopped).any())
    assert (stopped & ~seen).sum() <= (top1.telemetry.iterations == 10).sum()
    # not asked: nothing kept
    plain_row = make_attack("pgd", eps=EPS, steps=10)
    plain_row(plain, x, y, generator=torch.Generator().manual_seed(3))
    assert "first_break" not in plain_row.stats


class _Points(torch.nn.Module):
    """Logits read off a point's first two pixels: class 0 while x[0] > x[1], else class 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x.flatten(1)
        return torch.stack([f[:, 0], f[:, 1]], 1)


def test_rung0_passes_only_first_breaks_the_final_point_no_longer_shows_and_takes_the_verdicts_word():
    """Four samples of label 0, hand-set: 0 broken at the final point (no pass), 1 carried back across the boundary
    after a first break the verdict confirms (broken, 1 pass), 2 a first break the fp32 verdict does not confirm
    (robust, 1 pass), 3 wrong at the clean point (not attacked by rung 0, no pass)."""
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.zeros(4, dtype=torch.long)
    final = torch.tensor([[0.2, 0.8], [0.9, 0.1], [0.9, 0.1], [0.0, 1.0]])
    first_pts = torch.tensor([[0.3, 0.7], [0.6, 0.4]])  # rows 1 and 2's first breaks (the attack saw both broken)
    walk = RowWalk(final_ok=torch.tensor([False, True, True, False]), x_broken=final[[0, 3]],
                   broken_rows=torch.tensor([0, 3]), first=first_pts, first_rows=torch.tensor([1, 2]),
                   trending=torch.tensor([False, False, True, False]))
    c1 = torch.tensor([True, True, True, False])
    calls = []

    def verdict(p: torch.Tensor) -> torch.Tensor:
        calls.append(len(p))
        return _Points()(p)

    robust, flag, fwd, worst = rung0_verdicts(walk, x, y, c1, verdict)
    assert robust.tolist() == [False, False, True, False]
    assert flag.tolist() == [False, False, True, False]
    assert fwd.tolist() == [0.0, 1.0, 1.0, 0.0] and calls == [2]
    assert torch.equal(worst[0], final[0]) and torch.equal(worst[1], first_pts[0])
    assert torch.equal(worst[2], x[2]) and torch.equal(worst[3], x[3])  # robust, and not attacked: the clean image


def test_a_unit_whose_row_ran_elsewhere_walks_it_again_to_the_same_records(plain, digits8, tmp_path, monkeypatch):
    """The row leaves its walk in the chunk's memo and rung 0 reads it (no walk of its own); a converge unit run
    after its rows' units were written (a resume, a shard) walks the rows again with the row's own function: the
    same records, the pass columns included."""
    x, y = digits8
    walks = []
    real = walk.standard_walk

    def counted(ctx, unit, attack, *a, **k):
        walks.append(unit.benchmark)
        return real(ctx, unit, attack, *a, **k)

    monkeypatch.setattr(adversarial, "standard_walk", counted)  # the row's walk and rung 0's, where each calls it
    monkeypatch.setattr(converge_mod, "standard_walk", counted)
    kw = dict(model=plain, data=(x[:40], y[:40]), attack="pgd", eps=EPS, steps=10, converge=True, converge_opt=FAST,
              mean=[0.0], std=[1.0], chunk_size=20, name="r")
    df = rbp.evaluate(out=tmp_path / "r", **kw)
    assert walks and set(walks) == {"adversarial"}  # one process: rung 0 read every row
    rec = rbp.load_records(df.attrs["run_dir"])
    conv = rec[rec["benchmark"] == "converge"].reset_index(drop=True)
    units = [p for p in (tmp_path / "r" / "units").glob("*.parquet")
             if pd.read_parquet(p, columns=["benchmark"])["benchmark"].iloc[0] == "converge"]
    assert len(units) == 2
    for p in units:
        p.with_suffix(".json").unlink()
        p.unlink()
    (tmp_path / "r" / "summary.csv").unlink()
    walks.clear()
    df2 = rbp.evaluate(out=tmp_path / "r", **kw)
    assert walks == ["converge", "converge"]  # each unit's one batch, walked again
    again = rbp.load_records(df2.attrs["run_dir"])
    again = again[again["benchmark"] == "converge"].reset_index(drop=True)
    cols = [c for c in conv.columns if c != "unit"]
    pd.testing.assert_frame_equal(conv[cols], again[cols])
    assert (conv["bwd@user"] == 0).all()


@pytest.mark.parametrize("attack", ["fgsm", "spsa"])
def test_rung0_of_an_attack_that_does_not_stop_at_top5_is_its_rows_verdict(plain, digits8, tmp_path, attack):
    """FGSM (one step, no early stop) and SPSA (stops at top-1): rung 0 is the row's top-1 verdict, sample by
    sample, at no pass of its own."""
    x, y = digits8
    params = {"iterations": 4, "n_samples": 8} if attack == "spsa" else {}
    df = rbp.evaluate(model=plain, data=(x[:32], y[:32]), attack=attack, eps=EPS, params=params, converge=True,
                      converge_opt=FAST, mean=[0.0], std=[1.0], out=tmp_path / attack, name=attack)
    rec = rbp.load_records(df.attrs["run_dir"])
    row = rec[rec["attack"] == attack].set_index("sample_id")["correct_top1"]
    lad = rec[rec["benchmark"] == "converge"].set_index("sample_id")
    assert (lad["rung0_correct_top1"] == row.loc[lad.index]).all()
    assert (~lad["rung0_correct_top1"].astype(bool)).sum() > 0
    assert (lad["fwd@user"] == 0).all() and (lad["bwd@user"] == 0).all()

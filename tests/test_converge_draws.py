"""The grid on several draws (issue 63 item 6): scripts/converge_draws.py renders, per grid cell and draw, the
converged value, its status and the criteria the draw misses, from the bench rows; the committed block is the
rendering of the committed runs, and a hand edit makes --check fail."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from script_loader import ROOT, load_script  # noqa: E402


_script = load_script


def _row(model: str, eps: str, converged: float, status: str = "converged", autoattack: float = 50.0,
         fwd: float = 10.0) -> pd.DataFrame:
    return pd.DataFrame([{"model": model, "eps": eps, "n": 360, "converged": converged, "status": status,
                          "autoattack": autoattack, "reference": autoattack, "ladder_fwd": fwd, "ladder_bwd": 10.0,
                          "aa_fwd": 100.0, "aa_bwd": 100.0}])


def test_each_draw_of_each_cell_says_which_criteria_it_misses_and_by_how_much(tmp_path: Path) -> None:
    draws = _script("converge_draws")
    cell = draws.cell_dir(tmp_path, "cnn_at", "48/255")
    cell.mkdir(parents=True)
    _row("cnn_at", "48/255", 50.0).to_csv(cell / draws.bench_name(0), index=False)
    # draw 1: one sample (0.28 pt of 360) above AutoAttack, and not converged
    _row("cnn_at", "48/255", 50.0 + 100 / 360, "not converged").to_csv(cell / draws.bench_name(1), index=False)
    other = draws.cell_dir(tmp_path, "deit", "4/255")
    other.mkdir(parents=True)
    _row("deit", "4/255", 13.06, autoattack=13.06, fwd=30.0).to_csv(other / draws.bench_name(0), index=False)
    text = draws.render(tmp_path)
    assert "draw 0: 2 of 18, draw 1: 1 of 18" in text
    assert "| cnn_at | 48/255 | 50.00 converged: every criterion | 50.28 not converged: misses <= AA (+0.28 pt), " \
           "converged (not converged) |" in text
    # 30 forward passes per sample against AutoAttack's 100: 0.30 of AA, above the fifth allowed
    assert "| deit | 4/255 | 13.06 converged: misses fwd <= AA/5 (0.30 of AA) | not run |" in text
    assert "| deit | 1/255 | not run | not run |" in text
    assert text.endswith("Misses: deit 4/255 on draw 0: fwd <= AA/5 (0.30 of AA); cnn_at 48/255 on draw 1: <= AA "
                         "(+0.28 pt), converged (not converged).")
    assert draws.run_name(0) == "converge" and draws.run_name(2) == "converge-draw2"


def test_the_committed_draws_block_is_the_rendering_of_the_committed_runs(tmp_path: Path, monkeypatch) -> None:
    draws = _script("converge_draws")
    assert draws.check(draws.cell_dir(ROOT / "docs" / "runs" / "converge", "x", "1/255").parent)
    text = draws.DOC.read_text()
    edited = tmp_path / "attacks.md"
    edited.write_text(text.replace(": every criterion", ": every criterion!", 1))
    monkeypatch.setattr(draws, "DOC", edited)
    assert not draws.check(ROOT / "docs" / "runs" / "converge")


def test_a_miss_is_explained_by_the_samples_and_the_passes_of_each_part_of_the_ladder() -> None:
    draws = _script("converge_draws")
    r = _row("cnn_at", "64/255", 1.0 + 100 / 360, autoattack=1.0, fwd=40.0).iloc[0]
    ev = {"missed": [{"sample_id": "7", "share": 0.0003, "free": 0.25, "full": True, "restarted": True}], "beat": 0}
    # per sample over n: round 1 9 fwd / 3 bwd, later rounds 31 / 7 of which the fresh starts 20 / 4: 40 / 10 in all
    cost = {"first_fwd": 9.0, "first_bwd": 3.0, "later_fwd": 31.0, "later_bwd": 7.0, "fresh_fwd": 20.0,
            "fresh_bwd": 4.0, "fresh_samples": 2}
    assert draws.explain("cnn_at", "64/255", 2, r, ev, cost) == (
        "cnn_at 64/255 on draw 2: sample 7 robust under the ladder, broken by AutoAttack: the gradient families left "
        "0.03% of its clean margin, Square 25.00%; it had the gradient families' full budget and the edge's fresh "
        "starts; 0 sample(s) broken by the ladder and left robust by AutoAttack; forward / backward passes as shares of "
        "AutoAttack's: rung 0, the probes and round 1 0.09 / 0.03, the near rounds' full budgets 0.11 / 0.03, the "
        "edge's fresh starts on 2 sample(s) 0.20 / 0.04.")
    # a cost miss alone: no sample line, and no fresh start named where none ran
    cost0 = {**cost, "later_fwd": 11.0, "fresh_fwd": 0.0, "fresh_bwd": 0.0, "fresh_samples": 0}
    assert draws.explain("deit", "4/255", 1, _row("deit", "4/255", 50.0, fwd=20.0).iloc[0],
                         {"missed": [], "beat": 0}, cost0) == (
        "deit 4/255 on draw 1: forward / backward passes as shares of AutoAttack's: rung 0, the probes and round 1 "
        "0.09 / 0.03, the near rounds' full budgets 0.11 / 0.07.")
    assert draws.explain("deit", "4/255", 1, r, {}, {}) == ""  # no records: nothing said
    # a sample no family brought within its unit's tau: no budget owed, and the tau says why
    far = {"missed": [{"sample_id": "304", "share": 0.08, "free": 0.9, "full": False, "restarted": False,
                       "tau": 0.0625}], "beat": 0}
    assert "Square 90.00%; it had no full budget (tau was 1/16 in its work unit); 0 sample(s)" in draws.explain(
        "deit", "4/255", 0, r, far, cost0)


def test_the_parts_of_a_committed_draw_add_up_to_its_bench_row() -> None:
    """A fresh round is told by its rungs' scope (design 15) or its APGD-CE rung (before: APGD-CE runs after round 1
    only as a fresh start); round 1,
    the near rounds and the fresh starts add up to the ladder's passes in the cell's bench row."""
    draws = _script("converge_draws")
    out = ROOT / "docs" / "runs" / "converge"
    for model, eps, draw in (("cnn_at", "64/255", 2), ("cnn_at", "48/255", 0)):
        row = pd.read_csv(draws.cell_dir(out, model, eps) / draws.bench_name(draw)).iloc[0]
        ev, cost = draws.evidence(out, model, eps, draw)
        assert abs(cost["first_fwd"] + cost["later_fwd"] - row.ladder_fwd) < 1e-6
        assert abs(cost["first_bwd"] + cost["later_bwd"] - row.ladder_bwd) < 1e-6
        assert 0 < cost["fresh_fwd"] < cost["later_fwd"] and cost["fresh_samples"] >= 1
        robust = round(row.converged * row.n / 100) - round(row.autoattack * row.n / 100)
        assert len(ev["missed"]) - ev["beat"] == robust  # the samples each side broke alone explain the gap

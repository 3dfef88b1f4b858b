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

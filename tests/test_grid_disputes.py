"""The grid's disputed samples (issue 63 item 6: which cell fails on which draw, and why): each sample a grid draw
called robust and AutoAttack broke is drawn again by each AutoAttack attack; the block states the crossing counts,
AutoAttack's whole-run share with its interval and the chance the ladder's starts all missed while AutoAttack's
crossed, from the committed files."""
from __future__ import annotations

import pandas as pd
import torch

from script_loader import load_script  # noqa: E402


def _row(**over) -> pd.Series:
    r = {"model": "cnn_at", "eps": "64/255", "draw": 2, "sample_id": "786", "left_gradient": 0.0003,
         "left_free": 0.2412, "s_apgd-ce": 2, "s_apgd-t": 2, "s_fab-t": 2, "s_square": 2, "crossed_apgd-ce": 0,
         "crossed_apgd-t": 5, "crossed_fab-t": 0, "crossed_square": 6, "crossed_any": 10, "starts": 20,
         "ladder_apgd-ce": 0, "ladder_apgd-t": 2, "ladder_fab-t": 0, "ladder_square": 6,
         "seeds": "1-20", "seconds": 1.0}
    r.update(over)
    return pd.Series(r)


def test_the_chance_multiplies_autoattacks_share_by_each_familys_misses() -> None:
    g = load_script("grid_disputes")
    # 10 of 20 seeds crossed; APGD-T 5 of 20, Square 6 of 20, two ladder starts each: 0.5 * 0.75^2 * 0.7^2
    assert abs(g.chance(_row()) - 0.5 * 0.75 ** 2 * 0.7 ** 2) < 1e-12
    assert g.chance(_row(crossed_any=0)) == 0.0  # AutoAttack never crosses: the ladder cannot be behind
    assert g.chance(_row(**{"crossed_apgd-t": 20})) == 0.0  # a family that always crosses, run twice, never misses
    assert g.chance(_row(**{"s_apgd-t": 0, "s_square": 0})) == 0.5  # no ladder start: AutoAttack's share itself
    # the ladder's own APGD-T crosses 2 of 20: 0.5 * 0.9^2 * 0.7^2
    assert abs(g.chance(_row(), own=True) - 0.5 * 0.9 ** 2 * 0.7 ** 2) < 1e-12


def test_the_block_row_states_counts_interval_starts_and_chance() -> None:
    g = load_script("grid_disputes")
    meta = {"starts": 20, "machine": "m"}
    text = g.block(pd.DataFrame([_row()]), meta, 14, 50)
    # 10 of 20: Wilson 95% (0.30, 0.70) by hand; 0.5 * 0.5625 * 0.49 = 0.138; 0.5 * 0.81 * 0.49 = 0.198
    assert ("| cnn_at 64/255 | 2 | 786 | 0.0003 / 0.2412 | 0 / 5 / 0 / 6 of 20 | 0 / 2 / 0 / 6 of 20 | "
            "10 of 20: 0.50 (0.30-0.70) | 2 / 2 / 2 / 2 | 0.14 / 0.20 |") in text
    assert text.startswith("Each sample a grid draw of design 14 called robust")
    assert "no draws to run" in g.block(pd.DataFrame([_row()]).iloc[:0], meta, 14, 50)
    # 50 edge samples, chances 0.138 and 0.198: 6.9 to 9.9 expected against the 1 found
    assert "gave the edge's fresh starts to 50 sample(s); had each a chance between 0.14 and 0.20, 6.9 to 9.9" in text
    assert text.count("the draws show 1.") == 1 and "had no fresh start" not in text
    # a sample no family left within the edge is not counted among the draws, and the block says what it means
    far = _row(sample_id="304", restarted=False, **{"s_apgd-ce": 1, "s_apgd-t": 0, "s_fab-t": 0, "s_square": 0})
    text = g.block(pd.DataFrame([_row(restarted=True), far]), meta, 15, 49)
    assert "the draws show 1." in text and "1 of these had no fresh start" in text
    assert "gave the edge's" not in g.block(pd.DataFrame([far]), meta, 15, 49)


def test_crossings_are_per_seed_and_follow_the_boundary() -> None:
    """A 10-class linear model whose boundary is x0 = 0.1, on one sample at x0 = 0.25: APGD-CE within eps 0.1 never
    crosses, within 0.2 always does (pyautoattack, standard settings, CPU)."""
    d = load_script("dispute_draws")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 10)).eval()
    with torch.no_grad():
        net[1].weight.zero_()
        net[1].bias.fill_(-10.0)
        net[1].weight[0, 0], net[1].weight[1, 0] = 1.0, -1.0  # z0 - z1 = 2 (x0 - 0.1): class 0 while x0 > 0.1
        net[1].bias[0], net[1].bias[1] = -0.1, 0.1
    x, y = torch.full((1, 1, 2, 2), 0.25), torch.tensor([0])
    assert d.crossings(net, x, y, 0.1, "apgd-ce", 3) == [False, False, False]
    assert d.crossings(net, x, y, 0.2, "apgd-ce", 3) == [True, True, True]


def test_the_committed_block_is_the_rendering_of_the_committed_draws(tmp_path, monkeypatch) -> None:
    g = load_script("grid_disputes")
    assert (g.OUT / g.CSV).is_file(), "run scripts/grid_disputes.py --starts 20 and commit its files"
    assert g.check()
    edited = tmp_path / "attacks.md"
    edited.write_text(g.DOC.read_text().replace(" of 20 |", " of 21 |", 1))
    assert not g.check(doc=edited)


def test_a_new_run_keeps_the_samples_already_drawn_with_as_many_starts(tmp_path) -> None:
    """Resuming: a sample the file already holds with the same number of starts keeps its measured crossings (by
    model, eps and sample id: alone, its seeds do not depend on the grid draw that disputed it); one drawn with
    another number of starts is drawn again."""
    g = load_script("grid_disputes")
    pd.DataFrame([_row(), _row(sample_id="1435", eps="48/255", starts=10, seeds="1-10")]).to_csv(tmp_path / g.CSV,
                                                                                                 index=False)
    done = g._done(tmp_path, 20)
    assert list(done) == [("cnn_at", "64/255", "786")]
    kept = done[("cnn_at", "64/255", "786")]
    assert kept["crossed_apgd-t"] == 5 and kept["ladder_square"] == 6 and kept["seeds"] == "1-20"
    assert "s_apgd-t" not in kept and "left_gradient" not in kept  # the ladder's side is read from the runs again
    assert g._done(tmp_path / "none", 20) == {}


def test_a_run_that_only_keeps_rows_keeps_the_machine_stamp_they_were_measured_on(tmp_path) -> None:
    """The seconds in the file were measured on the machine its stamp names: a run that draws nothing new (here no
    sample is disputed) leaves the stamp alone, and a first run or one with another number of starts writes it."""
    import json

    g = load_script("grid_disputes")
    stamp = {"starts": 20, "torch": "x", "threads": 1, "machine": "earlier machine", "date": "2026-01-01 00:00 UTC"}
    (tmp_path / g.META).write_text(json.dumps(stamp))
    assert g.attack(tmp_path, 20).empty
    assert json.loads((tmp_path / g.META).read_text()) == stamp
    assert list(pd.read_csv(tmp_path / g.CSV).columns)[:4] == list(g.KEY)  # the header: no dispute is a result
    g.attack(tmp_path, 10)
    new = json.loads((tmp_path / g.META).read_text())
    assert new["starts"] == 10 and new["machine"] != "earlier machine" and new["threads"] == torch.get_num_threads()

"""The claims-digits study: one column per zoo model, every pair of the six claims, clean and FGSM /
PGD-20 at 1..6/255 in the papers' protocol; its pair table (difference on the same images, McNemar's
exact p-value, paired interval) agrees with the per-sample records."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from robustbench_pid.cli import main
from robustbench_pid.errors import UserError
from robustbench_pid.models.zoo import zoo
from robustbench_pid.results.stats.stats import paired_difference_interval
from robustbench_pid.studies.pairs import read_pairs
from robustbench_pid.studies.spec import attack_settings, load_study, parse_study

ROOT = Path(__file__).resolve().parents[1]


def test_claims_digits_has_every_model_every_pair_and_the_papers_grid() -> None:
    s = load_study("claims-digits")
    assert s.protocol == "paper"
    # every zoo model with an ImageNet architecture (the claims-imagenet study is the same columns); cnn_at is digits
    # only, trained for the converge grid, and no claim of the seed papers compares it
    claimable = [n for n in zoo.names() if "imagenet" in zoo.get(n).archs]
    assert sorted(c.model for c in s.columns) == sorted(claimable) and "cnn_at" not in claimable
    assert sorted(set(zoo.names()) - set(claimable)) == ["cnn_at"]
    grid = [*range(1, 7), 8, 16]  # the papers' 1..6/255, and the adversarially trained pair's 8/255 and twice it
    assert [r.name for r in s.rows] == ["clean"] + [f"fgsm-{e}" for e in grid] + [f"pgd-{e}" for e in grid]
    for e in grid:
        pgd = attack_settings(s.row(f"pgd-{e}"))
        assert pgd == {"eps": pytest.approx(e / 255), "steps": 20, "step_size_factor": 0.15, "random_start": True}
        assert attack_settings(s.row(f"fgsm-{e}")) == {"eps": pytest.approx(e / 255)}
    model = {c.name: c.model for c in s.columns}
    pairs = {(model[p.baseline], model[p.method]) for p in s.pairs}
    assert pairs == {("deit", "pid_deit"), ("fan", "pid_fan"), ("featscale_deit", "pid_featscale_deit"),
                     ("symvit", "rpc_symvit"), ("symvit", "rpc_symvit_all"), ("symfan", "rpc_fan"),
                     ("deit", "rpc_deit"), ("deit", "rpc_symasym_deit"), ("deit_at", "pid_deit_at")}


def test_the_imagenet_audit_is_the_same_study_on_imagenet() -> None:
    d, i = load_study("claims-digits"), load_study("claims-imagenet")
    assert d.columns == i.columns and d.pairs == i.pairs
    assert [(r.name, r.attack, r.metrics) for r in d.rows] == [(r.name, r.attack, r.metrics) for r in i.rows]
    assert {r.dataset for r in i.rows} == {"imagenet"}


@pytest.mark.parametrize("text, needle", [
    ('[[pair]]\nclaim = "x"\nsource = "y"\nbaseline = "DeiT"\nmethod = "Nope"\n', "key 'method': no column 'Nope'"),
    ('[[pair]]\nclaim = "x"\nsource = "y"\nbaseline = "DeiT"\nmethod = "DeiT"\n', "the same column"),
    ('[[pair]]\nclaim = "x"\nsource = "y"\nbaseline = "DeiT"\nmethod = "PID DeiT"\nwhy = 1\n', "unknown key(s) 'why'"),
])
def test_bad_pairs_are_refused_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    src = (ROOT / "robustbench_pid" / "studies" / "claims-digits.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(src[:src.index("\n[[pair]]")] + "\n" + text)
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_study(bad)


def test_paired_interval_covers_and_agrees_with_mcnemar_in_sign() -> None:
    assert paired_difference_interval(0, 0, 50)[0] < 0 < paired_difference_interval(0, 0, 50)[1]
    lo, hi = paired_difference_interval(2, 20, 100)
    assert 0 < lo < 18 < hi < 30
    rng = np.random.default_rng(0)
    n, pa, pb, hits = 60, 0.10, 0.25, 0  # discordance probabilities: true difference +15 points
    for _ in range(2000):
        k = rng.multinomial(n, [pa, pb, 1 - pa - pb])
        lo, hi = paired_difference_interval(int(k[0]), int(k[1]), n)
        hits += lo <= 100 * (pb - pa) <= hi
    assert 0.93 <= hits / 2000 <= 0.975  # near the nominal 95%
    with pytest.raises(ValueError):
        paired_difference_interval(30, 40, 50)


def test_pair_table_on_a_small_limit_matches_the_records(tmp_path: Path, capsys) -> None:
    out = tmp_path / "claims"
    for model in ("deit", "pid_deit"):
        assert main(["reproduce", "claims-digits", "--model", model, "--only", "clean", "--only", "fgsm-4",
                     "--limit", "40", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "PID DeiT is more robust than softmax DeiT" in printed and (out / "pairs.csv").is_file()
    pairs = pd.read_csv(out / "pairs.csv")
    assert pairs.equals(pd.read_csv(out / "pairs.csv"))
    assert set(pairs["claim"]) == {"PID DeiT is more robust than softmax DeiT"}  # the only pair with both columns
    assert list(pairs["row"]) == ["clean", "fgsm-4"]
    recs = {m: pd.read_parquet(next(out.glob(f"{m}@*")) / "paper" / "fgsm-4" / "records.parquet")
            for m in ("deit", "pid_deit")}
    a, b = ([r[r["attack"] == "fgsm"].set_index("sample_id")["correct_top1"].astype(bool) for r in recs.values()])
    line = pairs[pairs["row"] == "fgsm-4"].iloc[0]
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    assert line["n"] == 40 and line["only_baseline"] == only_a and line["only_method"] == only_b
    assert line["diff"] == pytest.approx(100 * (b.mean() - a.mean()), abs=1e-6)
    expected_p = 1.0 if only_a + only_b == 0 else binomtest(min(only_a, only_b), only_a + only_b, 0.5).pvalue
    assert line["pvalue"] == pytest.approx(expected_p, abs=1e-6)
    assert line["ci_low"] <= line["diff"] <= line["ci_high"]
    assert read_pairs(out)[["row", "diff", "pvalue"]].round(6).equals(pairs[["row", "diff", "pvalue"]].round(6))
    md = (out / "pairs.md").read_text()
    assert f"{line['diff']:+.2f} [{line['ci_low']:+.2f}, {line['ci_high']:+.2f}]" in md
    assert "PID-FAN is more robust than FAN: column(s) 'FAN', 'PID-FAN' not run\n" in md


def test_reproduce_all_columns_refuses_mixed_or_missing_choices(capsys) -> None:
    assert main(["reproduce", "claims-digits"]) == 2
    assert "needs --model MODEL (one column) or --all-columns" in capsys.readouterr().err
    assert main(["reproduce", "claims-digits", "--all-columns", "--model", "deit"]) == 2
    assert "drop --model/--as" in capsys.readouterr().err
    assert main(["reproduce", "claims-digits", "--all-columns", "--checkpoint", "vit=x.pth"]) == 2
    assert "'vit' is no column or column's model" in capsys.readouterr().err
    assert main(["reproduce", "claims-imagenet", "--all-columns", "--data-root", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert "needs weights" in err and "--checkpoint" in err


def test_a_further_evaluation_folder_is_its_own_group_of_pair_lines(tmp_path: Path) -> None:
    """The hook for further evaluations: run folders under <entry>/<variant>/<row>/ (here a copy of the paper ones)
    enter the pair table as their own group, after the study's protocol, without any change to the table code.
    (Not under "converged": that folder's runs must be --converge runs, or the table would mislabel them.)"""
    import shutil

    from robustbench_pid.studies.reproduce import plan_study

    out = tmp_path / "claims"
    for model in ("deit", "pid_deit"):
        assert main(["reproduce", "claims-digits", "--model", model, "--only", "clean", "--limit", "8", "--quiet",
                     "--out", str(out)]) == 0
        plan = plan_study("claims-digits", model, out=str(out))
        plan.variant = "again"
        assert plan.row_dir(plan.study.row("clean")) == plan.entry / "again" / "clean"
        shutil.copytree(plan.entry / "paper", plan.entry / "again")
    pairs = read_pairs(out)
    assert list(pairs["protocol"]) == ["paper", "again"] and list(pairs["row"]) == ["clean", "clean"]
    shutil.copytree(plan.entry / "paper", plan.entry / "converged")  # paper-protocol runs filed as converged ones
    with pytest.raises(UserError, match="converged/clean: the run is in the converged/ folder but ran no --converge"):
        read_pairs(out)
    assert pairs["diff"].iloc[0] == pairs["diff"].iloc[1]


def test_a_converged_folder_pairs_the_ladders_verdicts_not_rung_0(tmp_path):
    """In <entry>/converged/<row>/ the row's own attack is only rung 0; the pair must use the ladder's worst
    case (attack ``converge``) at the row's eps, or a converged claim would repeat the standard PGD number."""
    import json

    import pandas as pd

    from robustbench_pid.studies.pairs import row_verdicts

    row = load_study("claims-digits").row("pgd-4")
    eps = 4 / 255
    rec = pd.DataFrame({"sample_id": [0, 1, 2, 0, 1, 2, 0, 1, 2],
                        "attack": ["clean"] * 3 + ["pgd"] * 3 + ["converge"] * 3,
                        "eps": [0.0] * 3 + [eps] * 6,
                        "correct_top1": [True, True, True, True, True, False, True, False, False]})
    rec.to_parquet(tmp_path / "records.parquet")
    (tmp_path / "run.json").write_text(json.dumps({"status": "complete"}))
    assert row_verdicts(tmp_path, row).tolist() == [True, True, False]  # the paper/standard folder: PGD-20
    assert row_verdicts(tmp_path, row, converged=True).tolist() == [True, False, False]  # the ladder


def test_runs_sharing_no_samples_give_a_note_not_a_crash_and_a_missing_verdict_is_not_robust(tmp_path):
    import json

    import pandas as pd

    from robustbench_pid.studies.pairs import pair_cells, row_verdicts

    study = load_study("claims-digits")
    eps = 4 / 255
    entries = []
    for col, model, ids in (("DeiT", "deit", ["0", "1"]), ("PID DeiT", "pid_deit", ["2", "3"])):
        run = tmp_path / model / "paper" / "pgd-4"
        run.mkdir(parents=True)
        pd.DataFrame({"sample_id": ids, "attack": "pgd", "eps": eps, "correct_top1": [True, None]}).to_parquet(
            run / "records.parquet")
        (run / "run.json").write_text(json.dumps({"status": "complete"}))
        entries.append({"column": col, "model": model, "dir": tmp_path / model})
    assert row_verdicts(tmp_path / "deit" / "paper" / "pgd-4", study.row("pgd-4")).tolist() == [True, False]
    cells, notes = pair_cells(tmp_path, study, entries)
    assert not [c for c in cells if c.row == "pgd-4"]
    assert any("row 'pgd-4'" in n and "share no samples" in n for n in notes)

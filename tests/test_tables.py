"""Tables: the paper layout on a synthetic results set (exact text), eps choice, paired tests, layouts."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pandas as pd
import pytest

from robustbench_pid.errors import UserError
from robustbench_pid.results.store import summarize
from robustbench_pid.results.tables.comparisons import compare_models
from robustbench_pid.results.tables.render import render
from robustbench_pid.results.tables.layouts import choose_eps, paper_tables, table, tables

N = 20


def _first(k: int) -> np.ndarray:
    v = np.zeros(N, bool)
    v[:k] = True
    return v


def synthetic_records() -> pd.DataFrame:
    """Two models ('softmax', 'pid') on the same 20 samples; counts chosen for hand-checkable tests."""
    rows = []

    def add(model, attack, eps, top1, top5):
        for i in range(N):
            rows.append(dict(run_id=f"run_{model}", model=model,
                             checkpoint_sha256=("ab" if model == "softmax" else "cd") * 32,
                             dataset="imagenet", split="val", protocol="standard", benchmark="adversarial",
                             attack=attack, eps=float(eps), params="{}", condition="", sample_id=f"s{i:02d}",
                             correct_top1=bool(top1[i]), correct_top5=bool(top5[i])))

    ones = np.ones(N, bool)
    add("softmax", "clean", 0, _first(18), ones)        # pid = softmax + one sample: p = 1
    add("pid", "clean", 0, _first(19), ones)
    add("softmax", "fgsm", 3 / 255, _first(10), _first(18))  # 6 discordant, all for pid: p = 2/64
    add("pid", "fgsm", 3 / 255, _first(16), _first(18))
    add("softmax", "fgsm", 1 / 255, _first(15), ones)
    add("pid", "fgsm", 1 / 255, _first(17), ones)
    pid_pgd = np.zeros(N, bool)
    pid_pgd[1:9] = True                                   # vs softmax 0..4: 1 vs 4 discordant: p = 12/32
    add("softmax", "pgd", 4 / 255, _first(5), _first(12))
    add("pid", "pgd", 4 / 255, pid_pgd, _first(14))       # top-5: 0 vs 2 discordant: p = 2/4
    add("softmax", "pgd", 2 / 255, _first(9), ones)
    add("pid", "pgd", 2 / 255, _first(12), ones)
    return pd.DataFrame(rows)


def synthetic_ood_rows() -> pd.DataFrame:
    """Tidy ImageNet-A/R/C/O rows (the PIDformer Table 1 values), without per-sample records."""
    rows = []
    for model, a, r, mce, aupr in (("softmax", 6.90, 32.83, 71.20, 17.47), ("pid", 8.82, 34.89, 68.41, 19.22)):
        base = dict(checkpoint_sha256=None, protocol="standard", eps=0.0, model=model)
        rows += [
            dict(base, run_id=f"{model}_a", dataset="imagenet-a", benchmark="restricted", attack="clean",
                 metric="top1", value=a, n=7500, ci_low=a - 0.5, ci_high=a + 0.6),
            dict(base, run_id=f"{model}_r", dataset="imagenet-r", benchmark="restricted", attack="clean",
                 metric="top1", value=r, n=30000, ci_low=r - 0.5, ci_high=r + 0.5),
            dict(base, run_id=f"{model}_c", dataset="imagenet-c", benchmark="imagenet_c", attack="corruptions",
                 metric="mce", value=mce, n=50000, ci_low=np.nan, ci_high=np.nan),
            dict(base, run_id=f"{model}_o", dataset="imagenet-o", benchmark="ood", attack="ood",
                 metric="aupr", value=aupr, n=12000, ci_low=np.nan, ci_high=np.nan),
        ]
    return pd.DataFrame(rows)


EXPECTED_PAPER = """\
### imagenet · standard protocol

| Attack | Metric | softmax | pid | Δ pid−softmax | p pid vs softmax |
|---|---|---|---|---|---|
| Clean | Top-1 Acc (%) [95% Wilson] | 90.00 [69.9, 97.2] | 95.00 [76.4, 99.1] | +5.00 | 1.000 |
|  | Top-5 Acc (%) [95% Wilson] | 100.00 [83.9, 100.0] | 100.00 [83.9, 100.0] | +0.00 | 1.000 |
| FGSM (3/255) | Top-1 Acc (%) [95% Wilson] | 50.00 [29.9, 70.1] | 80.00 [58.4, 91.9] | +30.00 | 0.031 * |
|  | Top-5 Acc (%) [95% Wilson] | 90.00 [69.9, 97.2] | 90.00 [69.9, 97.2] | +0.00 | 1.000 |
| PGD-20 (4/255) | Top-1 Acc (%) [95% Wilson] | 25.00 [11.2, 46.9] | 40.00 [21.9, 61.3] | +15.00 | 0.375 |
|  | Top-5 Acc (%) [95% Wilson] | 60.00 [38.7, 78.1] | 70.00 [48.1, 85.5] | +10.00 | 0.500 |
| ImageNet-A | Top-1 Acc (%) [95% Wilson] | 6.90 [6.4, 7.5] | 8.82 [8.3, 9.4] | +1.92 | n/a |
| ImageNet-R | Top-1 Acc (%) [95% Wilson] | 32.83 [32.3, 33.3] | 34.89 [34.4, 35.4] | +2.06 | n/a |
| ImageNet-C | mCE (↓) | 71.20 | 68.41 | -2.79 | n/a |
| ImageNet-O | AUPR | 17.47 | 19.22 | +1.75 | n/a |

Notes:
- cells: value [95% interval] (accuracies: Wilson; mCE, AUPR: bootstrap over samples); n=… in a cell where the models of a row ran on different numbers of samples
- attack rows: accuracy under the attacks shown, an upper bound on the model's robust accuracy (a stronger attack may break more samples; `evaluate --converge` escalates until none does)
- n: 20 samples per row, except ImageNet-A (7500), ImageNet-R (30000), ImageNet-C (50000), ImageNet-O (12000)
- Δ: the later-named model minus the earlier, in points (BASELINE:MODEL pairs); p: two-sided paired test on the same samples (McNemar exact, n=20); * p < 0.05
- p n/a for ImageNet-A, ImageNet-R, ImageNet-C, ImageNet-O: no per-sample records in the inputs
- eps per attack row: FGSM: eps 3/255 (the paper's eps; present: 1/255, 3/255); PGD: eps 4/255 (closest to the paper's 3/255, larger on ties; present: 2/255, 4/255)
- settings: FGSM = FGSM; PGD = PGD-20 (step 2.5·eps/20, random start, early stop top-5)
"""


@pytest.fixture(scope="module")
def synth():
    rec = synthetic_records()
    tidy = pd.concat([summarize(rec), synthetic_ood_rows()], ignore_index=True)
    return tidy, rec


def test_paper_layout_matches_expected_text_exactly(synth):
    tidy, rec = synth
    got = render(paper_tables(tidy, records=rec, models=["softmax", "pid"]), "markdown")
    assert got == EXPECTED_PAPER


def test_paper_layout_eps_override_and_errors(synth):
    tidy, rec = synth
    t = paper_tables(tidy, records=rec, models=["softmax", "pid"], eps="pgd=2/255,fgsm=1/255")[0]
    f = t.frame.set_index(["Attack", "Metric"])
    assert f.loc[("FGSM (1/255)", "Top-1 Acc (%) [95% Wilson]"), "softmax"] == "75.00 [53.1, 88.8]"
    # pgd 2/255: softmax 0..8, pid 0..11 -> 3 discordant, all for pid: p = 2/8
    assert f.loc[("PGD-20 (2/255)", "Top-1 Acc (%) [95% Wilson]"), "p pid vs softmax"] == "0.250"
    with pytest.raises(UserError, match="not in the results"):
        paper_tables(tidy, records=rec, eps="pgd=5/255")
    with pytest.raises(UserError, match="not in the results"):
        paper_tables(tidy, records=rec, models=["nope"])


def test_without_records_no_p_values_and_a_note(synth):
    tidy, _ = synth
    t = table(tidy, layout="paper", models=["softmax", "pid"])
    assert set(t.frame["p pid vs softmax"]) == {"n/a"}
    assert t.frame["Δ pid−softmax"].iloc[2] == "+30.00"
    assert any("no per-sample records" in n for n in t.notes)


@pytest.mark.parametrize("present,chosen,expect", [
    ({"a": [0.1]}, {}, 0.1),                                  # the only one
    ({"a": [2 / 255, 3 / 255, 4 / 255]}, {}, 3 / 255),        # the paper's
    ({"a": [2 / 255, 4 / 255]}, {}, 4 / 255),                 # tie: the larger
    ({"a": [1 / 255, 4 / 255]}, {}, 4 / 255),                 # closest
    ({"a": [2 / 255, 4 / 255]}, {"*": 2 / 255}, 2 / 255),     # asked for
    ({"a": [2 / 255, 4 / 255], "b": [2 / 255]}, {}, 2 / 255),  # only eps every model has
])
def test_choose_eps(present, chosen, expect):
    e, _ = choose_eps("pgd", present, chosen, paper_eps=3 / 255, norm="linf")
    assert e == pytest.approx(expect)


def test_compare_models_counts_every_shared_condition(synth):
    _, rec = synth
    c = compare_models(rec, models=["softmax", "pid"])
    assert len(c) == 10  # clean, fgsm x2, pgd x2 -> 5 conditions x top1/top5
    row = c[(c["attack"] == "pgd") & (c["metric"] == "top1") & (c["eps"].round(6) == round(4 / 255, 6))].iloc[0]
    assert row["test"] == "McNemar exact" and row["n_paired"] == N
    assert row["pvalue"] == pytest.approx(12 / 32) and row["delta"] == pytest.approx(15.0)


def test_mean_error_bootstrap_from_corruption_records():
    from robustbench_pid.results.stats.stats import paired_bootstrap

    rng = np.random.default_rng(0)
    rows = []
    conds = ["gaussian_noise/1", "gaussian_noise/2", "fog/1", "fog/2"]
    correct = {"a": rng.random((40, 4)) < 0.6, "b": rng.random((40, 4)) < 0.9}
    for m in ("a", "b"):
        for j, c in enumerate(conds):
            for i in range(40):
                rows.append(dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="digits", split="test",
                                 protocol="standard", benchmark="corruptions", attack=c.split("/")[0],
                                 eps=float(c[-1]), condition=c, sample_id=f"s{i}",
                                 correct_top1=bool(correct[m][i, j]), correct_top5=True))
    rec = pd.DataFrame(rows)
    tidy = pd.DataFrame([dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="digits",
                              protocol="standard", benchmark="corruptions", attack="corruptions", eps=0.0,
                              metric="mean_err", value=100 * (1 - correct[m].mean()), n=40) for m in ("a", "b")])
    t = paper_tables(tidy, records=rec)[0]
    row = t.frame.iloc[0]
    assert row["Attack"] == "digits-C" and row["Metric"] == "Mean error (↓)"
    expect = paired_bootstrap(lambda e: 100 * e.mean(), 1.0 - correct["a"], 1.0 - correct["b"], n_boot=1000, seed=0)
    assert row["Δ b−a"] == f"{expect.delta:+.2f}"
    assert row["p b vs a"] == "≤0.001 *"  # at the bootstrap resolution (1/1000 resamples)
    assert "[" in row["a"]  # bootstrap interval from the records
    assert any("paired bootstrap (unnormalized mean corruption error), n=40" in n for n in t.notes)


def test_aupr_bootstrap_from_ood_records():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(1)
    ood = np.r_[np.ones(30, bool), np.zeros(90, bool)]
    scores = {"a": rng.normal(size=120) + 0.3 * ood, "b": rng.normal(size=120) + 2.0 * ood}
    rows = []
    for m in ("a", "b"):
        for i in range(120):
            rows.append(dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="imagenet-o", split="val",
                             protocol="standard", benchmark="ood", attack="ood" if ood[i] else "in", eps=0.0,
                             condition="", sample_id=f"s{i}", score=scores[m][i], ood=bool(ood[i]),
                             correct_top1=True, correct_top5=True))
    rec = pd.DataFrame(rows)
    tidy = pd.DataFrame([dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="imagenet-o",
                              protocol="standard", benchmark="ood", attack="ood", eps=0.0, metric="aupr",
                              value=100 * average_precision_score(ood, scores[m]), n=120) for m in ("a", "b")])
    t = paper_tables(tidy, records=rec)[0]
    row = t.frame[t.frame["Attack"] == "ImageNet-O"].iloc[0]
    assert row["Metric"] == "AUPR" and row["p b vs a"].endswith("*")
    assert any("paired bootstrap (AUPR), n=120" in n for n in t.notes)


def test_long_wide_and_formats(synth):
    tidy, rec = synth
    long = tables(rec, layout="long")[0].frame
    assert len(long) == len(summarize(rec))
    assert list(long.columns) == ["model", "dataset", "protocol", "benchmark", "attack", "eps", "setting", "metric",
                                  "value", "ci_low", "ci_high", "n"]
    assert set(long.loc[long["attack"] == "pgd", "setting"]) == {"PGD-20 (step 2.5·eps/20, random start, early stop top-5)"}
    wide = tables(rec, layout="wide", models=["softmax", "pid"])[0].frame
    assert list(wide.columns)[-2:] == ["softmax", "pid"] and len(wide) == 10
    assert wide.iloc[0]["softmax"] == "90.00 [69.9, 97.2]"
    tex = table(rec, layout="paper", format="latex")
    assert r"\begin{tabular}" in tex and r"Top-1 Acc (\%)" in tex and r"$\Delta$" in tex
    csv = table(rec, layout="paper", format="csv")
    assert csv.splitlines()[0].startswith("table,Attack,Metric,pid,softmax")
    with pytest.raises(UserError, match="layout"):
        tables(rec, layout="fancy")


def test_table_cli_writes_each_format(synth, tmp_path, capsys):
    from robustbench_pid.cli import main

    tidy, _ = synth
    csv = tmp_path / "results.csv"
    tidy.to_csv(csv, index=False)
    out = tmp_path / "t.tex"
    assert main(["table", str(csv), "--format", "latex", "--models", "softmax,pid", "-o", str(out)]) == 0
    tex = out.read_text()
    assert tex.count(r"\begin{tabular}") == 1 and "ImageNet-C & mCE ($\\downarrow$) & 71.20 & 68.41 & -2.79 & n/a" in tex
    assert main(["table", str(csv), "--layout", "wide", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("dataset,protocol,benchmark,attack,eps,setting,metric,pid,softmax")
    assert main(["table", str(csv), "--dataset", "cifar"]) == 2
    assert "dataset 'cifar' not in the results" in capsys.readouterr().err


def test_imagenet_c_mce_bootstrap_uses_alexnet_normalization():
    from robustbench_pid.core.imagenet_info import CORRUPTIONS_15
    from robustbench_pid.results.stats.metrics import mean_corruption_error
    from robustbench_pid.results.tables.comparisons import corruption_error_matrix, mce_statistic

    rng = np.random.default_rng(2)
    n = 12
    rows = []
    err = {}
    for m, p_ok in (("a", 0.5), ("b", 0.8)):
        ok = rng.random((n, len(CORRUPTIONS_15), 5)) < p_ok
        err[m] = {c: [1 - ok[:, j, s].mean() for s in range(5)] for j, c in enumerate(CORRUPTIONS_15)}
        for j, c in enumerate(CORRUPTIONS_15):
            for s in range(5):
                for i in range(n):
                    rows.append(dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="imagenet-c",
                                     split="val", protocol="standard", benchmark="imagenet_c", attack=c,
                                     eps=float(s + 1), condition=f"{c}/{s + 1}", sample_id=f"s{i}",
                                     correct_top1=bool(ok[i, j, s]), correct_top5=True))
    rec = pd.DataFrame(rows)
    ids, conds, mat = corruption_error_matrix(rec[rec["model"] == "a"])
    stat, name = mce_statistic(conds, "imagenet-c")
    assert name == "mCE (AlexNet-normalized)"
    assert stat(mat) == pytest.approx(mean_corruption_error(err["a"]))
    tidy = pd.DataFrame([dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="imagenet-c",
                              protocol="standard", benchmark="imagenet_c", attack="corruptions", eps=0.0,
                              metric="mce", value=mean_corruption_error(err[m]), n=n) for m in ("a", "b")])
    t = paper_tables(tidy, records=rec, n_boot=200)[0]
    row = t.frame.iloc[0]
    assert (row["Attack"], row["Metric"]) == ("ImageNet-C", "mCE (↓)")
    assert row["Δ b−a"] == f"{mean_corruption_error(err['b']) - mean_corruption_error(err['a']):+.2f}"
    assert row["p b vs a"].endswith("*")  # 50% vs 80% per-condition accuracy: a clear difference


def test_ce_baseline_is_an_explicit_option(tmp_path, capsys, monkeypatch):
    """--ce-baseline MODEL normalizes CE/mCE outside ImageNet by that model's errors (here 0.1 vs 0.2: 50%)."""
    from test_benchmarks_imagenet import _fake_corruption_records

    from robustbench_pid.cli import main
    from robustbench_pid.core.imagenet_info import CORRUPTIONS_15

    monkeypatch.delenv("ROBUSTBENCH_PID_CE_BASELINE", raising=False)
    recs = pd.concat([_fake_corruption_records("base", "digits", {c: [0.2] * 5 for c in CORRUPTIONS_15}, 0.1),
                      _fake_corruption_records("mine", "digits", {c: [0.1] * 5 for c in CORRUPTIONS_15}, 0.05)],
                     ignore_index=True)
    path = tmp_path / "records.parquet"
    recs.to_parquet(path)
    assert main(["table", str(path), "--layout", "long", "--format", "csv", "--ce-baseline", "base"]) == 0
    rows = pd.read_csv(io.StringIO(capsys.readouterr().out))
    mine = rows[rows["model"] == "mine"].set_index("metric")["value"]
    assert mine["mce"] == pytest.approx(50.0) and mine["ce_fog"] == pytest.approx(50.0)
    assert main(["table", str(path), "--layout", "long", "--format", "csv"]) == 0
    rows = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert "mce" not in set(rows["metric"]) and "mean_err" in set(rows["metric"])
    row = paper_tables(recs, ce_baseline="base")[0].frame.iloc[-1]
    assert row["Metric"] == "mCE (↓)"
    # the cell is normalized by base's errors, which a per-sample statistic of mine's errors cannot see: its
    # interval would sit around mine's raw error (5%), not the 50% printed, so none is given (it read [..5..])
    assert "[" not in str(row.filter(like="mine").iloc[0]) and "50.00" in str(row.filter(like="mine").iloc[0])


def test_attack_rows_are_called_upper_bounds_and_clean_rows_are_not():
    def row(model, attack, eps, k, wc):
        return dict(run_id=f"r{model}", model=model, checkpoint_sha256=None, dataset="digits", protocol="standard",
                    benchmark="adversarial", attack=attack, eps=eps, metric="top1", value=100 * k / 360, n=360,
                    norm="linf" if wc else "", worst_case=wc)

    attacked = pd.DataFrame([row("a", "clean", 0.0, 350, False), row("a", "pgd", 4 / 255, 120, True),
                             row("b", "clean", 0.0, 352, False), row("b", "pgd", 4 / 255, 160, True)])
    notes = paper_tables(attacked)[0].notes
    assert any(n.startswith("attack rows: accuracy under the attacks shown, an upper bound") for n in notes)
    clean = attacked[attacked["attack"] == "clean"]
    assert not any("upper bound" in n for n in paper_tables(clean)[0].notes)


def test_a_delta_on_fewer_shared_samples_than_the_cells_says_so():
    """Model a ran 10 images, b the first 8: Δ and p are on the 8 both have, not the difference of the cells."""
    recs = pd.DataFrame([dict(run_id=f"r{m}", model=m, dataset="digits", protocol="standard", benchmark="adversarial",
                              attack="clean", eps=0.0, sample_id=str(i), correct_top1=ok, correct_top5=True)
                         for m, oks in (("a", [True] * 9 + [False]), ("b", [True] * 8)) for i, ok in enumerate(oks)])
    tidy = pd.DataFrame([dict(run_id=f"r{m}", model=m, checkpoint_sha256=None, dataset="digits", protocol="standard",
                              benchmark="adversarial", attack="clean", eps=0.0, metric="top1", value=v, n=n)
                         for m, v, n in (("a", 90.0, 10), ("b", 100.0, 8))])
    t = paper_tables(tidy, records=recs)[0]
    # cells of other sample counts say theirs; the Δ says it is on the 8 shared images (both 100% there)
    assert t.frame.iloc[0]["a"] == "90.00 n=10" and t.frame.iloc[0]["b"] == "100.00 n=8"
    assert t.frame.iloc[0]["Δ b−a"] == "+0.00 (n=8)"
    assert any("Δ and p with (n=…) are on the samples both runs have, fewer than a cell's own n" in n
               for n in t.notes)
    assert not any(n.startswith("p n/a") for n in t.notes)  # p was computed: no "p n/a" note above it


def test_the_paper_table_gives_no_delta_or_test_between_cells_of_other_settings():
    """mCE cells made under other corruption settings (here another implementation) are shown side by side, but
    neither a difference nor a paired test is computed between them (compare_models refuses the same pair)."""
    import json

    from robustbench_pid.core.imagenet_info import CORRUPTIONS_15
    from robustbench_pid.results.tables.layouts import paper_tables

    rng = np.random.default_rng(0)
    rows = []
    for model, impl in (("A", 1), ("B", 2)):
        for i in range(20):
            ids = dict(run_id="r" + model, model=model, dataset="imagenet", protocol="standard",
                       benchmark="corruptions", eps=0.0, sample_id=f"w/{i}.JPEG", correct_top5=True)
            rows.append(dict(ids, attack="clean", params="{}", condition="clean", corruption="", severity=0,
                             correct_top1=True))
            for c in CORRUPTIONS_15:
                for s in range(1, 6):
                    rows.append(dict(ids, attack=f"{c}/{s}", condition=f"{c}/{s}", corruption=c, severity=s,
                                     params=json.dumps({"corruption": c, "severity": s, "impl": impl}),
                                     correct_top1=bool(rng.random() < 0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = paper_tables(pd.DataFrame(rows), n_boot=100)[0]
    mce = t.frame[t.frame["Metric"].str.contains("mCE")].iloc[0]
    assert (mce["Δ B−A"], mce["p B vs A"]) == ("n/a", "n/a") and mce["A"] != mce["B"]
    assert any("measured under other settings" in n for n in t.notes)


def test_a_line_break_in_a_model_name_stays_in_its_cell():
    """rbp.evaluate(name="my\\nnet") labels the model: a line break in a cell ended the Markdown row (issue 45)."""
    from robustbench_pid.results.tables.render import Table, render_latex, render_markdown

    t = Table(pd.DataFrame({"Model": ["my\nnet | v2"], "Top-1": ["99.00"]}), title="a\ntitle")
    md = render_markdown([t])
    assert md.splitlines()[0] == "### a title"
    assert "| my net \\| v2 | 99.00 |" in md and len([ln for ln in md.splitlines() if ln.startswith("|")]) == 3
    assert "my net | v2" in render_latex([t]) and "\n\n" not in render_latex([t]).strip()

"""Evidence that each attack worked (issue 26): per-sample telemetry with exact pass counts, the
indicators of attack failure as pure functions on hand-made records, their tidy rows (never a 0
for what could not be computed), ``check`` treating a rise as the regression, ``--trace``,
``--agreement`` (bf16 on the CPU) and the option checks. The built-to-fail models are in
tests/test_evidence_failing.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.attacks import make_attack
from robustbench_pid.attacks.base import aligned_draws
from robustbench_pid.errors import UserError
from robustbench_pid.results.ci.check import compare, lower_is_better
from robustbench_pid.results.report.evidence_rows import evidence_rows
from robustbench_pid.results.report.evidence_text import format_evidence
from robustbench_pid.results.report.indicators import INDICATORS, loss_trend, loss_variation, sample_flags
from robustbench_pid.run.spec_builder import build_spec

pytestmark = pytest.mark.usefixtures("one_thread")


def _attacked(summary: pd.DataFrame, attack: str, metric: str) -> pd.Series:
    return summary[(summary["attack"] == attack) & (summary["metric"] == metric)]["value"]


# --- telemetry: the attack's own count of passes -----------------------------------------------
@pytest.mark.parametrize("name,params,fwd,bwd", [
    ("pgd", {"steps": 20, "early_stop": False}, 20, 20),  # 20 gradient steps, each one forward + backward
    ("fgsm", {}, 1, 1),  # one gradient
    ("cw", {"steps": 3, "search_steps": 2}, 6, 6),  # steps x search steps
    ("spsa", {"iterations": 2, "n_samples": 4, "early_stop": False}, 16, 0),  # 2 x 2 x 4 probes, no gradient
    ("noise", {"eps": 0.1}, 0, 0),  # one draw, no pass
])
def test_attack_counts_its_own_passes(pid_model, digits_batch, name, params, fwd, bwd):
    x, y = digits_batch[0][:6], digits_batch[1][:6]
    attack = make_attack(name, **params)
    attack(pid_model, x, y)
    t = attack.telemetry
    assert t.forward.tolist() == [fwd] * 6 and t.backward.tolist() == [bwd] * 6


def test_records_carry_telemetry_and_pgd20_costs_21_forward_20_backward(tmp_path):
    """PGD-20 without early stop: 20 forward+backward passes per attacked sample plus the verdict's
    forward pass = 21 forward, 20 backward (the clean pass is shared by every condition, not counted);
    FGSM: 1 + 1 verdict forward, 1 backward."""
    df = rbp.evaluate("pid_deit", attack="pgd", eps="4/255", limit=8, out=tmp_path / "r",
                      params={"early_stop": False})
    fg = rbp.evaluate("pid_deit", attack="fgsm", eps="4/255", limit=8, out=tmp_path / "f")
    assert _attacked(df, "pgd", "passes_forward").tolist() == [21.0]
    assert _attacked(df, "pgd", "passes_backward").tolist() == [20.0]
    assert _attacked(fg, "fgsm", "passes_forward").tolist() == [2.0]
    assert _attacked(fg, "fgsm", "passes_backward").tolist() == [1.0]
    r = rbp.load_records(df.attrs["run_dir"])
    pgd = r[(r["attack"] == "pgd") & r["attacked"]]
    assert (pgd["iterations"] == 20).all()
    assert (pgd["loss_best"] >= pgd["loss_start"] - 1e-6).all() and (pgd["loss_best"] >= pgd["loss_end"] - 1e-6).all()
    # the margin at the returned point is negative exactly where the returned point is misclassified
    assert ((pgd["margin"] < 0) == (pgd["pred"] != pgd["label"])).all()
    # "some iterate was adversarial" includes the returned point
    assert (pgd["ever_adversarial"] >= (pgd["pred"] != pgd["label"]).astype(float)).all()
    clean = r[r["attack"] == "clean"]
    assert "passes_forward" not in clean.columns or clean["passes_forward"].isna().all()


def test_early_stop_spends_fewer_passes(tmp_path):
    df = rbp.evaluate("pid_deit", attack="pgd", eps="6/255", limit=16, out=tmp_path / "r")
    r = rbp.load_records(df.attrs["run_dir"])
    pgd = r[(r["attack"] == "pgd") & r["attacked"]]
    broken = pgd["correct_top5"] == False  # noqa: E712  (stopped when the label left the top-5)
    assert broken.any() and (pgd.loss_start.notna()).all()
    assert (pgd.loc[broken, "passes_backward"] < 20).all()
    assert (pgd["passes_forward"] == pgd["passes_backward"] + 1).all()
    assert _attacked(df, "pgd", "passes_backward").iloc[0] == pytest.approx(pgd["passes_backward"].mean())


# --- the indicators as pure functions ---------------------------------------------------------
def test_loss_trend_and_variation_by_hand():
    t = loss_trend(np.array([[0, 1, 2, 3, 4], [0, 4, 4, 4, 4], [1, np.nan, np.nan, np.nan, np.nan]], dtype=float))
    # scaled to [0, 1]; the last 10% (>= 1 iterate) against the window before it
    assert t[0] == pytest.approx(0.25) and t[1] == 0.0 and np.isnan(t[2])
    # 20 iterates: the mean of the last 2 against the mean of the 2 before
    assert loss_trend(np.arange(20.0)[None])[0] == pytest.approx((18.5 - 16.5) / 19)
    v = loss_variation(np.array([1.0, 0.01]), np.array([[1.0, 1.2], [0.01, 0.02]]))
    assert v.tolist() == pytest.approx([0.2, 0.1])  # relative to max(|L(x)|, 0.1)


def _records(**cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    base = dict(run_id="r", model="m", attack="pgd", eps=0.01, params=json.dumps({"eps": 0.01, "steps": 3}),
                condition="", sample_id=[str(i) for i in range(n)], label=0, attacked=True, worst_case=True,
                correct_top1=True, correct_top5=True, passes_forward=4.0, passes_backward=3.0)
    base.update(cols)
    return pd.DataFrame(base)


def test_sample_flags_on_hand_made_records():
    r = _records(pred=[0, 0, 1, 0], ever_adversarial=[1.0, 0.0, 1.0, np.nan], grad_zero_steps=[3, 1, 0, 2],
                 iterations=[3, 3, 3, 3], loss_trend=[0.2, 0.01, 0.5, np.nan], loss_variation=[0.0, 0.5, 0.05, 0.0])
    f = sample_flags(r)
    # silent success: an iterate was adversarial, the returned point (pred 0 = label) is not
    assert f["silent_success"].tolist()[:3] == [1.0, 0.0, 0.0] and np.isnan(f["silent_success"].iloc[3])
    # incomplete: still rising by > 5% of the range, and the attack failed (sample 2 succeeded)
    assert f["incomplete_optimization"].tolist()[:3] == [1.0, 0.0, 0.0]
    assert f["unavailable_gradients"].tolist() == [1.0, 0.0, 0.0, 1.0]  # zero at > half the iterates
    assert f["unstable_predictions"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert f["transfer_failure"].isna().all() and f["unconstrained_failure"].isna().all()


def test_unconstrained_failure_joins_the_unbounded_run():
    bounded = _records(pred=[0, 0, 1], ever_adversarial=[0.0, 0.0, 1.0])
    unc = _records(pred=[0, 1, 1], ever_adversarial=[0.0, 1.0, 1.0], correct_top1=[True, False, False], eps=1.0,
                   params=json.dumps({"eps": 1.0, "steps": 3, "random_start": False}), condition="unconstrained")
    r = pd.concat([bounded, unc], ignore_index=True)
    f = sample_flags(r)
    assert f["unconstrained_failure"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_rows_say_why_instead_of_zero():
    """FGSM-like records (no trace, no --indicators): shares where they can be computed, NaN rows with
    a reason where not, and the transfer indicator is never 0."""
    r = _records(pred=[0, 1], ever_adversarial=[0.0, 1.0], grad_zero_steps=[0, 0], iterations=[1, 1])
    plain = evidence_rows(r)  # without --indicators: only what the telemetry decides, no NaN rows
    assert set(plain["metric"]) == {"passes_forward", "passes_backward", "silent_success", "unavailable_gradients"}
    r["loss_variation"] = [np.nan, 0.0]  # as --indicators writes it (here: one sample not measured)
    rows = evidence_rows(r).set_index("metric")
    assert set(INDICATORS) <= set(rows.index)
    assert rows.loc["silent_success", "value"] == 0.0 and rows.loc["silent_success", "n"] == 2
    assert rows.loc["passes_forward", "value"] == 4.0
    assert rows.loc["unstable_predictions", "value"] == 0.0 and rows.loc["unstable_predictions", "n"] == 1
    for m in ("incomplete_optimization", "unconstrained_failure", "transfer_failure"):
        assert np.isnan(rows.loc[m, "value"]) and rows.loc[m, "n"] == 0 and rows.loc[m, "note"]
    assert "surrogate" in rows.loc["transfer_failure", "note"]
    assert "no loss trace" in rows.loc["incomplete_optimization", "note"]
    assert "no unconstrained run" in rows.loc["unconstrained_failure", "note"]
    text = format_evidence(evidence_rows(r).assign(norm="linf", setting="PGD-3", precision="fp32"))
    assert "n/a" in text and "surrogate" in text


def test_check_treats_a_rise_in_an_indicator_as_the_regression():
    assert all(lower_is_better(m) for m in INDICATORS) and not lower_is_better("top1")
    row = dict(model="m", dataset="digits", protocol="standard", attack="pgd", eps=0.01, metric="silent_success",
               n=64, ci_low=np.nan, ci_high=np.nan, settings_id="", samples_id="", condition="", setting="",
               settings="", precision="fp32", norm="linf")
    base = pd.DataFrame([{**row, "value": 2.0}])
    worse = compare(pd.DataFrame([{**row, "value": 10.0}]), base, tolerance=1.0)
    better = compare(pd.DataFrame([{**row, "value": 0.0}]), base, tolerance=1.0)
    assert worse["status"].tolist() == ["REGRESSED"] and better["status"].tolist() == ["improved"]


# --- options, --trace, --agreement ---------------------------------------------------------------
def test_evidence_options_are_checked_where_they_enter():
    with pytest.raises(UserError, match="already fp32 eager"):
        build_spec("pid_deit", attack="pgd", agreement=8)
    with pytest.raises(UserError, match="standard protocol"):
        build_spec("pid_deit", attack="pgd", agreement=8, precision="bf16", protocol="paper")
    with pytest.raises(UserError, match="adversarial benchmark"):
        build_spec("pid_deit", benchmark="corruptions", indicators=True)
    with pytest.raises(UserError, match="whole number"):
        build_spec("pid_deit", attack="pgd", agreement=-1, precision="bf16")
    assert build_spec("pid_deit", attack="pgd", agreement=8, precision="bf16").agreement == 8


def test_aligned_draws_reproduce_the_full_batch_rows(pid_model, digits_batch):
    """The fp32 re-run of some rows draws what those rows drew in the full run (same random start)."""
    x, y = digits_batch[0][:8], digits_batch[1][:8]
    attack = make_attack("pgd", eps=4 / 255, steps=3, early_stop=False)
    g = torch.Generator().manual_seed(5)
    state = g.get_state()
    full = attack(pid_model, x, y, generator=g)
    rows = torch.tensor([1, 4, 6])
    g2 = torch.Generator().manual_seed(0)
    g2.set_state(state)
    with aligned_draws(8, rows):
        part = attack(pid_model, x[rows], y[rows], generator=g2)
    assert torch.allclose(part, full[rows], atol=1e-6)


def test_trace_goes_to_its_own_parquet(tmp_path):
    df = rbp.evaluate("pid_deit", attack="pgd", eps="4/255", steps=3, limit=8, out=tmp_path / "r", trace=True)
    run = tmp_path / "r"
    tr = pd.read_parquet(run / "trace.parquet")
    recs = pd.read_parquet(run / "records.parquet")
    assert "loss_trace" not in recs.columns
    att = recs[(recs["attack"] == "pgd") & recs["attacked"]]
    per = tr.groupby("sample_id", observed=True)["iteration"].count()
    # one loss per iterate evaluated, then the returned point
    assert per.loc[att["sample_id"]].tolist() == (att["iterations"] + 1).astype(int).tolist()
    last = tr.sort_values("iteration").groupby("sample_id", observed=True)["loss"].last()
    assert last.loc[att["sample_id"]].to_numpy() == pytest.approx(att["loss_end"].to_numpy(), rel=1e-5)
    assert len(df)


def test_bf16_agreement_on_cpu(tmp_path):
    df = rbp.evaluate("pid_deit", attack="pgd", eps="4/255", steps=3, limit=8, out=tmp_path / "r",
                      precision="bf16", agreement=8, device="cpu")
    row = df[df["metric"] == "agreement"].iloc[0]
    recs = rbp.load_records(df.attrs["run_dir"])
    att = recs[(recs["attack"] == "pgd") & recs["attacked"]]
    assert row["n"] == len(att) and att["agreement"].notna().all()
    assert row["value"] == pytest.approx(100 * att["agreement"].mean())
    assert row["ci_low"] <= row["value"] <= row["ci_high"]


def test_cli_prints_the_matrix_and_the_report_shows_it(tmp_path):
    """`evaluate --indicators` prints the condition x indicator matrix (n/a with its reason where an
    indicator cannot be computed), and the HTML report has the same matrix."""
    import subprocess
    import sys

    from robustbench_pid.results.report.html import build_report

    out = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "pid_deit", "--attack", "fgsm",
                        "--eps", "4/255", "--indicators", "--limit", "8", "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    text = p.stdout[p.stdout.index("evidence that each attack worked"):]
    assert "FGSM @ 4/255" in text and "[unconstrained]" in text
    assert "n/a" in text and "no loss trace" in text and "surrogate" in text
    page = build_report(out)
    assert "Evidence that each attack worked" in page and "unconstrained" in page and "n/a" in page


def test_collecting_evidence_never_changes_a_verdict(tmp_path):
    """--indicators and --trace only add conditions and columns: every condition both runs share has the same
    per-sample predictions and verdicts (the attack draws the same random starts; the noise check and the
    unconstrained run come after it in the unit's RNG stream, or in units of their own)."""
    base = dict(attack="pgd", eps=["2/255", "4/255"], steps=5, limit=24, chunk_size=12)
    rbp.evaluate("pid_deit", out=tmp_path / "plain", **base)
    rbp.evaluate("pid_deit", out=tmp_path / "evidence", indicators=True, trace=True, **base)
    key = ["attack", "eps", "sample_id"]
    cols = ["clean_pred", "pred", "correct_top1", "correct_top5", "attacked", "pert_linf", "passes_forward"]
    plain = pd.read_parquet(tmp_path / "plain" / "records.parquet").set_index(key)[cols].sort_index()
    ev = pd.read_parquet(tmp_path / "evidence" / "records.parquet").set_index(key)[cols].sort_index()
    assert len(ev) > len(plain)  # the unconstrained conditions
    pd.testing.assert_frame_equal(ev.loc[plain.index], plain, check_exact=True)

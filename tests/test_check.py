"""`check`: regression guard against a baseline CSV (identical passes; drops and missing rows fail)."""
from __future__ import annotations

import pandas as pd
import pytest

from robustbench_pid.results.ci.baseline import read_baseline
from robustbench_pid.results.ci.check import check, update
from robustbench_pid.cli import main
from robustbench_pid.errors import UserError
from robustbench_pid.results.stats.metrics import wilson_interval


def _row(model, attack, eps, metric, k, n=360):
    lo, hi = wilson_interval(k, n)
    return dict(run_id=f"run_{model}", model=model, checkpoint_sha256="ab" * 32, dataset="digits",
                protocol="standard", benchmark="adversarial", attack=attack, eps=eps, metric=metric,
                value=100 * k / n, n=n, ci_low=100 * lo, ci_high=100 * hi,
                norm="" if attack == "clean" else "linf")  # as summarize stamps it: eps is written k/255


@pytest.fixture()
def results(tmp_path):
    df = pd.DataFrame([
        _row("deit", "clean", 0.0, "top1", 356), _row("deit", "pgd", 4 / 255, "top1", 127),
        _row("deit", "pgd", 4 / 255, "top5", 273), _row("pid_deit", "pgd", 4 / 255, "top1", 163),
    ])
    path = tmp_path / "results.csv"
    df.to_csv(path, index=False)
    base = tmp_path / "baseline.csv"
    update(path, base)
    return df, path, base


def test_identical_results_pass(results, capsys):
    df, path, base = results
    res = check(path, base)
    assert res.ok and set(res.rows["status"]) == {"ok"} and len(res.rows) == 4
    assert main(["check", str(path), "--baseline", str(base)]) == 0
    out = capsys.readouterr().out
    assert "4 rows; 4 ok, 0 regressed, 0 missing" in out and out.strip().endswith("PASSED")


def test_lowered_number_fails_with_diff(results, tmp_path, capsys):
    df, _, base = results
    low = df.copy()
    i = low.index[(low["model"] == "deit") & (low["attack"] == "pgd") & (low["metric"] == "top1")][0]
    lo, hi = wilson_interval(117, 360)  # 10 samples fewer: 35.28 -> 32.50
    low.loc[i, ["value", "ci_low", "ci_high"]] = [100 * 117 / 360, 100 * lo, 100 * hi]
    p = tmp_path / "low.csv"
    low.to_csv(p, index=False)
    res = check(p, base)
    assert not res.ok
    bad = res.failures.iloc[0]
    assert (bad["status"], bad["model"], bad["attack"], bad["metric"]) == ("REGRESSED", "deit", "pgd", "top1")
    assert bad["old"] == pytest.approx(35.2777778) and bad["new"] == pytest.approx(32.5)
    assert bad["delta"] == pytest.approx(-2.7777778)
    assert main(["check", str(p), "--baseline", str(base)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.lstrip().startswith("REGRESSED"))
    assert line.split() == ["REGRESSED", "deit", "digits", "standard", "pgd", "4/255", "top1", "35.28", "32.50",
                            "-2.78", "[27.87,", "37.50]", "[-9.64,", "+4.12]"]
    assert "1 regressed" in out and out.strip().endswith("FAILED")
    # within tolerance: passes
    assert check(p, base, tolerance=3.0).ok
    # CI-aware: a 2.8-point drop on 360 images is within noise (the interval of new - old contains 0)
    sig = check(p, base, significant=True)
    assert sig.ok and "within-noise" in set(sig.rows["status"])


def test_significant_mode_fails_on_a_real_drop(results, tmp_path):
    df, _, base = results
    low = df.copy()
    i = low.index[(low["model"] == "pid_deit")][0]
    lo, hi = wilson_interval(100, 360)  # 45.28 -> 27.78: far outside the noise
    low.loc[i, ["value", "ci_low", "ci_high"]] = [100 * 100 / 360, 100 * lo, 100 * hi]
    p = tmp_path / "low.csv"
    low.to_csv(p, index=False)
    res = check(p, base, significant=True)
    assert not res.ok and res.failures.iloc[0]["model"] == "pid_deit"
    assert res.failures.iloc[0]["delta_ci_high"] < 0


def test_rows_the_baseline_lacks_are_one_line_unless_verbose(results, tmp_path):
    """A baseline older than the telemetry metrics: every run's telemetry rows are "new"; the report says so in one
    line (how many, of which models, which metrics) instead of a line per row, and --verbose still lists them."""
    df, _, base = results
    extra = [_row(m, "pgd", 4 / 255, metric, 20) for m in ("deit", "pid_deit")
             for metric in ("silent_success", "passes_forward", "incomplete_optimization")]
    p = tmp_path / "more.csv"
    pd.concat([df, pd.DataFrame(extra)]).to_csv(p, index=False)
    res = check(p, base)
    assert res.ok and (res.rows["status"] == "new").sum() == 6
    text = res.report().splitlines()
    assert text[0] == ("new (not in the baseline, not compared; --verbose lists them, --update adds them): 6 rows of "
                       "deit, pid_deit: metrics incomplete_optimization, passes_forward, silent_success")
    assert not any(ln.lstrip().startswith("new ") and "digits" in ln for ln in text) and text[-1] == "PASSED"
    verbose = res.report(verbose=True).splitlines()
    assert sum(ln.lstrip().startswith("new ") for ln in verbose) == 6 and not verbose[0].startswith("new (")


def test_missing_row_fails_new_row_does_not(results, tmp_path, capsys):
    df, _, base = results
    fewer = df[df["metric"] != "top5"]
    p = tmp_path / "fewer.csv"
    fewer.to_csv(p, index=False)
    res = check(p, base)
    assert not res.ok
    miss = res.failures.iloc[0]
    assert (miss["status"], miss["metric"]) == ("MISSING", "top5") and pd.isna(miss["new"])
    assert main(["check", str(p), "--baseline", str(base)]) == 1
    assert "1 missing" in capsys.readouterr().out
    more = pd.concat([df, pd.DataFrame([_row("deit", "fgsm", 4 / 255, "top1", 200)])])
    p2 = tmp_path / "more.csv"
    more.to_csv(p2, index=False)
    res2 = check(p2, base)
    assert res2.ok and (res2.rows["status"] == "new").sum() == 1
    # --metric restricts both sides: without top5 nothing is missing
    assert check(p, base, metrics=["top1"]).ok


def test_update_rewrites_deliberately(results, tmp_path, capsys):
    df, _, base = results
    low = df.copy()
    low.loc[0, "value"] = 50.0
    p = tmp_path / "low.csv"
    low.to_csv(p, index=False)
    assert main(["check", str(p), "--baseline", str(base)]) == 1
    assert main(["check", str(p), "--baseline", str(base), "--update"]) == 0
    assert "1 REGRESSED" in capsys.readouterr().out
    assert read_baseline(base)["value"].min() == pytest.approx(35.2777778)
    assert (read_baseline(base)["value"] == 50.0).sum() == 1
    assert main(["check", str(p), "--baseline", str(base)]) == 0


def test_bad_input_is_a_clear_error(results, tmp_path, capsys):
    _, path, _ = results
    assert main(["check", str(path), "--baseline", str(tmp_path / "nope.csv")]) == 2
    assert "baseline not found" in capsys.readouterr().err
    dup = pd.concat([pd.read_csv(path)] * 2)
    p = tmp_path / "dup.csv"
    dup.to_csv(p, index=False)
    assert main(["check", str(p), "--baseline", str(path)]) == 2
    assert "sharing a key" in capsys.readouterr().err


def test_committed_smoke_baseline_covers_the_smoke_suite():
    """results/baselines/smoke-digits.csv must match attacks/smoke.toml (regenerate it when the suite changes:
    see docs/results.md)."""
    from pathlib import Path

    from robustbench_pid.run.suites import load_suite

    path = Path(__file__).resolve().parents[1] / "results" / "baselines" / "smoke-digits.csv"
    base = read_baseline(path)
    assert set(base["model"]) == {"deit", "pid_deit"}
    assert set(base["dataset"]) == {"digits"} and set(base["protocol"]) == {"standard"}
    assert (base["n"] == 360).all()  # the full embedded test set
    suite = {(a.attack, round(float(a.params["eps"]), 10)) for a in load_suite("smoke")["attacks"]}
    eps_grid = {e for _, e in suite}
    for model in ("deit", "pid_deit"):
        rows = base[(base["model"] == model) & (base["metric"] == "top1")]
        have = {(a, round(float(e), 10)) for a, e in zip(rows["attack"], rows["eps"])}
        # a baseline row the suite can no longer produce would fail CI as MISSING: regenerate the baseline
        stale = {(a, e) for a, e in have if (a, e) not in suite and a != "clean"
                 and not (a == "worst-case" and e in eps_grid)}
        assert not stale, f"baseline rows {sorted(stale)} for {model} are not in attacks/smoke.toml: regenerate it"
        assert ("clean", 0.0) in have and len(have & suite) >= 4
    assert base[base["metric"] == "top1"]["value"].between(0, 100).all()


@pytest.mark.parametrize("tol", ["nan", "inf", "-1"])
def test_tolerance_that_could_pass_any_regression_is_refused(tol, results, tmp_path, capsys):
    """A NaN tolerance compares False with every drop, so nothing would fail: refused, like a negative one."""
    df, _, base = results
    low = df.copy()
    i = low.index[(low["model"] == "deit") & (low["attack"] == "pgd") & (low["metric"] == "top1")][0]
    low.loc[i, "value"] -= 25.0
    p = tmp_path / "low.csv"
    low.to_csv(p, index=False)
    assert main(["check", str(p), "--baseline", str(base), "--tolerance", tol]) == 2
    assert "--tolerance must be a finite number >= 0 percentage points" in capsys.readouterr().err
    with pytest.raises(UserError, match="finite number >= 0"):
        check(p, base, tolerance=float(tol))
    assert main(["check", str(p), "--baseline", str(base)]) == 1


def test_a_nan_result_fails_instead_of_passing_as_ok(results, tmp_path, capsys):
    df, _, base = results
    bad = df.copy()
    i = bad.index[(bad["model"] == "pid_deit") & (bad["attack"] == "pgd")][0]
    bad.loc[i, ["value", "ci_low", "ci_high"]] = float("nan")
    p = tmp_path / "nan.csv"
    bad.to_csv(p, index=False)
    res = check(p, base)
    assert not res.ok and list(res.failures["status"]) == ["INVALID"]
    assert main(["check", str(p), "--baseline", str(base)]) == 1
    out = capsys.readouterr().out
    assert "INVALID: pid_deit digits pgd eps=4/255 top1: not a finite number: baseline 45.27" in out
    assert "1 not a number" in out and out.strip().endswith("FAILED")


@pytest.mark.parametrize("metric", ["mean_err", "err_fog", "ce_fog", "mce", "fpr95", "skipped_unreadable"])
def test_a_rising_error_is_a_regression_and_a_falling_one_an_improvement(metric, tmp_path):
    """Lower is better for errors: mean_err 30 -> 45 is a regression, not an improvement (it read as one)."""
    row = dict(run_id="r", model="m", checkpoint_sha256="ab" * 32, dataset="digits-c", protocol="standard",
               benchmark="corruptions", attack="all", eps=0.0, metric=metric, value=30.0, n=360, norm="")
    base = tmp_path / "base.csv"
    (tmp_path / "r.csv").write_text(pd.DataFrame([row]).to_csv(index=False))
    update(tmp_path / "r.csv", base)
    for value, status in ((45.0, "REGRESSED"), (20.0, "improved")):
        (tmp_path / "new.csv").write_text(pd.DataFrame([{**row, "value": value}]).to_csv(index=False))
        assert list(check(tmp_path / "new.csv", base).rows["status"]) == [status]


@pytest.mark.parametrize("old, new", [("", "not converged"), ("converged", ""), ("converged", "not converged")])
def test_a_converged_values_status_change_fails_even_when_one_side_recorded_none(old, new, tmp_path):
    """A baseline from before the status column (or a CSV without it) must not let a converged value turn into
    an unconverged one unnoticed: a status on one side only is a change too."""
    row = {**_row("deit", "converge", 4 / 255, "top1", 47), "status": old}
    pd.DataFrame([row]).to_csv(tmp_path / "a.csv", index=False)
    base = tmp_path / "base.csv"
    update(tmp_path / "a.csv", base)
    pd.DataFrame([{**row, "status": new}]).to_csv(tmp_path / "b.csv", index=False)
    res = check(tmp_path / "b.csv", base)
    assert list(res.rows["status"]) == ["STATUS-CHANGED"] and not res.ok
    assert (new or "(none recorded)") in res.rows["changes"].iloc[0]
    pd.DataFrame([row]).to_csv(tmp_path / "c.csv", index=False)
    assert check(tmp_path / "c.csv", base).ok  # the same status on both sides holds


def test_a_check_that_compares_nothing_is_an_error_not_a_pass(results, tmp_path, capsys):
    df, path, base = results
    empty = tmp_path / "empty.csv"
    read_baseline(base).iloc[:0].to_csv(empty, index=False)
    with pytest.raises(UserError, match="holds no rows to compare with"):
        check(path, empty)
    assert main(["check", str(path), "--baseline", str(empty)]) == 2  # a usage error, as every bad input
    assert "holds no rows to compare with" in capsys.readouterr().err
    only_top5 = tmp_path / "top5.csv"
    b = read_baseline(base)
    b[b["metric"] == "top5"].to_csv(only_top5, index=False)
    with pytest.raises(UserError, match="no rows to compare with for --metric top1"):
        check(path, only_top5, metrics=["top1"])


def test_cost_rows_are_reported_not_gated(tmp_path):
    """Seconds and memory per sample follow the machine (and lower is better for them): check leaves the cost
    benchmark's rows out instead of failing CI on timing jitter or calling a slowdown an improvement."""
    rows = [dict(run_id="r", model="m", checkpoint_sha256="ab" * 32, dataset="digits", protocol="standard",
                 benchmark="cost", attack="clean", eps=0.0, metric=m, value=v, n=64, norm="")
            for m, v in (("sec_per_sample_test", 0.5), ("peak_mem_test_mb", 100.0))]
    rows.append(_row("m", "clean", 0.0, "top1", 300))
    pd.DataFrame(rows).to_csv(tmp_path / "a.csv", index=False)
    base = tmp_path / "base.csv"
    update(tmp_path / "a.csv", base)
    assert list(read_baseline(base)["metric"]) == ["top1"]
    slower = pd.DataFrame(rows)
    slower.loc[slower["metric"] == "sec_per_sample_test", "value"] = 0.1
    slower.loc[slower["metric"] == "peak_mem_test_mb", "value"] = 900.0
    slower.to_csv(tmp_path / "b.csv", index=False)
    res = check(tmp_path / "b.csv", base)
    assert res.ok and list(res.rows["metric"]) == ["top1"]
    with pytest.raises(UserError, match="sec_per_sample_test: not gated by check"):
        check(tmp_path / "b.csv", base, metrics=["sec_per_sample_test"])


def test_a_number_computable_on_neither_side_holds_and_one_side_nan_still_fails(tmp_path):
    """`--update` then `check` on the same results passes, though an indicator there is NaN with n = 0."""
    row = dict(run_id="r", model="m", checkpoint_sha256="ab" * 32, dataset="digits", protocol="standard",
               benchmark="adversarial", attack="square", eps=4 / 255, metric="incomplete_optimization",
               value=float("nan"), n=0, norm="linf")
    pd.DataFrame([row]).to_csv(tmp_path / "a.csv", index=False)
    base = tmp_path / "base.csv"
    update(tmp_path / "a.csv", base)
    res = check(tmp_path / "a.csv", base)
    assert res.ok and list(res.rows["status"]) == ["ok"] and "not computable" in res.rows["changes"].iloc[0]
    pd.DataFrame([{**row, "value": 12.0, "n": 40}]).to_csv(tmp_path / "b.csv", index=False)
    assert list(check(tmp_path / "b.csv", base).rows["status"]) == ["INVALID"]


LADDER = {"steps": 100, "targets": 9, "tol_share": 0.001, "tol_min": 1}


def _converged(value, status, ladder=LADDER, settings=True):
    """A converged top-1 row as summarize writes it (benchmark and attack 'converge', the ladder in its settings)."""
    import hashlib
    import json

    row = {**_row("deit", "converge", 4 / 255, "top1", 47), "benchmark": "converge", "value": value, "status": status}
    if settings:
        s = json.dumps({"attack": "converge", "benchmark": "converge", "params": {"ladder": ladder},
                        "protocol": "standard"}, sort_keys=True)
        row.update(settings=s, settings_id=hashlib.sha256(s.encode()).hexdigest()[:12], setting="converge", samples_id="s1")
    return row


@pytest.mark.parametrize("old, new, status, says", [
    # a baseline from before settings were recorded: a weaker ladder (still 'converged' then) read as improved
    (_converged(40.0, "converged", settings=False), _converged(45.0, "converged", {**LADDER, "steps": 10}),
     "SETTINGS-CHANGED", "the baseline records no ladder settings for this converged value"),
    (_converged(40.0, "converged"), _converged(45.0, "converged (reduced ladder: steps 10 < 100)", settings=True),
     "STATUS-CHANGED", "status: converged → converged (reduced ladder: steps 10 < 100)"),
    (_converged(40.0, "not converged: stopped"), _converged(45.0, "not converged: stopped"),
     "STATUS-CHANGED", "status: not converged: stopped on both sides; a converged value rising counts as improved "
                       "only when both sides are exactly 'converged'"),
    (_converged(40.0, "upper bound: gradients unavailable"), _converged(41.0, "upper bound: gradients unavailable"),
     "STATUS-CHANGED", "status: upper bound: gradients unavailable on both sides"),
    (_converged(40.0, "converged"), _converged(45.0, "converged"), "improved", ""),
    (_converged(40.0, "converged (reduced ladder: x)"), _converged(40.0, "converged (reduced ladder: x)"), "ok", ""),
])
def test_a_converged_value_rises_to_improved_only_between_two_full_ladders(tmp_path, capsys, old, new, status, says):
    """README: a weakened evaluation never passes for an improvement. A converged value that rose is 'improved' only
    when both sides are exactly 'converged' with the same recorded ladder; otherwise it fails, saying why."""
    pd.DataFrame([old]).to_csv(tmp_path / "a.csv", index=False)
    base = tmp_path / "base.csv"
    update(tmp_path / "a.csv", base)
    pd.DataFrame([new]).to_csv(tmp_path / "b.csv", index=False)
    res = check(tmp_path / "b.csv", base)
    assert list(res.rows["status"]) == [status], res.report()
    assert says in res.rows["changes"].iloc[0]
    assert res.ok == (status in ("improved", "ok"))
    assert main(["check", str(tmp_path / "b.csv"), "--baseline", str(base)]) == (0 if res.ok else 1)
    if not res.ok:
        out = capsys.readouterr().out
        assert f"{status}: deit digits converge eps=4/255 top1: " in out and out.strip().endswith("FAILED")


@pytest.mark.parametrize("cell", ["abc", "41.67%"])
def test_a_value_that_is_no_number_is_one_error_line_naming_file_and_line(results, tmp_path, capsys, cell):
    """A hand-edited baseline (or tidy results CSV) with text in a number column was a ValueError traceback."""
    _, path, base = results
    text = base.read_text().splitlines()
    cols = text[0].split(",")
    cells = text[2].split(",")
    cells[cols.index("value")] = cell
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([text[0], text[1], ",".join(cells), *text[3:]]) + "\n")
    assert main(["check", str(path), "--baseline", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: line 3 (") and err.count("\n") == 1
    assert f"value {cell!r} is not a number" in err and "--update" in err
    tidy = pd.read_csv(path).astype({"value": object})
    tidy.loc[1, "value"] = cell
    tidy.to_csv(tmp_path / "tidy.csv", index=False)
    assert main(["check", str(tmp_path / "tidy.csv"), "--baseline", str(base)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'tidy.csv'}: line 3 (") and "is not a number" in err
    assert main(["table", str(tmp_path / "tidy.csv")]) == 2
    assert "is not a number" in capsys.readouterr().err


def test_a_damaged_sidecar_is_one_error_line_and_removing_it_works(results, tmp_path, capsys):
    """A baseline's per-sample sidecar that is not one (damaged, another file) was a pyarrow traceback."""
    _, path, base = results
    side = base.with_name("baseline.samples.parquet")
    side.write_bytes(b"not parquet")
    assert main(["check", str(path), "--baseline", str(base)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {side}: not the per-sample sidecar of {base}") and err.count("\n") == 1
    pd.DataFrame({"x": [1]}).to_parquet(side)  # readable, but not verdicts
    assert main(["check", str(path), "--baseline", str(base)]) == 2
    assert "not the per-sample sidecar" in capsys.readouterr().err
    side.unlink()  # the fix it names
    assert main(["check", str(path), "--baseline", str(base)]) == 0

"""The bad-input and fault matrix of issue 15, kept as tests: one parametrized test per row.

Every bad input must end in exactly one ``error:`` line naming the problem and the fix, exit 2,
and leave no folder that looks complete without being so. Runs are in-process (the console
entry points' own ``_guard``), on the first few digits, so the whole matrix stays fast.
"""
from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pandas as pd
import pytest

from faults import fail_write
from robustbench_pid.cli import evaluate_main, main

BASE = ["--model", "deit", "--attack", "pgd", "--eps", "2/255", "--steps", "2", "--limit", "16",
        "--chunk-size", "8", "--batch-size", "8", "--quiet"]


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def _status(out: Path) -> str:
    return json.loads((out / "run.json").read_text())["status"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A finished 4-unit run (clean and PGD, two chunks each) that tests copy and then damage."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert evaluate_main(BASE + ["--out", str(out)]) == 0
    assert _status(out) == "complete"
    return out


def _copy(base: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base, out)
    return out


def _unit(out: Path, attack: str, start: int = 0) -> Path:
    for j in sorted((out / "units").glob("*.json")):
        m = json.loads(j.read_text())
        if m["attack"] == attack and m["start"] == start:
            return j.with_suffix(".parquet")
    raise AssertionError(f"no {attack} unit at {start}")


def _unfinalize(out: Path) -> None:
    """The folder as a run leaves it just before finalize: units present, no tables, running."""
    info = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**info, "status": "running"}))
    (out / "summary.csv").unlink()
    (out / "records.parquet").unlink()


# --- 1. numerical health -------------------------------------------------------------------------------
def _nan_checkpoint(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    from robustbench_pid import load_model

    sd = {k: v.clone().contiguous() for k, v in load_model("deit").net.state_dict().items()}
    sd["blocks.1.mlp.fc1.weight"][0, 0] = float("nan")  # one weight: every output becomes NaN
    path = tmp_path / "nan.safetensors"
    save_file(sd, str(path))
    return path


def _attack_output(value: float):
    def perturb(self, model, x, y, bounds, generator):
        return x * 0 + value
    return perturb


@pytest.mark.parametrize("case", ["lambda_p_nan", "model_arg_inf", "nan_checkpoint", "attack_pass", "verdict_pass"])
def test_non_finite_numbers_stop_the_run(case, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = ["--model", "pid_deit", "--attack", "fgsm", "--eps", "2/255", "--limit", "8", "--quiet", "--out", str(out)]
    expect: List[str]
    if case == "lambda_p_nan":
        args += ["--lambda-p", "nan"]
        expect = ["lambda_p=nan must be finite", "--lambda-p"]
    elif case == "model_arg_inf":
        args += ["--model-arg", "drop_path_rate=inf"]
        expect = ["drop_path_rate=inf must be finite", "--model-arg drop_path_rate=VALUE"]
    elif case == "nan_checkpoint":
        args = ["--model", "deit", "--checkpoint", str(_nan_checkpoint(tmp_path))] + args[2:]
        expect = ["model 'deit' gave non-finite logits (NaN) for 8 of 8 samples in the clean pass",
                  "adversarial/clean", "Check the checkpoint"]
    elif case == "attack_pass":
        from robustbench_pid.attacks.fgsm import FGSM

        monkeypatch.setattr(FGSM, "perturb", _attack_output(float("nan")))
        expect = ["gave non-finite inputs (NaN) for", "attack pass", "adversarial/fgsm eps=2/255"]
    else:
        from robustbench_pid.attacks.fgsm import FGSM

        # finite inputs so large that the model overflows on them: caught in the verdict pass
        monkeypatch.setattr(FGSM, "perturb", _attack_output(3e38))
        expect = ["gave non-finite logits", "verdict pass", "adversarial/fgsm eps=2/255"]
    assert evaluate_main(args) == 2
    line = _one_error_line(capsys.readouterr().err)
    for e in expect:
        assert e in line, line
    if case in ("lambda_p_nan", "model_arg_inf"):
        assert not out.exists()  # refused before anything was written
    else:
        assert _status(out) == "running" and not (out / "summary.csv").exists()
        assert not (out / "records.parquet").exists()
        if case != "nan_checkpoint":  # the clean units before the failure were finished and kept
            assert _unit(out, "clean").is_file()


def _dead_model_checkpoint(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    from robustbench_pid import load_model

    sd = {k: v.clone().contiguous() for k, v in load_model("deit").net.state_dict().items()}
    sd["head.weight"].zero_()
    sd["head.bias"].zero_()
    path = tmp_path / "dead.safetensors"
    save_file(sd, str(path))
    return path


@pytest.mark.parametrize("finding", ["constant-predictions", "attack-moved-nothing"])
def test_broken_model_and_motionless_attack_are_findings(finding, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--model", "deit", "--checkpoint", str(_dead_model_checkpoint(tmp_path)), "--attack", "fgsm",
            "--eps", "4/255", "--limit", "16", "--quiet", "--out", str(out)]
    assert evaluate_main(args) == 0
    text = capsys.readouterr().out
    assert f"[error] {finding}:" in text
    if finding == "constant-predictions":
        assert "all 16 samples are predicted as class" in text
    else:
        rec = pd.read_parquet(out / "records.parquet")
        adv = rec[(rec.attack == "fgsm") & rec.attacked]
        assert len(adv) > 0 and (adv.pert_linf == 0).all()
        assert f"left all {len(adv)} attacked samples unchanged" in text


# --- 2. checksummed units ---------------------------------------------------------------------------------
def _tamper(parquet: Path, how: str) -> None:
    if how == "rewritten":  # a hand edit that decodes fine: every sample "robust"
        df = pd.read_parquet(parquet)
        df["correct_top1"] = True
        df.to_parquet(parquet, index=False)
    elif how == "bitflip":
        data = bytearray(parquet.read_bytes())
        data[len(data) // 2] ^= 0x10
        parquet.write_bytes(bytes(data))
    elif how == "no_checksum":  # a unit written before checksums existed
        meta = parquet.with_suffix(".json")
        m = json.loads(meta.read_text())
        del m["parquet_sha256"]
        meta.write_text(json.dumps(m))
    elif how == "garbage_json":
        parquet.with_suffix(".json").write_text("{not json")


@pytest.mark.parametrize("how,verb", [("rewritten", "resume"), ("bitflip", "resume"), ("garbage_json", "resume"),
                                      ("rewritten", "merge"), ("bitflip", "merge"), ("garbage_json", "merge"),
                                      ("no_checksum", "merge")])
def test_unit_checksums(how, verb, base_run, tmp_path, capsys):
    out = _copy(base_run, tmp_path)
    unit = _unit(out, "pgd", 8)
    _tamper(unit, how)
    want = pd.read_csv(base_run / "summary.csv")
    if verb == "resume":
        assert evaluate_main(BASE + ["--out", str(out)]) == 0
        err = capsys.readouterr().err
        assert "warning: " in err and "recomputing adversarial/pgd eps=2/255 samples [8:16]" in err
        assert str(unit.with_suffix(".json" if how == "garbage_json" else ".parquet")) in err
        assert _status(out) == "complete"
        pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), want)
        meta = json.loads(unit.with_suffix(".json").read_text())
        import hashlib
        assert hashlib.sha256(unit.read_bytes()).hexdigest() == meta["parquet_sha256"]
    elif how == "no_checksum":
        assert main(["merge", str(out), "--quiet"]) == 0
        err = capsys.readouterr().err
        assert "warning: 1 unit(s)" in err and "unverified" in err
        assert json.loads((out / "run.json").read_text())["units_unverified"] == 1
        pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), want)
    else:
        _unfinalize(out)
        assert main(["merge", str(out), "--quiet"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert str(unit if how != "garbage_json" else unit.with_suffix(".json")) in line
        assert "it was not used. Delete" in line and "re-run the evaluate command" in line
        assert _status(out) == "running" and not (out / "summary.csv").exists()


# --- 3. crash-safe finalize -------------------------------------------------------------------------------
@pytest.mark.parametrize("at", [1, 2, 3])
def test_finalize_never_complete_without_tables(at, base_run, tmp_path, capsys, monkeypatch):
    out = _copy(base_run, tmp_path)
    _unfinalize(out)
    written = fail_write(monkeypatch, at)
    assert main(["merge", str(out), "--quiet"]) == 2
    order = ["records.parquet", "summary.csv", "run.json"]
    assert written == order[:at]  # complete (run.json) is the last write of finalize
    line = _one_error_line(capsys.readouterr().err)
    assert f"no space left on the device (or quota exceeded) while writing {out / order[at - 1]}" in line
    assert _status(out) == "running"
    monkeypatch.undo()
    assert main(["merge", str(out), "--quiet"]) == 0
    assert _status(out) == "complete"
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), pd.read_csv(base_run / "summary.csv"))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "records.parquet"), pd.read_parquet(base_run / "records.parquet"))


# --- 4. one-line errors -----------------------------------------------------------------------------------
def _imagenet_o_tree(tmp_path: Path) -> List[str]:
    from test_imagenet_datasets import tree

    from robustbench_pid.core.imagenet_info import subset_wnids

    tree(tmp_path / "o", [subset_wnids("o")[0]], per=1)
    return ["--model", "timm:test_vit", "--dataset", "imagenet-o", "--data-root", str(tmp_path / "o")]


BAD_INPUT = {  # case -> (arguments, what the one error line must say, what it must not say)
    "unknown_model_arg": (["--model", "deit", "--model-arg", "bogus=1"],
                          ["has no architecture argument(s) 'bogus'", "valid --model-arg names:", "embed_dim"], []),
    "pid_gain_on_deit": (["--model", "deit", "--lambda-p", "0.5"],
                         ["is not a PID model", "(--lambda-p)", "use --model pid_deit"], []),
    "unknown_bench_opt": (["--model", "deit", "--bench-opt", "foo=1"],
                          ["unknown --bench-opt key(s) 'foo' for benchmark 'adversarial'", "takes no options"], []),
    "bench_opt_typo": (["--model", "deit", "--benchmark", "corruptions", "--bench-opt", "severity=[1]"],
                       ["unknown --bench-opt key(s) 'severity'", "valid: corruptions (", "severities ("], []),
    "severity_not_whole": (["--model", "deit", "--benchmark", "corruptions", "--bench-opt", "severities=[2.5]"],
                           ["--bench-opt severities=[2.5] for benchmark 'corruptions': expected a non-empty list of whole "
                            "numbers >= 1"], []),
    "n_images_true": (["--model", "deit", "--benchmark", "rank-collapse", "--bench-opt", "n_images=true"],
                      ["--bench-opt n_images=True for benchmark 'rank-collapse': expected a whole number >= 1"], []),
    "pid_gain_true": (["--model", "pid_deit", "--model-arg", "lambda_p=true"],
                      ["architecture argument lambda_p=True must be a number; fix --model-arg lambda_p=NUMBER"], []),
    "pid_gain_text": (["--model", "pid_deit", "--model-arg", "lambda_p=fast"],
                      ["architecture argument lambda_p='fast' must be a number"], ["TypeError"]),
    "pgd_steps_0": (["--model", "deit", "--attack", "pgd", "--steps", "0"],
                    ["attack 'pgd': steps must be >= 1, got 0", "repeat clean accuracy"], []),
    "negative_step_size": (["--model", "deit", "--attack", "pgd", "--step-size", "-0.1"],
                           ["step size (--step-size) '-0.1' must be a finite number >= 0"], ["eps"]),
    "zero_step_size": (["--model", "deit", "--attack", "pgd", "--step-size", "0"],
                       ["setting 'step_size' must be a positive number (> 0), got 0 (--step-size)"], []),
    "negative_step_size_factor": (["--model", "deit", "--attack", "pgd", "--param", "step_size_factor=-1"],
                                  ["setting 'step_size_factor' must be a positive number (> 0), got -1"],
                                  ["Optional[float]"]),
    "step_size_factor_text": (["--model", "deit", "--attack", "pgd", "--param", "step_size_factor=abc"],
                              ["setting 'step_size_factor' must be a finite number or none, got 'abc'"],
                              ["Optional[float]"]),
    "apgd_restarts_0": (["--model", "deit", "--attack", "apgd_ce", "--eps", "4/255", "--param", "restarts=0"],
                        ["attack 'apgd_ce': restarts must be >= 1, got 0", "repeat clean accuracy",
                         "--param restarts=N"], ["--steps"]),
    "apgd_t_targets_0": (["--model", "deit", "--attack", "apgd_t", "--eps", "4/255", "--param", "targets=0"],
                         ["attack 'apgd_t': targets must be >= 1, got 0"], []),
    "apgd_rho_out_of_range": (["--model", "deit", "--attack", "apgd_ce", "--eps", "4/255", "--param", "rho=7"],
                              ["rho (APGD's step-size checkpoint share) must be in (0, 1), got 7"], []),
    "pgd_two_step_sizes": (["--model", "deit", "--attack", "pgd", "--step-size", "0.001", "--param",
                            "step_size_factor=5"], ["step_size and step_size_factor both given", "give one"], []),
    "empty_pth": (["--model", "deit", "--checkpoint", "{tmp}/empty.pth"], ["empty.pth is not a checkpoint: it is an empty file (0 bytes)", "Download the file again"], []),
    "checkpoint_is_dir": (["--model", "deit", "--checkpoint", "{tmp}/ckdir"],
                          ["ckdir is a directory, not a checkpoint file", "ckdir/w.safetensors"], ["not found"]),
    "imagenet_o_without_root": (None, ["imagenet-o needs the ImageNet validation set too", "--imagenet-root DIR"], []),
    # options a dataset does not take are refused, not silently ignored (digits: arrays in memory)
    "skip_unreadable_on_digits": (["--model", "deit", "--skip-unreadable"],
                                  ["dataset 'digits' does not take --skip-unreadable", "no image files", "drop it"], []),
    "subset_on_digits": (["--model", "deit", "--subset", "10"],
                         ["dataset 'digits' does not take --subset", "use --limit N"], []),
    "imagenet_root_on_digits": (["--model", "deit", "--imagenet-root", "{tmp}"],
                                ["dataset 'digits' does not take --imagenet-root", "only imagenet-o and imagenet-c"], []),
    "data_root_on_digits": (["--model", "deit", "--data-root", "{tmp}"],
                            ["dataset 'digits' is built in and reads no --data-root; drop it"], []),
    "split_digits_lacks": (["--model", "deit", "--split", "val"],
                           ["dataset 'digits' has no split 'val'; valid splits: test, train"], []),
    # a second review's rows: settings that were accepted and silently changed or dropped
    "converge_benchmark_by_name": (["--model", "pid_deit", "--benchmark", "converge", "--protocol", "paper"],
                                   ["benchmark 'converge' is the convergence ladder", "--converge"], []),
    "suite_with_eps": (["--model", "deit", "--suite", "smoke", "--eps", "4/255"],
                       ["--eps with --suite smoke", "give --attack NAME"], []),
    "suite_param_typo": (["--model", "deit", "--suite", "smoke", "--param", "typo=3"],
                         ["--param typo: no attack of suite smoke takes it"], []),
    "param_eps": (["--model", "deit", "--attack", "pgd", "--param", "eps=8/255"],
                  ["--param eps=...: the eps grid is --eps"], []),
    "steps_twice": (["--model", "deit", "--attack", "pgd", "--eps", "4/255", "--steps", "10", "--param", "steps=5"],
                    ["--steps given twice"], []),
    "step_size_pixels": (["--model", "deit", "--attack", "pgd", "--eps", "4/255", "--step-size", "4"],
                         ["step_size 4 exceeds 1", "did you mean 4/255?"], []),
    "eps_whole_range": (["--model", "deit", "--attack", "fgsm", "--eps", "1"],
                        ["eps 1 spans the whole pixel range", "did you mean 1/255?"], []),
    "eps_negative_parts": (["--model", "deit", "--attack", "fgsm", "--eps", "-4/-255"],
                           ["eps '-4/-255' must be a finite number >= 0"], []),
    "empty_severities": (["--model", "deit", "--benchmark", "corruptions", "--bench-opt", "severities=[]"],
                         ["--bench-opt severities=[]", "a non-empty list"], []),
}


def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch):
    """`--out ""` was read as the current folder and a complete run landed there."""
    monkeypatch.chdir(tmp_path)
    assert evaluate_main(["--model", "deit", "--attack", "fgsm", "--eps", "4/255", "--limit", "4", "--quiet",
                          "--out", ""]) == 2
    assert "--out is empty" in _one_error_line(capsys.readouterr().err)
    assert main(["reproduce", "digits-smoke", "--model", "deit", "--limit", "4", "--out", " "]) == 2
    assert "--out is empty" in _one_error_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_one_error_line(case, tmp_path, capsys, monkeypatch):
    from robustbench_pid.data.imagenet import IMAGENET_ROOT_ENV

    monkeypatch.delenv(IMAGENET_ROOT_ENV, raising=False)
    (tmp_path / "empty.pth").write_bytes(b"")
    (tmp_path / "ckdir").mkdir()
    (tmp_path / "ckdir" / "w.safetensors").write_bytes(b"x")
    args, must, must_not = BAD_INPUT[case]
    args = _imagenet_o_tree(tmp_path) if args is None else [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = tmp_path / "run"
    size = ["--subset", "8"] if "imagenet-o" in args else ["--limit", "8"]  # --limit is refused there
    assert evaluate_main(args + [*size, "--quiet", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    for m in must:
        assert m in line, line
    for m in must_not:
        assert m not in line, line
    assert not (out / "run.json").exists()  # refused before the run folder was started


@pytest.mark.parametrize("err,says", [(errno.ENOSPC, "no space left on the device"),
                                      (errno.EDQUOT, "no space left on the device (or quota exceeded)"),
                                      (errno.EACCES, "permission denied while writing"),
                                      (errno.EROFS, "permission denied while writing")])
def test_disk_full_or_permission_lost_mid_run(err, says, tmp_path, capsys, monkeypatch, base_run):
    out = tmp_path / "run"
    fail_write(monkeypatch, 2, err=err, only=".parquet")  # the second unit's records
    assert evaluate_main(BASE + ["--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert says in line and "units/" in line and ".parquet" in line
    assert "re-run the same command: finished work units are kept" in line
    assert _status(out) == "running" and not (out / "summary.csv").exists()
    assert len(list((out / "units").glob("*.parquet"))) == 1
    assert not list((out / "units").glob(".*.tmp"))  # no temp file left behind
    monkeypatch.undo()
    assert evaluate_main(BASE + ["--out", str(out)]) == 0
    assert _status(out) == "complete"
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), pd.read_csv(base_run / "summary.csv"))


def test_unknown_bench_opt_refused_through_the_api(tmp_path):
    from robustbench_pid.errors import UserError
    from robustbench_pid.run.runner import run
    from robustbench_pid.specs import RunSpec

    with pytest.raises(UserError, match="unknown --bench-opt key.*'n_image'.*valid: n_images"):
        run(RunSpec(model="deit", benchmark="rank-collapse", limit=4, out=tmp_path / "r", quiet=True,
                    benchmark_options={"rank_collapse": {"n_image": 3}}))


# --- 5. what shrank n -------------------------------------------------------------------------------------
def test_skipped_images_in_terminal_summary_csv_and_report(tmp_path, capsys):
    from test_imagenet_datasets import WN, tree

    from robustbench_pid.results.report.html import build_report

    root = tree(tmp_path / "val", [WN[0], WN[1]], per=3, size=(40, 40))
    bad = root / WN[1] / "img_2.JPEG"
    bad.write_bytes(bad.read_bytes()[:50])  # truncated
    out = tmp_path / "run"
    assert evaluate_main(["--model", "timm:test_vit", "--dataset", "imagenet", "--split", "val", "--data-root",
                          str(root), "--skip-unreadable", "--attack", "fgsm", "--eps", "1/255", "--quiet",
                          "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "note: 1 unreadable image(s) were skipped (--skip-unreadable)" in text
    s = pd.read_csv(out / "summary.csv")
    assert list(s.columns).index("n_skipped") == list(s.columns).index("n") + 1
    assert (s["n_skipped"] == 1).all() and (s.loc[s.metric == "top1", "n"] == 5).all()
    page = build_report(out, n_boot=100)
    assert "Unreadable images were skipped (--skip-unreadable)" in page and "1 image(s) skipped" in page
    assert "<th>skipped</th>" in page


def test_no_skipped_column_where_nothing_can_be_skipped(base_run):
    assert "n_skipped" not in pd.read_csv(base_run / "summary.csv").columns


# --- 6. dead shards ---------------------------------------------------------------------------------------
def _shards(out: Path) -> List[str]:
    return sorted(s["status"] for s in json.loads((out / "run.json").read_text())["shards"])


@pytest.mark.parametrize("how", ["keyboard_interrupt", "pid_dead"])
def test_dead_shard_is_marked_in_final_run_json(how, base_run, tmp_path, capsys, monkeypatch):
    from robustbench_pid.run import runner

    if how == "keyboard_interrupt":
        out = tmp_path / "run"
        real, calls = runner._compute_records, []

        def stop_at_second(ctx, bench, u):
            calls.append(u.key)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(ctx, bench, u)

        monkeypatch.setattr(runner, "_compute_records", stop_at_second)
        assert evaluate_main(BASE + ["--out", str(out)]) == 130
        (shard,) = [json.loads(p.read_text()) for p in (out / "shards").glob("*.json")]
        assert shard["status"] == "interrupted" and "KeyboardInterrupt" in shard["error"]
        monkeypatch.undo()
        assert evaluate_main(BASE + ["--out", str(out)]) == 0
        assert _shards(out) == ["done", "interrupted"]
    else:  # a process killed with -9 cannot write anything: finalize sees its pid is gone
        out = _copy(base_run, tmp_path)
        _unfinalize(out)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        entry = {**json.loads(next((out / "shards").glob("*.json")).read_text()), "status": "running",
                 "pid": gone.pid, "pid_start": None}
        (out / "shards" / "0-of-1_dead.json").write_text(json.dumps(entry))
        assert main(["merge", str(out), "--quiet"]) == 0
        assert _shards(out) == ["died", "done"]
    capsys.readouterr()


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, "interrupted"), (signal.SIGKILL, "died")])
def test_killed_evaluate_process_leaves_no_running_shard(sig, status, tmp_path):
    import os

    out = tmp_path / "run"
    args = ["--model", "deit", "--attack", "pgd", "--eps", "2/255", "--steps", "20", "--limit", "160",
            "--chunk-size", "8", "--batch-size", "8", "--quiet", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "robustbench_pid", "evaluate", *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not list((out / "units").glob("*.parquet")) and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert p.returncode == 130 and "interrupted: finished work units are kept" in err
    (shard,) = [json.loads(q.read_text()) for q in (out / "shards").glob("*.json")]
    assert shard["status"] == ("interrupted" if sig == signal.SIGTERM else "running")
    n_kept = len(list((out / "units").glob("*.parquet")))
    assert n_kept >= 1
    assert evaluate_main(args) == 0  # resumes, computes the rest, finalizes
    assert _shards(out) == sorted(["done", status])


@pytest.mark.parametrize("args", [["table", "{run}", "--n-boot", "0"], ["report", "{run}", "-o", "{tmp}/r.html",
                                                                      "--n-boot", "1"]])
def test_n_boot_too_small_for_an_interval_is_one_error_line(args, base_run, tmp_path, capsys):
    """0 resamples crashed deep in the bootstrap; 1 gave an "interval" of one value: refused where it enters."""
    argv = [a.replace("{run}", str(base_run)).replace("{tmp}", str(tmp_path)) for a in args]
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--n-boot must be a whole number >= 100" in line
    assert not (tmp_path / "r.html").exists()


def test_subset_below_one_refused_by_the_checks_every_row_passes_before_its_folder():
    """reproduce turns --limit N into --subset N on ImageNet-C/-O rows and checks every row with check_arguments
    before it writes the study folder: a subset of 0 must fail there, not deep in the dataset after the folder."""
    import dataclasses

    from robustbench_pid.errors import UserError
    from robustbench_pid.run.context import check_arguments
    from robustbench_pid.run.spec_builder import build_spec

    spec = build_spec("deit", attack="fgsm", eps="2/255", limit=4)
    check_arguments(spec)
    with pytest.raises(UserError, match=r"--subset must be >= 1 \(reproduce's --limit on ImageNet-C/-O rows"):
        check_arguments(dataclasses.replace(spec, subset=0))

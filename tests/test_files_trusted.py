"""Issue 23, the files half: files a reader trusts are verified, writes stay where they belong, a run
folder holds one configuration, plots and the worst-case row keep settings apart, output paths of
the wrong kind are one error line, and the README says what CI and its commands do.

Runs are in-process (the console entry points' own ``_guard``) on the first 16 digits.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import List

import pandas as pd
import pytest

from robustbench_pid.cli import evaluate_main, main
from robustbench_pid.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--model", "deit", "--attack", "fgsm", "--attack", "pgd", "--eps", "2/255,4/255",
        "--limit", "16", "--chunk-size", "8", "--batch-size", "8", "--quiet"]


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A complete run (clean, FGSM and PGD-20 at 2/255 and 4/255, two chunks each)."""
    out = tmp_path_factory.mktemp("trusted") / "run"
    assert evaluate_main(BASE + ["--out", str(out)]) == 0
    return out


@pytest.fixture
def run_copy(base_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    return out


def _flip_bit(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


# --- item 5: records.parquet and summary.csv carry their sha256 in run.json ------------------------------
def test_run_json_records_the_sha256_of_both_files(base_run: Path) -> None:
    import hashlib

    info = json.loads((base_run / "run.json").read_text())
    for name in ("records.parquet", "summary.csv"):
        assert info["files_sha256"][name] == hashlib.sha256((base_run / name).read_bytes()).hexdigest()


@pytest.mark.parametrize("argv", [
    ["table", "{run}", "--layout", "long"],
    ["check", "{run}", "--baseline", str(ROOT / "results" / "baselines" / "smoke-digits.csv")],
    ["plot", "{run}", "--out", "{tmp}/plots"],
    ["report", "{run}", "-o", "{tmp}/report.html", "--n-boot", "100"],
])
def test_a_flipped_bit_in_records_is_refused_by_every_reader(run_copy: Path, tmp_path: Path, argv: List[str],
                                                            capsys) -> None:
    _flip_bit(run_copy / "records.parquet")
    assert main([a.format(run=run_copy, tmp=tmp_path) for a in argv]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{run_copy / 'records.parquet'} does not match the sha256 recorded in run.json" in line
    assert f"`robustbench-pid merge {run_copy}`" in line
    assert not (tmp_path / "plots").exists() and not (tmp_path / "report.html").exists()


def test_load_records_and_load_results_refuse_it_and_merge_rebuilds_it(run_copy: Path, capsys) -> None:
    import robustbench_pid as rbp

    good = pd.read_parquet(run_copy / "records.parquet")
    _flip_bit(run_copy / "records.parquet")
    for load in (rbp.load_records, rbp.load_results):
        with pytest.raises(UserError, match="does not match the sha256 recorded in run.json"):
            load(run_copy)
    with pytest.raises(UserError, match="records.parquet does not match"):
        rbp.load_results(run_copy.parent)  # a folder of runs: a damaged run is refused, not skipped
    assert main(["merge", str(run_copy), "--quiet"]) == 0
    rebuilt = pd.read_parquet(run_copy / "records.parquet")
    pd.testing.assert_frame_equal(rebuilt, good)


def test_a_flipped_bit_in_summary_csv_is_refused_and_merge_rebuilds_it(run_copy: Path, base_run: Path,
                                                                       capsys) -> None:
    summary = run_copy / "summary.csv"
    good = summary.read_bytes()
    _flip_bit(summary)
    for argv in (["table", str(summary), "--layout", "long"],
                 ["check", str(base_run), "--baseline", str(summary)],
                 ["table", str(run_copy)]):
        assert main(argv) == 2, argv
        line = _one_error_line(capsys.readouterr().err)
        assert f"{summary} does not match the sha256 recorded in run.json" in line
        assert f"`robustbench-pid merge {run_copy}`" in line
    assert main(["merge", str(run_copy), "--quiet"]) == 0
    assert summary.read_bytes() == good
    assert main(["table", str(run_copy), "--layout", "long"]) == 0


def test_a_run_written_before_the_checksums_is_read_with_a_warning(run_copy: Path, capsys) -> None:
    import robustbench_pid as rbp

    info = json.loads((run_copy / "run.json").read_text())
    del info["files_sha256"]
    (run_copy / "run.json").write_text(json.dumps(info))
    assert len(rbp.load_records(run_copy)) == 16 * 5
    err = capsys.readouterr().err
    assert "run.json has no checksums of records.parquet, summary.csv" in err and "used unverified" in err
    assert f"robustbench-pid merge {run_copy}" in err
    assert main(["merge", str(run_copy), "--quiet"]) == 0  # merge adds them
    assert "files_sha256" in json.loads((run_copy / "run.json").read_text())


# --- item 6: labels that become part of a path are sanitised ---------------------------------------------
def test_a_dataset_label_cannot_write_outside_results(tmp_path: Path, monkeypatch) -> None:
    import torch

    import robustbench_pid as rbp

    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    x, y = torch.rand(8, 3, 8, 8), torch.arange(8) % 10
    before = {p for p in tmp_path.rglob("*")}
    df = rbp.evaluate(model=net, data=(x, y), dataset="x/../../../../escape", attack="fgsm", eps="2/255",
                      quiet=True)
    written = {p for p in tmp_path.rglob("*")} - before
    assert written and all(work / "results" in p.parents or p == work / "results" for p in written), \
        sorted(map(str, written))
    run_dir = Path(df.attrs["run_dir"])
    assert run_dir.parent == (work / "results").resolve()
    assert run_dir.name.startswith("Sequential_x-..-..-..-..-escape_fgsm_")


def test_safe_label() -> None:
    from robustbench_pid.results.files.run_files import safe_label

    assert safe_label("x/../../escape") == "x-..-..-escape"
    assert safe_label("../up") == "-up"
    assert safe_label("timm:resnet18") == "timm-resnet18"
    assert safe_label("..") == "-"


# --- item 7: check --update writes only a baseline and its own sidecar --------------------------------------
def test_check_update_refuses_to_write_into_a_run_folder(run_copy: Path, capsys) -> None:
    summary = (run_copy / "summary.csv").read_bytes()
    assert main(["check", str(run_copy), "--baseline", str(run_copy / "summary.csv"), "--update"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"refusing to write the baseline {run_copy / 'summary.csv'} into the run folder {run_copy}" in line
    assert (run_copy / "summary.csv").read_bytes() == summary
    assert not (run_copy / "summary.samples.parquet").exists()


def test_check_update_never_overwrites_an_unrelated_samples_parquet(base_run: Path, tmp_path: Path, capsys) -> None:
    mine = tmp_path / "base.samples.parquet"
    pd.DataFrame({"patient": [1, 2], "score": [0.5, 0.7]}).to_parquet(mine)
    data = mine.read_bytes()
    assert main(["check", str(base_run), "--baseline", str(tmp_path / "base.csv"), "--update"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"refusing to overwrite {mine}: it is not the per-sample sidecar of a baseline" in line
    assert mine.read_bytes() == data and not (tmp_path / "base.csv").exists()
    mine.unlink()
    assert main(["check", str(base_run), "--baseline", str(tmp_path / "base.csv"), "--update"]) == 0
    assert main(["check", str(base_run), "--baseline", str(tmp_path / "base.csv"), "--update"]) == 0  # its own
    notes = tmp_path / "notes.csv"
    notes.write_text("a,b\n1,2\n")
    assert main(["check", str(base_run), "--baseline", str(notes), "--update"]) == 2
    assert f"refusing to overwrite {notes}" in _one_error_line(capsys.readouterr().err)
    assert notes.read_text() == "a,b\n1,2\n"


# --- item 8: a run folder holds one configuration -------------------------------------------------------
@pytest.mark.parametrize("change, what", [
    (["--seed", "1"], "seed: 0 -> 1"),
    (["--limit", "8"], "limit: 16 -> 8"),
    (["--eps", "2/255"], "attacks/eps: fgsm 2/255,fgsm 4/255,pgd 2/255,pgd 4/255 -> fgsm 2/255,pgd 2/255"),
    (["--suite", "smoke"], "suite: None -> smoke"),
])
def test_another_configuration_is_refused(run_copy: Path, change: List[str], what: str, capsys) -> None:
    summary = (run_copy / "summary.csv").read_bytes()
    argv = list(BASE)
    for flag in change[::2]:
        i = argv.index(flag) if flag in argv else None
        if i is not None:
            del argv[i:i + 2]
    if change[0] == "--suite":
        for flag in ("--attack", "--attack", "--eps"):
            i = argv.index(flag)
            del argv[i:i + 2]
    assert evaluate_main(argv + change + ["--out", str(run_copy)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{run_copy} holds a run of another configuration (" in line and what in line
    assert "pass another --out" in line and f"rm -r {run_copy}" in line and "re-run its own command" in line
    assert (run_copy / "summary.csv").read_bytes() == summary
    assert json.loads((run_copy / "run.json").read_text())["status"] == "complete"


def test_the_same_command_still_resumes(run_copy: Path) -> None:
    (run_copy / "records.parquet").unlink()
    for j in sorted((run_copy / "units").glob("*.json"))[:2]:
        j.unlink()
    assert evaluate_main(BASE + ["--out", str(run_copy)]) == 0
    assert json.loads((run_copy / "run.json").read_text())["status"] == "complete"


# --- item 9: plots and the worst-case row keep settings apart ---------------------------------------------
@pytest.fixture(scope="module")
def two_settings(base_run: Path, tmp_path_factory) -> List[Path]:
    other = tmp_path_factory.mktemp("steps3") / "run"
    argv = [a for a in BASE] + ["--steps", "3"]
    i = argv.index("fgsm")
    del argv[i - 1:i + 1]
    assert evaluate_main(argv + ["--out", str(other)]) == 0
    return [base_run, other]


def test_eps_curves_of_different_settings_are_separate_lines(two_settings: List[Path]) -> None:
    from robustbench_pid.results.inputs import load_inputs
    from robustbench_pid.results.report.plots import plot_eps_curves

    fig = plot_eps_curves(load_inputs(two_settings))
    pgd = next(ax for ax in fig.axes if ax.get_title() == "PGD")
    labels = sorted(line.get_label() for line in pgd.get_lines())
    assert labels == ["deit · steps 20", "deit · steps 3"]
    fgsm = next(ax for ax in fig.axes if ax.get_title() == "FGSM")
    assert [line.get_label() for line in fgsm.get_lines()] == ["deit"]


def test_the_worst_case_row_names_what_it_combines_and_shows_their_rows(base_run: Path) -> None:
    from robustbench_pid.results.tables.layouts import paper_tables

    t = paper_tables(base_run, eps="pgd=2/255,fgsm=2/255")[0].frame
    attack_rows = [a for a in t["Attack"] if a]
    wc = next(a for a in attack_rows if a.startswith("Worst case"))
    assert wc == "Worst case (4/255) over FGSM + PGD-20"
    below = attack_rows[attack_rows.index(wc) + 1:]
    assert below == ["↳ FGSM at 4/255", "↳ PGD-20 (step 2.5·eps/20, random start, early stop top-5) at 4/255"]
    # at the eps the PGD row shows, nothing is repeated
    t = paper_tables(base_run, eps="4/255")[0].frame
    rows = [a for a in t["Attack"] if a]
    assert rows[-1] == "Worst case (4/255) over FGSM + PGD-20" and not any(a.startswith("↳") for a in rows)


# --- item 10: duplicate conditions, a non-UTF-8 suite, output paths of the wrong kind -----------------------
@pytest.mark.parametrize("extra", [["--eps", "2/255,2/255"], ["--attack", "pgd", "--eps", "2/255"]])
def test_duplicate_conditions_are_evaluated_once_with_a_note(tmp_path: Path, extra: List[str], capsys) -> None:
    argv = ["--model", "deit", "--attack", "pgd", "--steps", "2", "--limit", "8", "--batch-size", "8",
            "--quiet", "--out", str(tmp_path / "run"), *extra]
    assert evaluate_main(argv) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "planned the same work unit twice" not in err
    notes = [ln for ln in err.splitlines() if ln.startswith("note:")]
    assert notes == ["note: pgd eps 2/255: listed more than once with the same settings; evaluated once"]
    rec = pd.read_parquet(tmp_path / "run" / "records.parquet")
    assert len(rec[rec["attack"] == "pgd"]) == 8


def test_a_suite_listing_an_eps_twice_is_evaluated_once(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "dup.toml"
    suite.write_text('[[attack]]\nname = "pgd"\neps = ["2/255", "2/255"]\nsteps = 2\n')
    assert evaluate_main(["--model", "deit", "--suite", str(suite), "--limit", "8", "--quiet",
                          "--out", str(tmp_path / "run")]) == 0
    assert "note: pgd eps 2/255: listed more than once" in capsys.readouterr().err


def test_a_non_utf8_suite_is_one_error_line(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "latin1.toml"
    suite.write_bytes('description = "caf\xe9"\n[[attack]]\nname = "pgd"\n'.encode("latin-1"))
    assert evaluate_main(["--model", "deit", "--suite", str(suite), "--limit", "8", "--out",
                          str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{suite}: not a UTF-8 text file" in line and "save it as UTF-8" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, message", [
    (["report", "{run}", "-o", "{dir}", "--n-boot", "100"], "output {dir} is a folder, but a file is written there: "
                                                          "give a file name, e.g. {dir}/report.html"),
    (["table", "{run}", "-o", "{dir}"], "output {dir} is a folder, but a file is written there"),
    (["plot", "{run}", "--out", "{file}"], "output {file} is a file, but a folder is written there"),
    (["report", "{run}", "-o", "{file}/r.html"], "cannot write {file}/r.html: {file} is a file, not a folder"),
    (["plot", "{run}", "--out", "{file}/plots"], "cannot create the folder {file}/plots: {file} is a file"),
])
def test_output_paths_of_the_wrong_kind_are_one_error_line_without_debris(base_run: Path, tmp_path: Path,
                                                                        argv: List[str], message: str,
                                                                        capsys) -> None:
    d, f = tmp_path / "d", tmp_path / "f.txt"
    d.mkdir()
    f.write_text("keep")
    fmt = dict(run=base_run, dir=d, file=f)
    assert main([a.format(**fmt) for a in argv]) == 2
    assert message.format(**fmt) in _one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d", "f.txt"] and f.read_text() == "keep"


def test_a_failed_report_write_leaves_no_tmp(base_run: Path, tmp_path: Path, monkeypatch) -> None:
    import errno

    from robustbench_pid.results.files import run_files

    def full(tmp, data, durable):
        Path(tmp).write_bytes(data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_files, "_write_file", full)
    assert main(["report", str(base_run), "-o", str(tmp_path / "r.html"), "--n-boot", "100"]) == 2
    assert list(tmp_path.iterdir()) == []


# --- item 13: the plot title fits, README says what .ci/run does and where outputs go ------------------
def test_the_single_panel_title_fits_in_the_figure(base_run: Path) -> None:
    from robustbench_pid.results.report.plots import plot_eps_curves

    fig = plot_eps_curves(base_run, attacks=["pgd"])
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 1
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
    assert "95% Wilson interval" in fig._suptitle.get_text()


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_readme_describes_ci_run_step_by_step() -> None:
    readme = _words((ROOT / "README.md").read_text())
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert any("apt-get install" in s and "chromium" in s for s in steps)
    assert "installs `chromium` with apt-get when it runs as root and chromium is missing" in readme
    assert any("--upgrade pip" in s for s in steps) and "upgrades pip in it" in readme
    assert any(s.endswith('pip install -q -e ".[test,robustbench]"') for s in steps)
    assert 'runs the first command\'s install part (`pip install -e ".[test,robustbench]"`, not its `evaluate`' in readme
    assert any(s.endswith("python -m pytest -n auto -q -p no:cacheprovider") for s in steps)
    assert "command as `.venv/bin/python -m pytest -n auto -q -p no:cacheprovider`" in readme
    assert "does exactly these two steps" not in readme
    assert not any("evaluate" in s for s in steps)  # README says it skips the evaluate


def test_readme_commands_write_only_under_results() -> None:
    from test_readme import readme_commands

    outs = []
    for cmd in readme_commands():
        argv = cmd.split()
        outs += [argv[i + 1] for i, a in enumerate(argv) if a in ("--out", "-o", "--output")]
    assert len(outs) >= 4 and all(o.startswith("results/") for o in outs), outs
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "results/*" in ignored


# --- item 12: documented numbers come from docs/generate_numbers.py and still reproduce ---------------------
def _numbers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "docs" / "generate_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["doc_numbers"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_every_generated_block_equals_what_the_script_renders_from_the_committed_runs() -> None:
    numbers = _numbers()
    for b in numbers.BLOCKS:
        text = (ROOT / b.doc).read_text()
        assert numbers.current_block(text, b.id), f"{b.doc} has no block {b.id}"
        for name in b.runs:
            info = json.loads((numbers.RUNS_DIR / name / "run.json").read_text())
            assert info["status"] == "complete" and info["files_sha256"], name
            assert info["spec"]["chunk_size"] == 40 and name in numbers.RUNS
    assert numbers.stale_blocks() == []


def test_the_script_notices_a_hand_edited_number(tmp_path: Path, monkeypatch) -> None:
    numbers = _numbers()
    for doc in {b.doc for b in numbers.BLOCKS}:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    monkeypatch.setattr(numbers, "ROOT", tmp_path)
    sweep = tmp_path / "docs" / "results.md"
    body = numbers.current_block(sweep.read_text(), "results-sweep")
    first = re.search(r"\| \d+\.\d\d \|", body).group(0)
    sweep.write_text(sweep.read_text().replace(body, body.replace(first, "| 12.34 |", 1)))
    assert numbers.stale_blocks() == ["docs/results.md: block results-sweep"]
    assert numbers.write_blocks() == ["docs/results.md"] and numbers.stale_blocks() == []


SLICES = [  # (reference run, evaluate arguments of a 40-image slice of it: the same first work unit)
    ("pid_deit-fgsm-pgd", ["--model", "pid_deit", "--attack", "pgd", "--eps", "2/255,6/255"]),
    ("deit-eps-sweep-paper", ["--model", "deit", "--protocol", "paper", "--attack", "pgd", "--eps", "6/255",
                              "--steps", "20", "--param", "step_size_factor=0.15"]),
]


@pytest.mark.parametrize("name, argv", SLICES, ids=[s[0] for s in SLICES])
def test_a_slice_of_the_reference_runs_reproduces_record_for_record(name: str, argv: List[str],
                                                                    tmp_path: Path) -> None:
    """The first 40 images of a reference run are one work unit (--chunk-size 40): a fresh 40-image
    run of the same condition draws the same seed and must give the same records (the verdicts exactly, the
    perturbation norms up to float rounding). A change to the
    RNG, the scheduling or an attack that moves any documented number fails here. On the CPU whatever the
    machine has: the reference runs were made there, and a GPU differs by rounding (docs/devices.md)."""
    assert evaluate_main([*argv, "--limit", "40", "--chunk-size", "40", "--device", "cpu", "--quiet",
                          "--out", str(tmp_path / "r")]) == 0
    fresh = pd.read_parquet(tmp_path / "r" / "records.parquet")
    ref = pd.read_parquet(_numbers().RUNS_DIR / name / "records.parquet")
    key = ["attack", "eps", "settings_id", "sample_id"]
    cols = ["pred", "correct_top1", "correct_top5", "clean_pred", "attacked", "pert_linf", "pert_l2"]
    fresh = fresh[fresh["attack"] != "clean"]
    both = fresh[key + cols].merge(ref[key + cols], on=key, suffixes=("", "_ref"))
    assert len(both) == len(fresh) == 40 * fresh["eps"].nunique()
    for c in cols:
        if c.startswith("pert_"):  # a float sum: another CPU family (AVX-512 or not) adds in another order
            assert (both[c] - both[f"{c}_ref"]).abs().max() <= 1e-5, (name, c)
        else:
            assert (both[c] == both[f"{c}_ref"]).all(), (name, c)


def test_the_shipped_checkpoints_clean_accuracy_is_the_reference_runs_and_the_docs() -> None:
    """README and docs/models.md quote the manifest's clean top-1 of the shipped checkpoints; the
    reference runs measure it again (all 360 test images)."""
    from robustbench_pid.hub.checkpoints import read_manifest

    numbers = _numbers()
    readme = (ROOT / "README.md").read_text()
    models_md = (ROOT / "docs" / "models.md").read_text()
    for name, entry in read_manifest().items():
        model = entry["model"]
        if model not in numbers.MODELS:  # the other aliases: tests/test_embedded_zoo.py and the claims reference run
            continue
        clean = pd.read_csv(numbers.RUNS_DIR / f"{model}-fgsm-pgd" / "summary.csv")
        clean = clean[(clean["attack"] == "clean") & (clean["metric"] == "top1")]["value"].iloc[0]
        assert f"{clean:.2f}" == f"{100 * entry['clean_test_top1']:.2f}", name
        assert f"sha256 {entry['sha256'][:12]}  {100 * entry['clean_test_top1']:.2f}% clean test top-1" in models_md
    shipped = 100 * read_manifest()["pid_deit_digits"]["clean_test_top1"]
    assert f"differs from the shipped files' (`pid_deit`: {shipped:.2f}%)" in readme


def test_a_condition_listed_twice_is_no_difference_between_configurations() -> None:
    """The plan evaluates a repeated condition once, so the refusal names only what really differs."""
    from robustbench_pid.run.one_config import spec_differences

    pgd = {"attack": "pgd", "params": {"eps": 4 / 255, "steps": 20}}
    twice = {"seed": 0, "attacks": [pgd, dict(pgd)]}
    assert spec_differences(twice, {"seed": 0, "attacks": [pgd]}) == []
    assert spec_differences(twice, {"seed": 1, "attacks": [pgd]}) == ["seed: 0 -> 1"]
    other = {"attack": "pgd", "params": {"eps": 2 / 255, "steps": 20}}
    assert spec_differences(twice, {"seed": 0, "attacks": [other]}) == ["attacks/eps: pgd 4/255 -> pgd 2/255"]


def test_attention_and_trace_files_are_checksummed_and_verified(tmp_path, capsys) -> None:
    """--analyze attention and --trace write more files a reader trusts: their sha256 goes into run.json beside
    records.parquet's, load_attention refuses a changed attention.parquet, and merge rebuilds both."""
    import robustbench_pid as rbp
    from robustbench_pid.cli import main
    from robustbench_pid.errors import UserError
    from robustbench_pid.results.report.attention import load_attention
    from robustbench_pid.results.files.verify import verify_run_files

    run = tmp_path / "r"
    rbp.evaluate("pid_deit", attack="pgd", eps="4/255", steps=2, limit=8, out=run, analyze="attention", trace=True)
    recorded = json.loads((run / "run.json").read_text())["files_sha256"]
    assert {"records.parquet", "summary.csv", "attention.parquet", "trace.parquet"} <= set(recorded)
    before = {n: (run / n).read_bytes() for n in ("attention.parquet", "trace.parquet")}
    for name in before:  # one flipped bit in each, one at a time: each is named
        data = bytearray(before[name])
        data[len(data) // 2] ^= 1
        (run / name).write_bytes(bytes(data))
        with pytest.raises(UserError, match=rf"{name} does not match the sha256 recorded in run.json"):
            load_attention(run)
        with pytest.raises(UserError, match=rf"{name} does not match"):
            verify_run_files(run)
    assert main(["merge", str(run)]) == 0
    assert {n: (run / n).read_bytes() for n in before} == before
    assert len(load_attention(run))


@pytest.mark.parametrize("text", ["[]", '"complete"', '{"status": "comp', "\xff\xfe"])
def test_a_run_json_that_is_no_object_is_one_error_line_and_rerunning_fixes_it(run_copy, capsys, text):
    """A damaged or hand-edited run.json (a list, a string, torn) was an AttributeError/JSON traceback in every
    reader; the fix the error names (the same command again) writes it again from the finished units."""
    (run_copy / "run.json").write_text(text, encoding="latin-1")
    for argv in (["table", str(run_copy)], ["check", str(run_copy), "--baseline", str(run_copy.parent / "b.csv"),
                                            "--update"]):
        assert main(argv) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"{run_copy / 'run.json'} is damaged (not a JSON object" in line and "same --out" in line
    assert evaluate_main(BASE + ["--out", str(run_copy)]) == 0
    assert main(["table", str(run_copy)]) == 0

"""Records -> tidy results without the model code: attack metadata stamped into records and rows,
summaries of every benchmark kind with torch never imported, and the incomplete-run policy."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from robustbench_pid.attacks import get_attack, make_attack
from robustbench_pid.results.conditions import META_COLUMNS, add_identity
from robustbench_pid.errors import UserError
from robustbench_pid.results.store import TIDY_COLUMNS, load_records, load_runs, summarize
from robustbench_pid.run.runner import run
from robustbench_pid.specs import AttackSpec, RunSpec

REPO = Path(__file__).resolve().parents[1]
EPS = 8 / 255
IDS = dict(run_id="r", model="m", checkpoint_sha256="abc", dataset="digits", split="test", protocol="standard")


@pytest.fixture(scope="module")
def adv_run(tmp_path_factory) -> Path:
    attacks = [AttackSpec("fgsm", make_attack("fgsm", eps=EPS).params()),
               AttackSpec("pgd", make_attack("pgd", eps=EPS, steps=3).params()),
               AttackSpec("spsa", make_attack("spsa", eps=EPS, iterations=2, n_samples=4).params())]
    out = tmp_path_factory.mktemp("meta") / "runs" / "deit-adv"
    return run(RunSpec(model="deit", attacks=attacks, limit=12, batch_size=12, out=out, quiet=True, device="cpu"))


def _expected(attack: str) -> dict:
    if attack == "clean":
        return {"attack_label": "Clean", "norm": "", "white_box": False, "worst_case": False, "paper_eps": math.nan}
    cls = get_attack(attack)
    paper = getattr(cls, "paper_eps", None)
    return {"attack_label": cls.label, "norm": cls.norm, "white_box": cls.uses_gradients, "worst_case": True,
            "paper_eps": math.nan if paper is None else float(paper)}


def _meta_of(df: pd.DataFrame, attack: str) -> dict:
    rows = df[df["attack"] == attack][list(META_COLUMNS)].drop_duplicates()
    assert len(rows) == 1, rows
    return rows.iloc[0].to_dict()


def _same(a: dict, b: dict) -> bool:
    return all((isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


def test_records_and_tidy_rows_carry_attack_metadata(adv_run: Path):
    rec = pd.read_parquet(adv_run / "records.parquet")  # as the runner wrote it
    assert set(META_COLUMNS) <= set(rec.columns)
    labels = {"clean": "Clean", "fgsm": "FGSM", "pgd": "PGD", "spsa": "SPSA"}
    for attack, label in labels.items():
        m = _meta_of(rec, attack)
        assert m["attack_label"] == label and _same(m, _expected(attack)), (attack, m)
    assert not _meta_of(rec, "spsa")["white_box"] and _meta_of(rec, "pgd")["white_box"]

    for tidy in (pd.read_csv(adv_run / "summary.csv", keep_default_na=False, na_values=[""]), summarize(rec)):
        assert set(META_COLUMNS) <= set(tidy.columns) and set(META_COLUMNS) <= set(TIDY_COLUMNS)
        for attack in labels:
            m = _meta_of(tidy[tidy["metric"] == "top1"], attack)
            m["norm"] = "" if isinstance(m["norm"], float) else m["norm"]  # csv: an empty norm reads as NaN
            assert _same({k: (bool(v) if k in ("white_box", "worst_case") else v) for k, v in m.items()},
                         _expected(attack)), (attack, m)
        wc = tidy[(tidy["attack"] == "worst-case") & (tidy["metric"] == "top1")]
        assert len(wc) == 1 and wc["over"].iloc[0] == "fgsm+pgd+spsa"
        w = wc.iloc[0]
        assert w["attack_label"] == "Worst case" and w["norm"] == "linf"
        assert bool(w["white_box"]) and bool(w["worst_case"])
        papers = [_expected(a)["paper_eps"] for a in ("fgsm", "pgd", "spsa")]
        if all(math.isnan(p) for p in papers):
            assert math.isnan(float(w["paper_eps"]))
        else:
            assert float(w["paper_eps"]) in papers


def test_old_records_get_the_metadata_derived(adv_run: Path, tmp_path: Path):
    new = load_records(adv_run)
    for drop in (list(META_COLUMNS), list(META_COLUMNS) + ["settings_id", "setting", "settings"]):
        old = tmp_path / f"old-{len(drop)}"
        shutil.copytree(adv_run, old)
        pd.read_parquet(adv_run / "records.parquet").drop(columns=drop).to_parquet(old / "records.parquet")
        info = json.loads((old / "run.json").read_text())
        info.pop("files_sha256")  # an old run: written before run files carried checksums (verify.py)
        (old / "run.json").write_text(json.dumps(info))
        got = load_records(old)
        for attack in ("clean", "fgsm", "pgd", "spsa"):
            assert _same(_meta_of(got, attack), _meta_of(new, attack))
        pd.testing.assert_frame_equal(summarize(got), summarize(new))


# ----------------------------------------------------------------------------------- torch-free

def _kind_records() -> dict:
    """Records of every benchmark kind, with identity and metadata as the runner writes them."""
    from test_benchmarks_imagenet import _fake_corruption_records
    from robustbench_pid.core.imagenet_info import CORRUPTIONS_15

    rng = np.random.default_rng(0)
    errs = {c: [0.1 * (s + 1) for s in range(5)] for c in CORRUPTIONS_15}
    corr = pd.concat([_fake_corruption_records("base", "digits", {c: [0.5] * 5 for c in CORRUPTIONS_15}, 0.2),
                      _fake_corruption_records("m", "digits", errs, 0.1)], ignore_index=True)
    inet_c = _fake_corruption_records("m", "imagenet-c", errs, 0.1).assign(benchmark="imagenet_c",
                                                                           skipped_unreadable=2)
    n = 30
    ood = pd.DataFrame({**IDS, "dataset": "imagenet-o", "benchmark": "ood", "eps": 0.0, "params": "{}",
                        "attack": ["ood" if i % 3 == 0 else "in" for i in range(n)],
                        "ood": [i % 3 == 0 for i in range(n)], "sample_id": [str(i) for i in range(n)],
                        "score": rng.normal(size=n) + np.array([1.0 if i % 3 == 0 else 0.0 for i in range(n)]),
                        "correct_top1": [i % 2 == 0 for i in range(n)], "correct_top5": True,
                        "skipped_unreadable": 1})
    restricted = pd.DataFrame({**IDS, "dataset": "imagenet-a", "benchmark": "restricted", "attack": "clean",
                               "eps": 0.0, "params": "{}", "sample_id": [str(i) for i in range(n)],
                               "correct_top1": [i % 4 == 0 for i in range(n)], "correct_top5": [i % 2 == 0 for i in range(n)],
                               "skipped_unreadable": 0})
    rank = pd.DataFrame([{**IDS, "benchmark": "rank-collapse", "attack": "clean", "eps": 0.0, "params": "{}",
                          "sample_id": str(i), "layer": layer, "metric": "token_cosine",
                          "value": 0.1 * layer + 0.01 * i} for i in range(5) for layer in range(3)])
    return {k: add_identity(v) for k, v in {"corruptions": corr, "imagenet_c": inet_c, "ood": ood,
                                            "restricted": restricted, "rank-collapse": rank}.items()}


TORCH_FREE = r"""
import pathlib, sys, types
import pandas as pd

root = pathlib.Path(sys.argv[1])
pkg = types.ModuleType("robustbench_pid")  # the package without its __init__ (which loads the models)
pkg.__path__ = [str(root / "robustbench_pid")]
sys.modules["robustbench_pid"] = pkg
from robustbench_pid.results.report.diagnostics import diagnose
from robustbench_pid.results.store import summarize

out = pathlib.Path(sys.argv[2])
for f in sorted(out.glob("*.records.parquet")):
    rec = pd.read_parquet(f)
    summarize(rec, ce_baseline="base").to_pickle(str(f).replace(".records.parquet", ".tidy.pkl"))
    if f.name.startswith("adversarial"):
        pd.to_pickle([x.code for x in diagnose(rec)], out / "findings.pkl")
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "timm", "robustbench_pid.")))
print("\n".join(loaded))
"""


def test_summaries_of_every_benchmark_kind_never_import_torch(adv_run: Path, tmp_path: Path):
    from robustbench_pid.results.report.diagnostics import diagnose

    kinds = {"adversarial": pd.read_parquet(adv_run / "records.parquet"), **_kind_records()}
    for name, rec in kinds.items():
        rec.to_parquet(tmp_path / f"{name}.records.parquet")
    p = subprocess.run([sys.executable, "-c", TORCH_FREE, str(REPO), str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    loaded = set(p.stdout.split())
    assert "torch" not in loaded and not any(m.startswith(("torch.", "timm")) for m in loaded), sorted(loaded)
    assert not any(m.startswith(("robustbench_pid.benchmarks", "robustbench_pid.attacks", "robustbench_pid.models"))
                   for m in loaded), sorted(loaded)
    assert {"robustbench_pid.results.summaries.adversarial", "robustbench_pid.results.summaries.corruptions"} <= loaded
    for name, rec in kinds.items():
        got = pd.read_pickle(tmp_path / f"{name}.tidy.pkl")
        pd.testing.assert_frame_equal(got, summarize(rec, ce_baseline="base"))
        assert set(META_COLUMNS) <= set(got.columns) and got["attack_label"].notna().all()
    metrics = {name: set(pd.read_pickle(tmp_path / f"{name}.tidy.pkl")["metric"]) for name in kinds}
    assert {"top1", "top5"} <= metrics["adversarial"]
    assert {"mce", "relative_mce", "ce_fog", "mean_err"} <= metrics["corruptions"]  # normalized by "base"
    assert {"mce", "skipped_unreadable"} <= metrics["imagenet_c"]  # AlexNet
    assert {"aupr", "auroc", "fpr95", "chance_aupr", "top1"} <= metrics["ood"]
    assert {"top1", "top5", "skipped_unreadable"} <= metrics["restricted"]
    assert metrics["rank-collapse"] == {"token_cosine"}
    assert pd.read_pickle(tmp_path / "findings.pkl") == [f.code for f in diagnose(kinds["adversarial"])]
    # derived rows carry the metadata of a benchmark condition
    mce = pd.read_pickle(tmp_path / "corruptions.tidy.pkl").query("metric == 'mce'").iloc[0]
    assert mce["attack_label"] == "corruptions" and mce["norm"] == "" and not mce["white_box"]
    assert math.isnan(mce["paper_eps"])


def test_the_environment_does_not_change_the_ce_baseline(monkeypatch):
    rec = _kind_records()["corruptions"]
    monkeypatch.setenv("ROBUSTBENCH_PID_CE_BASELINE", "base")
    assert "mce" not in set(summarize(rec)["metric"])
    assert "mce" in set(summarize(rec, ce_baseline="base")["metric"])


# ----------------------------------------------------------------------------------- incomplete runs

def _set_status(run_dir: Path, status: str) -> None:
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**info, "status": status}))


def test_incomplete_run_policy(adv_run: Path, tmp_path: Path):
    root = tmp_path / "store"
    done, partial = root / "done", root / "partial"
    shutil.copytree(adv_run, done)
    shutil.copytree(adv_run, partial)
    _set_status(partial, "running")

    # a run folder named on its own: refused, with the folder and the fix
    with pytest.raises(UserError, match=r"partial: run is not complete \(status 'running'\).*merge"):
        load_records(partial)
    assert len(load_records(partial, include_incomplete=True)) == len(load_records(done))

    # a folder of runs: the complete ones are read, the others named in notes (and a warning)
    loaded = load_runs(root)
    assert [r["path"] for r in loaded.runs] == [str(done)]
    assert len(loaded.notes) == 1 and str(partial) in loaded.notes[0] and "running" in loaded.notes[0]
    with pytest.warns(UserWarning, match="skipped incomplete run .*partial"):
        rec = load_records(root)
    assert len(rec) == len(load_records(done)) and rec.attrs["notes"] == loaded.notes

    # nothing complete left: an error that lists what was skipped
    _set_status(done, "running")
    with pytest.raises(UserError, match=r"no complete runs under .*store(.|\n)*partial"):
        load_records(root)
    with pytest.raises(UserError, match="results path not found"):
        load_records(tmp_path / "absent")


def test_rows_concatenated_from_older_results_get_their_metadata(adv_run: Path):
    from robustbench_pid.results.conditions import with_attack_meta

    new = summarize(load_records(adv_run))
    old = new.drop(columns=list(META_COLUMNS))
    both = with_attack_meta(pd.concat([old, new], ignore_index=True))
    pgd = both[both["attack"] == "pgd"]
    assert len(pgd) == 2 * len(new[new["attack"] == "pgd"])
    assert set(pgd["attack_label"]) == {"PGD"} and set(pgd["norm"]) == {"linf"} and pgd["white_box"].all()
    wc = both[(both["attack"] == "worst-case") & (both["metric"] == "top1")]
    assert len(wc) == 2 and set(wc["attack_label"]) == {"Worst case"} and set(wc["norm"]) == {"linf"}
    assert wc["white_box"].all() and wc["worst_case"].all()
    assert with_attack_meta(new) is new  # complete: untouched, nothing derived


def test_worst_case_needs_the_clean_verdict_and_counts_a_missing_verdict_as_wrong():
    """Paper-protocol attack verdicts do not include the clean one: samples 2 and 3 are misclassified clean but
    "correct" on their perturbed tensors. The worst case over FGSM + PGD must not count them (it would read 75%
    above a clean 50%), and sample 1's missing PGD verdict is no evidence of robustness."""
    from robustbench_pid.results.summaries.adversarial import worst_case_records

    clean = [True, True, False, False]
    verdicts = {"fgsm": [True, True, True, True], "pgd": [True, None, True, True]}
    recs = pd.DataFrame([dict(model="m", dataset="d", protocol="paper", benchmark="adversarial", attack=a,
                              eps=3 / 255, sample_id=str(i), correct_top1=v, correct_top5=True,
                              clean_correct_top1=clean[i], clean_correct_top5=True, settings_id=a, setting=a,
                              precision="fp32", norm="linf", worst_case=True, white_box=True, attack_label=a,
                              paper_eps=3 / 255)
                         for a, vs in verdicts.items() for i, v in enumerate(vs)])
    w = worst_case_records(recs).set_index("sample_id")
    assert w["correct_top1"].to_dict() == {"0": True, "1": False, "2": False, "3": False}
    assert w["correct_top5"].all()


def test_overlapping_inputs_count_each_record_once_and_conflicting_copies_are_refused(adv_run: Path, tmp_path: Path):
    """A run folder given with its own records.parquet, or a folder and a run inside it, must not double n and
    narrow the intervals; two copies of one record that disagree are refused."""
    from robustbench_pid.results.inputs import load_inputs

    def fgsm(inp):
        t = inp.rows
        return t[(t["attack"] == "fgsm") & (t["metric"] == "top1")].iloc[0]

    once = load_inputs([adv_run])
    for paths in ([adv_run, adv_run], [adv_run, adv_run / "records.parquet"], [adv_run.parent, adv_run]):
        twice = load_inputs(paths)
        a, b = fgsm(once), fgsm(twice)
        assert (b["n"], b["value"], b["ci_low"], b["ci_high"]) == (a["n"], a["value"], a["ci_low"], a["ci_high"]) == \
            (12, a["value"], a["ci_low"], a["ci_high"])
        assert any("given more than once" in n for n in twice.notes)
        assert len(twice.records) == len(once.records)
    other = pd.read_parquet(adv_run / "records.parquet")
    i = other.index[other["attack"] == "fgsm"][0]
    other.loc[i, "correct_top1"] = not bool(other.loc[i, "correct_top1"])
    other.to_parquet(tmp_path / "other.parquet")
    with pytest.raises(UserError, match="different records of one sample and condition.*pass each run once"):
        load_inputs([adv_run, tmp_path / "other.parquet"])


def test_run_folders_named_alike_are_told_apart_by_their_path(adv_run: Path, tmp_path: Path):
    """A run's id is its folder's name: a study's standard/pgd-4 and converged/pgd-4 share it, and grouped by it
    their samples were counted together (n doubled). Read from a folder above them, each keeps its own n."""
    from robustbench_pid.results.inputs import load_inputs

    for sub in ("standard", "converged"):
        shutil.copytree(adv_run, tmp_path / "study" / sub / "deit-adv")
    loaded = load_runs(tmp_path / "study")
    assert sorted({r["run_id"] for r in loaded.runs}) == ["converged/deit-adv", "standard/deit-adv"]
    assert any("told apart by its path" in n for n in loaded.notes)
    rows = load_inputs([tmp_path / "study"]).rows
    fgsm = rows[(rows["attack"] == "fgsm") & (rows["metric"] == "top1")]
    assert sorted(fgsm["run_id"]) == ["converged/deit-adv", "standard/deit-adv"] and set(fgsm["n"]) == {12}


def test_a_run_copied_to_another_folder_and_resumed_is_one_run(tmp_path: Path):
    """Units finished under the old folder name carried its run id, so the resumed run's condition split in two
    (n=4 + 4); the run is the folder it is finalized in."""
    from robustbench_pid.results.inputs import load_inputs

    spec = dict(model="deit", attacks=[AttackSpec("fgsm", make_attack("fgsm", eps=EPS).params())], limit=8,
                batch_size=4, chunk_size=4, quiet=True, device="cpu")
    run(RunSpec(out=tmp_path / "old", **spec))
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    units = sorted((tmp_path / "new" / "units").glob("*.parquet"))
    for p in units[:2]:  # as if the copy was taken mid-run
        p.with_suffix(".json").unlink()
        p.unlink()
    (tmp_path / "new" / "summary.csv").unlink()
    run(RunSpec(out=tmp_path / "new", **spec))
    rows = load_inputs(tmp_path / "new").rows
    fgsm = rows[(rows["attack"] == "fgsm") & (rows["metric"] == "top1")]
    assert list(fgsm["run_id"]) == ["new"] and list(fgsm["n"]) == [8]

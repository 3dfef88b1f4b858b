"""Every zoo alias runs out of the box on the embedded default: its weights ship in checkpoints/ with a
manifest entry (recipe, clean top-1 on all 360 test digits, versions, train seconds) that a fresh
evaluation of the file confirms, and all of them together stay under 15 MB."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from robustbench_pid.hub.checkpoints import read_manifest
from robustbench_pid.cli import main
from robustbench_pid.loaders import sha256_file
from robustbench_pid.models.zoo import zoo
from robustbench_pid.train import embedded_name, recipe_for

ROOT = Path(__file__).resolve().parents[1]
ALIASES = zoo.names()
# trained before the recipe pinned threads; their files are referenced by committed baselines and runs
PREDATE_PINNING = {"deit", "pid_deit"}


def test_every_alias_has_a_manifest_entry_whose_file_matches() -> None:
    man = read_manifest()
    total = 0
    for alias in ALIASES:
        entry = man[embedded_name(alias)]
        path = ROOT / "checkpoints" / entry["file"]
        assert entry["model"] == alias and entry["dataset"] == "digits"
        assert sha256_file(path) == entry["sha256"], alias
        assert entry["split"]["n_test"] == 360 and entry["train_seconds"] > 0
        assert set(entry["versions"]) >= {"torch", "timm", "scikit-learn", "robustbench_pid", "python"}
        assert entry["clean_test_top1"] >= 0.95 or entry.get("below_95_reason"), alias
        if alias not in PREDATE_PINNING:
            assert entry["recipe"] == recipe_for(alias).as_dict(), alias
            assert entry["recipe_is_pinned"] is True and entry["split"]["n_train"] == 1437
        total += path.stat().st_size
    assert total < 15e6


def test_the_shipped_deit_pair_is_unchanged() -> None:
    """Committed baselines and reference runs name these two files by their sha256."""
    man = read_manifest()
    assert man["deit_digits"]["sha256"].startswith("efee7ca68bbb")
    assert man["pid_deit_digits"]["sha256"].startswith("2fc9a9059390")


def test_each_files_clean_top1_on_all_360_test_digits_is_its_manifest_record() -> None:
    from robustbench_pid import load_dataset, load_model

    ds = load_dataset("digits", "test")
    man = read_manifest()
    for alias in ALIASES:
        model = load_model(alias)  # the embedded default: no --checkpoint
        with torch.inference_mode():
            top1 = (model(ds.images).argmax(1) == ds.labels).double().mean().item()
        assert abs(top1 - man[embedded_name(alias)]["clean_test_top1"]) < 1e-6, alias
        assert model.info["checkpoint_sha256"] == man[embedded_name(alias)]["sha256"]


@pytest.mark.parametrize("alias", ALIASES)
def test_evaluate_pgd_runs_out_of_the_box(alias: str, tmp_path: Path) -> None:
    out = tmp_path / alias
    assert main(["evaluate", "--model", alias, "--attack", "pgd", "--eps", "4/255", "--steps", "3", "--limit", "6",
                 "--quiet", "--device", "cpu", "--out", str(out)]) == 0
    s = pd.read_csv(out / "summary.csv")
    pgd = s[(s["attack"] == "pgd") & (s["metric"] == "top1")]
    assert len(pgd) == 1 and int(pgd["n"].iloc[0]) == 6
    assert s["checkpoint_sha256"].iloc[0] == read_manifest()[embedded_name(alias)]["sha256"]


def test_docs_quote_the_manifest_and_the_claims_reference_run_measured_the_same_files() -> None:
    """README / docs/models.md / docs/claims.md blocks are docs/generate_zoo.py's rendering; the reference run's
    clean row used each embedded file (sha256) and measured its manifest clean top-1 on all 360 digits."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_zoo", ROOT / "docs" / "generate_zoo.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.stale_blocks() == []
    man = read_manifest()
    ran = sorted(p.name.split("@")[0] for p in gen.CLAIMS_RUN.glob("*@*"))
    assert {"deit", "pid_deit", "symvit", "rpc_symvit", "rpc_symvit_all"} <= set(ran)  # docs/claims.md says which ran
    for alias in ran:
        (clean,) = gen.CLAIMS_RUN.glob(f"{alias}@*/paper/clean/summary.csv")
        s = pd.read_csv(clean)
        s = s[(s["attack"] == "clean") & (s["metric"] == "top1")].iloc[0]
        assert int(s["n"]) == 360 and s["checkpoint_sha256"] == man[embedded_name(alias)]["sha256"], alias
        assert f"{s['value']:.4f}" == f"{100 * man[embedded_name(alias)]['clean_test_top1']:.4f}", alias


def _generate_zoo():
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_zoo", ROOT / "docs" / "generate_zoo.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_the_reference_run_has_a_converged_value_for_every_model_at_its_converged_rows() -> None:
    """Every column of claims-digits has the --converge ladder's value at CONVERGED_ROWS on all 360 digits,
    from the embedded file, with a status; the doc's per-claim sentences quote those runs. A zoo model no claim
    compares (cnn_at) is no column: the converge grid (docs/attacks.md) measures it instead."""
    from robustbench_pid.studies.spec import load_study

    gen = _generate_zoo()
    man = read_manifest()
    text = (ROOT / "docs" / "claims.md").read_text()
    columns = sorted({c.model for c in load_study("claims-digits").columns})
    assert set(ALIASES) - set(columns) == {"cnn_at"} and set(columns) <= set(ALIASES)
    for alias in columns:
        for row in gen.CONVERGED_ROWS:
            (run,) = gen.CLAIMS_RUN.glob(f"{alias}@*/converged/{row}")
            r = pd.read_parquet(run / "records.parquet")
            c = r[r["attack"] == "converge"]
            assert len(c) == 360 and c["sample_id"].is_unique, alias
            assert r["checkpoint_sha256"].iloc[0] == man[embedded_name(alias)]["sha256"], alias
            status = gen.ladder_status(alias, row)
            assert status.removesuffix(" (earlier ladder)") in ("converged", "not converged",
                                                                "upper bound: gradients unavailable"), alias
            # the converged value is at or below the row's own attack (rung 0) on every sample
            assert (c["correct_top1"].astype(bool) <= c["rung0_correct_top1"].astype(bool)).all(), alias
    assert text.count("Under the converged evaluation at 4/255") == 9  # one per claim pair


def test_what_a_converged_evaluation_makes_of_a_paper_protocol_gain() -> None:
    """survival(): holds / shrinks / vanishes / reverses against the paper protocol's significant gain, and
    'no paper gain' with the converged verdict otherwise (hand-made cells)."""
    from robustbench_pid.studies.pairs import PairCell

    gen = _generate_zoo()

    def cell(diff: float, p: float) -> PairCell:
        return PairCell("c", "s", "A", "B", "pgd-4", "PGD-20 4/255", "x", 360, 50.0, 50.0 + diff, diff, diff - 3,
                        diff + 3, 0, 0, p)

    paper = cell(8.0, 0.001)
    assert gen.survival(paper, cell(10.0, 1e-5)) == "holds"
    assert gen.survival(paper, cell(8.0, 0.01)) == "holds"
    assert gen.survival(paper, cell(4.0, 0.01)) == "shrinks"
    assert gen.survival(paper, cell(4.0, 0.2)) == "vanishes"
    assert gen.survival(paper, cell(-4.0, 0.01)) == "reverses"
    assert gen.survival(cell(2.0, 0.3), cell(-5.0, 0.01)) == "no paper gain; converged: loss"
    assert gen.survival(cell(-2.0, 0.01), cell(3.0, 0.01)) == "no paper gain; converged: gain"
    assert gen.survival(None, cell(1.0, 0.5)) == "no paper gain; converged: none"

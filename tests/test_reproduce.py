"""``reproduce``: PIDformer Table 1 end to end on generated trees in the five ImageNet layouts (tiny seeded
JPEGs, a 1-block 32-px random DeiT / PID DeiT), with the paper beside; resume; --shard + merge = one process;
missing datasets reported at the start; the digits study offline."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from robustbench_pid.cli import main
from robustbench_pid.core.imagenet_info import CORRUPTIONS_15, subset_wnids
from robustbench_pid.errors import UserError
from robustbench_pid.studies.spec import load_study

from test_imagenet_datasets import tree  # noqa: E402

TINY = ["--model-arg", "img_size=32", "--model-arg", "depth=1",
        "--model-arg", 'pretrained_cfg_overlay={"input_size": [3, 32, 32]}']
ARCH = {"deit": "deit_tiny_patch16_224", "pid_deit": "pid_deit_tiny_patch16_224"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """imagenet/val (the 200 IN-O classes, one image each), imagenet-a, -r, -c (15 x 5, the same 2 images as
    val), -o (40 images: 1:5 against val, as published), and random 1-block 32-px checkpoints."""
    from safetensors.torch import save_file

    from robustbench_pid.models.zoo import build_model

    root = tmp_path_factory.mktemp("datasets")
    o = subset_wnids("o")
    tree(root / "imagenet" / "val", list(o), per=1, size=(40, 36))
    tree(root / "imagenet-a", [subset_wnids("a")[0], subset_wnids("a")[50]], per=3, ext=".jpg", size=(40, 36))
    tree(root / "imagenet-r", [subset_wnids("r")[0], subset_wnids("r")[70]], per=3, ext=".jpg", size=(40, 36))
    tree(root / "imagenet-o", [o[0], o[100]], per=20, size=(40, 36))
    for c in CORRUPTIONS_15:
        for s in range(1, 6):
            tree(root / "imagenet-c" / c / str(s), [o[0], o[1]], per=1, size=(224, 224))  # as every IN-C file
    for model, arch in ARCH.items():
        torch.manual_seed(0)
        net = build_model(arch, num_classes=1000, img_size=32, depth=1)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(root / f"{model}.safetensors"))
    return root


def _cmd(data, model, out, *extra):
    return ["reproduce", "pidformer-table1", "--model", model, "--checkpoint", str(data / f"{model}.safetensors"),
            *TINY, "--data-root", str(data), "--out", str(out), "--limit", "8", "--quiet", "--device", "cpu",
            "--batch-size", "64", *extra]


def _unit_mtimes(folder: Path):
    return {p: p.stat().st_mtime_ns for p in folder.rglob("units/*.parquet")}


def test_table1_both_models_resume_and_shards(data, tmp_path, capsys):
    study = load_study("pidformer-table1")
    one = tmp_path / "one"
    assert main(_cmd(data, "pid_deit", one)) == 0
    # deit "killed halfway": two rows done, then the full command resumes them without recomputing
    assert main(_cmd(data, "deit", one, "--only", "clean", "--only", "fgsm")) == 0
    half = capsys.readouterr().out
    missing = [ln for ln in half.splitlines() if "not run (or not finished)" in ln]
    assert len(missing) == 1 and "deit as 'Softmax DeiT', paper protocol: row(s) pgd, spsa" in missing[0]
    before = _unit_mtimes(one / "deit@Softmax-DeiT")
    assert len(before) == 3  # clean (+ clean of the fgsm run) and fgsm: one chunk each
    assert main(_cmd(data, "deit", one)) == 0
    out = capsys.readouterr().out
    after = _unit_mtimes(one / "deit@Softmax-DeiT")
    assert all(after[p] == t for p, t in before.items()) and len(after) > len(before)
    # the printed table: every row of the paper in its order, published beside measured, both models
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    labels = [ln.split("|")[1].strip() for ln in lines[1:] if ln.split("|")[1].strip()]
    assert labels == [r.label for r in study.rows]
    assert "Softmax DeiT (deit, paper): paper" in lines[0] and "PID DeiT (pid_deit, paper): paper" in lines[0]
    clean = next(ln for ln in lines if ln.startswith("| Clean | Top-1"))
    assert "| 73.13 |" in clean and "| 72.17 |" in clean  # each model's published value beside its own run
    assert "| 68.41 |" in out and "| 71.20 |" in out
    table = pd.read_csv(one / "table.csv")
    assert len(table) == 2 * sum(len(r.metrics) for r in study.rows)
    assert table.value.notna().all() and (table.n > 0).all()
    row = table[(table.row == "fgsm") & (table.metric == "top1") & (table.model == "pid_deit")].iloc[0]
    assert row.paper == 38.52 and row["diff"] == pytest.approx(row.value - 38.52, abs=1e-5)
    summary = pd.read_csv(one / "pid_deit@PID-DeiT" / "paper" / "fgsm" / "summary.csv")
    s = summary[(summary.attack == "fgsm") & (summary.metric == "top1")].iloc[0]
    assert row.value == pytest.approx(s.value) and row.n == s.n and row.ci_low == pytest.approx(s.ci_low)
    assert row.outside == (not s.ci_low - 0.005 <= 38.52 <= s.ci_high + 0.005)
    assert {"table.md", "table.tex"} <= {p.name for p in one.iterdir()}
    boot = table[table.metric.isin(["mce", "aupr"])]  # bootstrap intervals from the records (none in summary.csv)
    assert boot.ci_low.notna().all() and (boot.ci_low <= boot.value + 1e-9).all()
    # --shard 0/2 + 1/2 + merge = one process (rows with several units each)
    rows = ["--only", "clean", "--only", "pgd", "--only", "imagenet-c", "--only", "imagenet-o"]
    sharded = tmp_path / "sharded"
    assert main(_cmd(data, "pid_deit", sharded, *rows, "--shard", "0/2", "--chunk-size", "4")) == 0
    assert "merge" in capsys.readouterr().out and not (sharded / "table.csv").exists()
    assert main(_cmd(data, "pid_deit", sharded, *rows, "--shard", "1/2", "--chunk-size", "4")) == 0
    assert main(["merge", str(sharded)]) == 0
    got = pd.read_csv(sharded / "table.csv")
    assert got[~got.row.isin(rows[1::2])].value.isna().all()  # rows not run: in the table, without a value
    got = got[got.row.isin(rows[1::2])]
    want = table[table.model == "pid_deit"].set_index(["row", "metric"]).loc[got.set_index(["row", "metric"]).index]
    cols = ["paper", "value", "ci_low", "ci_high", "n"]
    pd.testing.assert_frame_equal(got.set_index(["row", "metric"])[cols], want[cols], check_dtype=False)


def test_missing_datasets_reported_at_the_start(data, tmp_path, capsys):
    out = tmp_path / "m"
    code = main(_cmd(data, "pid_deit", out, "--dataset-root", "imagenet-c=" + str(tmp_path / "nowhere"),
                     "--only", "clean", "--only", "imagenet-c"))
    text = capsys.readouterr().out
    assert code == 0 and text.index("missing: row 'imagenet-c'") < text.index("| Clean")
    assert str(tmp_path / "nowhere") in text and "not run" in text
    assert main(_cmd(data, "vit", out, "--only", "clean")) == 2  # not a column, no --as
    assert "--as COLUMN" in capsys.readouterr().err
    assert main(["reproduce", "pidformer-table1", "--model", "pid_deit", "--data-root", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no row of study pidformer-table1 can run" in err
    assert str(tmp_path / "no" / "imagenet" / "val") in err and "imagenet-c" in err
    from robustbench_pid.studies.reproduce import resolve_column

    rpc = load_study("rpc-table1")  # rpc_symvit as it comes is the 6-iteration column; 4 and 5 need --as
    assert resolve_column(rpc, "rpc_symvit", None).name == "RPC-SymViT (6iter/layer1)"
    assert resolve_column(rpc, "rpc_symvit", "RPC-SymViT (4iter/layer1)").model_args == {"pap_iterations": 4}
    # --model-arg picks the column whose model it is: 4 iterations are not filed under the 6-iteration column
    assert resolve_column(rpc, "rpc_symvit", None, {"pap_iterations": 4}).name == "RPC-SymViT (4iter/layer1)"
    with pytest.raises(UserError, match="--model-arg pap_iterations=5 contradicts column 'RPC-SymViT \\(4iter"):
        resolve_column(rpc, "rpc_symvit", "RPC-SymViT (4iter/layer1)", {"pap_iterations": 5})
    with pytest.raises(UserError, match="pap_iterations=3 is no single column"):
        resolve_column(rpc, "rpc_symvit", None, {"pap_iterations": 3})


def test_all_columns_runs_every_column_and_refuses_one_file_for_separately_trained_ones(capsys):
    """rpc-table1's three rpc_symvit columns (4, 5, 6 iterations) are three trained models: --all-columns plans all
    of them, keyed by column, and refuses to load one file into all three."""
    base = ["reproduce", "rpc-table1", "--all-columns", "--dry-run", "--only", "clean", "--calibration", "100,50",
            "--checkpoint", "symvit=/x.pth", "--checkpoint", "rpc_symvit_all=/z.pth"]
    assert main(base + ["--checkpoint", "rpc_symvit=/y.pth"]) == 2
    err = capsys.readouterr().err
    assert "'RPC-SymViT (4iter/layer1)', 'RPC-SymViT (5iter/layer1)', 'RPC-SymViT (6iter/layer1)' are separately " \
           "trained models of 'rpc_symvit' but would all load /y.pth" in err
    from robustbench_pid.cli import reproduce as cli_reproduce

    class Args:
        all_columns, model, as_column, study = True, None, None, "rpc-table1"
        dry_run = True  # the mapping alone: a real run would also check these (absent) weight files
        checkpoint = ["symvit=/x.pth", "rpc_symvit_all=/z.pth", "RPC-SymViT (4iter/layer1)=/a.pth",
                      "RPC-SymViT (5iter/layer1)=/b.pth", "rpc_symvit=/y.pth"]

    assert cli_reproduce._checkpoints(Args) == [  # a column's own entry first, then its model's
        ("symvit", "SymViT (baseline)", "/x.pth"), ("rpc_symvit", "RPC-SymViT (4iter/layer1)", "/a.pth"),
        ("rpc_symvit", "RPC-SymViT (5iter/layer1)", "/b.pth"), ("rpc_symvit", "RPC-SymViT (6iter/layer1)", "/y.pth"),
        ("rpc_symvit_all", "RPC-SymViT (2iter/all-layer)", "/z.pth")]


def test_dry_run_prices_every_row_and_writes_nothing(data, tmp_path, capsys):
    """The dry run's passes are the ones docs/studies.md prices (``row_passes`` x images)."""
    from robustbench_pid.studies.dryrun import row_passes

    out = tmp_path / "dry"
    assert main(_cmd(data, "pid_deit", out, "--dry-run", "--calibration", "7882,3941")) == 0
    text = capsys.readouterr().out
    assert "total: about" in text and not out.exists()
    study = load_study("pidformer-table1")
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.split()[:1] and
             ln.split()[0] in {r.name for r in study.rows}}
    assert list(lines) == [r.name for r in study.rows]
    for r in study.rows:
        samples, fwd, fb = (float(lines[r.name][i]) for i in (2, 5, 6))
        images = samples / 76 if r.name == "imagenet-c" else samples  # IN-C: 75 conditions + clean per image
        assert (fwd, fb) == (images * row_passes(r)[0], images * row_passes(r)[1]), r.name


def test_digits_study_offline_with_as_and_both_protocols(tmp_path, capsys):
    out = tmp_path / "d"
    base = ["reproduce", "digits-smoke", "--limit", "16", "--quiet", "--device", "cpu", "--out", str(out),
            "--only", "clean", "--only", "fgsm-2"]
    assert main([*base, "--model", "pid_deit"]) == 0
    assert main([*base, "--model", "deit", "--as", "PID DeiT (digits)", "--protocol", "paper"]) == 0
    text = capsys.readouterr().out
    assert "PID DeiT (digits) (deit, paper): paper" in text and "PID DeiT (digits) (pid_deit, standard)" in text
    entries = sorted(json.loads(p.read_text())["model"] for p in out.glob("*/entry.json"))
    assert entries == ["deit", "pid_deit"]
    t = pd.read_csv(out / "table.csv")
    assert t[~t.row.isin(["clean", "fgsm-2"])].value.isna().all()  # the rows left out: listed, no value
    t = t[t.row.isin(["clean", "fgsm-2"])]
    assert set(zip(t.model, t.protocol)) == {("pid_deit", "standard"), ("deit", "paper")}
    assert (t.n == 16).all() and (t[t.row == "clean"].paper.tolist() == [99.72, 100.0] * 2)
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert "Digits smoke study" in (tmp_path / "r.html").read_text()


def test_bad_rows_and_a_folder_of_another_study_are_refused(tmp_path, capsys):
    out = tmp_path / "d"
    base = ["reproduce", "digits-smoke", "--model", "pid_deit", "--limit", "4", "--quiet", "--device", "cpu",
            "--out", str(out)]
    assert main([*base, "--only", "pgd-9"]) == 2
    err = capsys.readouterr().err
    assert "no row 'pgd-9'" in err and "fgsm-2" in err and not out.exists()  # refused before any work
    assert main([*base, "--only", "clean"]) == 0
    capsys.readouterr()
    other = tmp_path / "other.toml"
    other.write_text(load_study("digits-smoke").path.read_text().replace("Digits smoke study", "Another study"))
    assert main(["reproduce", str(other), *base[2:], "--only", "clean"]) == 2
    assert "holds another study" in capsys.readouterr().err


def test_a_cost_study_of_your_own_on_digits(tmp_path, capsys):
    """A study file of your own (a path): the cost benchmark as rows, parameters in millions beside a published value."""
    import robustbench_pid as rbp

    mine = tmp_path / "cost.toml"
    mine.write_text('''title = "cost"
source = "made up for the test"
protocol = "standard"
[[column]]
name = "DeiT"
model = "deit"
[[row]]
name = "params"
label = "Parameters"
dataset = "digits"
benchmark = "cost"
metrics = ["params_m", "flops_per_sample", "sec_per_sample_test"]
published."DeiT" = { params_m = 5.2, flops_per_sample = 1.0, sec_per_sample_test = 0.01 }
[[row]]
name = "macs"
label = "Multiply-adds"
dataset = "digits"
benchmark = "cost"
metrics = ["gmac_per_sample"]
note = "made-up unit note."
published."DeiT" = { gmac_per_sample = 0.01 }
''')
    out = tmp_path / "c"
    assert main(["reproduce", str(mine), "--model", "deit", "--limit", "8", "--batch-size", "8", "--quiet",
                 "--device", "cpu", "--out", str(out)]) == 0
    assert "| Parameters | Parameters (M) | 5.20 |" in capsys.readouterr().out
    t = pd.read_csv(out / "table.csv").set_index("metric")
    params = sum(p.numel() for p in rbp.load_model("deit").parameters())
    assert t.loc["params_m", "value"] == pytest.approx(params / 1e6, abs=1e-6) and t.loc["params_m", "n"] == 8
    assert t.loc["flops_per_sample", "value"] > 1e6 and t.loc["sec_per_sample_test", "value"] > 0
    # GMAC per image: the run's multiply-adds (half its FLOPs) in 10^9, beside the published value, the row's note
    summary = pd.read_csv(out / "deit@DeiT" / "standard" / "macs" / "summary.csv").set_index("metric")
    assert t.loc["gmac_per_sample", "value"] == pytest.approx(summary.loc["macs_per_sample", "value"] / 1e9, abs=1e-6)
    assert summary.loc["flops_per_sample", "value"] == 2 * summary.loc["macs_per_sample", "value"]
    assert summary.loc["macs_per_sample", "value_unit"] == "MAC" and t.loc["gmac_per_sample", "paper"] == 0.01
    assert "Multiply-adds: made-up unit note." in (out / "table.md").read_text()


def test_imagenet_c_error_matrix_pairs_conditions_by_image():
    """ImageNet-C sample ids carry their condition ("fog/3/<wnid>/<file>"): the mCE bootstrap pairs by image."""
    from robustbench_pid.results.tables.comparisons import corruption_error_matrix

    rows = [{"sample_id": f"{c}/{s}/n01/img_{i}.JPEG", "condition": f"{c}/{s}", "correct_top1": (i + s) % 2 == 0}
            for c in CORRUPTIONS_15 for s in range(1, 6) for i in range(3)]
    images, conditions, err = corruption_error_matrix(pd.DataFrame(rows))
    assert list(images) == [f"n01/img_{i}.JPEG" for i in range(3)] and len(conditions) == 75
    assert err.shape == (3, 75) and err[0, conditions.index("fog/1")] == 1.0 and err[1, conditions.index("fog/1")] == 0.0 == err[0, conditions.index("fog/2")]


@pytest.mark.parametrize("bad", [["--shard", "3/2"], ["--shard", "x"], ["--batch-size", "0"], ["--workers", "-1"]])
def test_a_refused_argument_leaves_no_study_folder_behind(tmp_path, capsys, bad):
    """Every argument is checked before study.toml and entry.json are written (issue 33)."""
    out = tmp_path / "study"
    assert main(["reproduce", "digits-smoke", "--model", "deit", "--limit", "4", "--quiet", "--out", str(out),
                 *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("eps,says", [("true", "must be one number or 'a/b' text"),
                                      ("[1, 2]", "must be one number or 'a/b' text")])
def test_a_study_eps_that_is_no_number_is_refused_naming_the_row(tmp_path, eps, says):
    from robustbench_pid.studies.spec import check_names, parse_study

    src = (Path(__file__).resolve().parents[1] / "robustbench_pid" / "studies" / "digits-smoke.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(src.replace('eps = "2/255" }', f"eps = {eps} }}", 1))
    with pytest.raises(UserError, match=f"row 'fgsm-2': attack eps .*{re.escape(says)}"):
        check_names(parse_study(p))
    p.write_text(src, encoding="utf-16")  # as some editors save it
    with pytest.raises(UserError, match="not UTF-8 text.*save it as UTF-8"):
        parse_study(p)



@pytest.mark.parametrize("name, says", [("../../../../escape_row", "it is a path"), ("/tmp/escape_abs", "it is a path"),
                                        ("..", "starts with a dot"), (".", "starts with a dot"),
                                        ("a\\\\b", "it is a path"), ("pgd 4", "characters")])
def test_a_row_name_that_is_a_path_is_refused_and_nothing_is_written(tmp_path, capsys, name, says):
    """A study row's name is its run folder's name: one that is a path, '.' or '..' wrote (or nested) a whole run
    folder outside --out with exit 0; now one error line names the row's key and the fix, and nothing is written."""
    src = (Path(__file__).resolve().parents[1] / "robustbench_pid" / "studies" / "digits-smoke.toml").read_text()
    study = tmp_path / "in" / "s.toml"
    study.parent.mkdir()
    study.write_text(src.replace('name = "clean"', f'name = "{name}"', 1))
    cwd = tmp_path / "a" / "b" / "c" / "d"
    cwd.mkdir(parents=True)
    before = set(tmp_path.rglob("*"))
    assert main(["reproduce", str(study), "--model", "pid_deit", "--limit", "4", "--quiet", "--device", "cpu",
                 "--out", str(cwd / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    assert "key 'name': the row name" in err and says in err and "letters, digits and . _ + = @ -" in err
    assert set(tmp_path.rglob("*")) == before and not Path("/tmp/escape_abs").exists()


def test_a_shipped_study_is_found_by_name_only(tmp_path):
    """`reproduce ../x` looked for robustbench_pid/studies/../x.toml and named the study folder results/study-../x."""
    from robustbench_pid.studies.spec import find_study

    with pytest.raises(UserError, match="unknown study '../studies/digits-smoke'"):
        find_study("../studies/digits-smoke")
    assert find_study("digits-smoke").name == "digits-smoke.toml"


def test_a_line_break_or_pipe_in_a_label_stays_inside_its_table_cell(tmp_path, capsys):
    """A newline (or |) in a study's label, title or column name split the Markdown table row (issue 45)."""
    src = (Path(__file__).resolve().parents[1] / "robustbench_pid" / "studies" / "digits-smoke.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(src.replace('label = "Clean"', 'label = "Clean\\nrow | one"', 1)
                 .replace('title = "Digits smoke study', 'title = "Digits\\nsmoke study', 1)
                 .replace('"PID DeiT (digits)"', '"PID | DeiT\\r\\n(digits)"'))
    out = tmp_path / "out"
    assert main(["reproduce", str(p), "--model", "pid_deit", "--only", "clean", "--limit", "4", "--quiet",
                 "--device", "cpu", "--out", str(out)]) == 0
    md = (out / "table.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("|")]
    cells = {len(re.split(r"(?<!\\)\|", line)) for line in rows}
    assert len(cells) == 1, md  # every row has the header's cells
    assert "| Clean row \\| one | Top-1 Acc (%) | 99.72 |" in md and "### Digits smoke study" in md
    assert "PID \\| DeiT (digits) (pid_deit, standard): paper" in md
    tex = (out / "table.tex").read_text()
    assert "\n\n" not in tex.strip() and "Clean row | one" in tex

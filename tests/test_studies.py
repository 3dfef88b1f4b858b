"""Studies (paper tables as data): every shipped study parses and matches the papers' numbers; bad study
files are refused naming file, key and reason; the digits study's published values are the committed baseline."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from robustbench_pid.errors import UserError
from robustbench_pid.studies.spec import find_study, load_study, study_names

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT.parent.parent / "shared" / "papers"
if not PAPERS.is_dir():
    PAPERS = Path("/work/shared/papers")

EXPECTED = {"pidformer-table1", "pidformer-table4", "pidformer-table6", "pidformer-fig3-eps", "rpc-table1",
            "rpc-table2", "rpc-table5", "rpc-table13", "rpc-table9", "rpc-table10", "rpc-table14", "digits-smoke"}


def test_every_shipped_study_parses_and_is_checked():
    assert EXPECTED <= set(study_names())
    for name in study_names():
        s = load_study(name)
        assert s.rows and s.columns and s.source and s.protocol in ("standard", "paper")
        for r in s.rows:  # a row declares all its published values or none
            assert r.published is None or {c.name for c in s.columns} == set(r.published)


def test_table1_rows_in_the_papers_order():
    s = load_study("pidformer-table1")
    assert [r.name for r in s.rows] == ["clean", "fgsm", "pgd", "spsa", "sld", "noise", "imagenet-a", "imagenet-r",
                                        "imagenet-c", "imagenet-o"]
    assert [c.model for c in s.columns] == ["deit", "pid_deit"] and s.protocol == "paper"
    fig = load_study("pidformer-fig3-eps")
    assert all(r.published is None for r in fig.rows) and "no numbers" in fig.description.replace("prints no", "no")


# (study, row, column, metric, the paper file, a line of that paper's table holding the value)
SPOTS = [
    ("pidformer-table1", "clean", "Softmax DeiT", "top1", "pidformer.md", "Clean\tTop-1 Acc (%)\t72.17"),
    ("pidformer-table1", "pgd", "PID DeiT", "top5", "pidformer.md", "Top-5 Acc (%)\t34.99\t<b>39.69</b>"),
    ("pidformer-table1", "imagenet-c", "PID DeiT", "mce", "pidformer.md", "mCE ( $\\downarrow$ )\t71.20\t<b>68.41</b>"),
    ("pidformer-table1", "imagenet-o", "Softmax DeiT", "aupr", "pidformer.md", "Imagenet-O\tAUPR\t17.47"),
    ("pidformer-table4", "pgd", "PID FAN", "top1", "pidformer.md", "PGD\tTop-1 Acc (%)\t12.87\t<b>15.5</b>"),
    ("pidformer-table4", "imagenet-c", "FAN", "mce", "pidformer.md", "mCE (↓)\t60.06"),
    ("pidformer-table6", "clean", "DeiT + FeatScale", "top1", "pidformer.md", "DeiT + FeatScale\t72.346\t91.22"),
    ("rpc-table1", "imagenet-c", "RPC-SymViT (6iter/layer1)", "mce", "rpc-attention-kernel-pca.md",
     "RPC-SymViT (6iter/layer1)\t71.49\t90.68\t30.03\t7.33\t42.76\t73.03\t20.29"),
    ("rpc-table1", "imagenet-o", "SymViT (baseline)", "aupr", "rpc-attention-kernel-pca.md",
     "SymViT (baseline)\t70.44\t90.17\t28.98\t6.51\t41.45\t74.75\t17.43"),
    ("rpc-table2", "autoattack", "RPC-SymViT (2iter/all-layer)", "top5", "rpc-attention-kernel-pca.md",
     "Top-5 \\uparrow\t63.48\t65.11\t65.09\t65.13\t64.06"),
    ("rpc-table2", "cw", "SymViT (baseline)", "top1", "rpc-attention-kernel-pca.md",
     "CW\tTop-1 \\uparrow\t48.44\t50.00\t50.08\t50.36\t48.77"),
    ("rpc-table5", "square", "RPC-SymViT (6iter/layer1)", "top5", "rpc-attention-kernel-pca.md",
     "RPC-SymViT (6iter/layer1)\t43.64\t80.81"),
    ("rpc-table9", "imagenet-a", "RPC-FAN-tiny (4iter/layer1)", "top1", "rpc-attention-kernel-pca.md",
     "RPC-FAN-tiny (4iter/layer1)\t77.98\t94.27\t42.02\t13.55"),
    ("rpc-table10", "pgd", "FAN-tiny (baseline)", "top5", "rpc-attention-kernel-pca.md",
     "FAN-tiny (baseline)\t2.92\t4.86\t32.01\t61.72"),
    ("rpc-table13", "time", "SymViT (baseline)", "sec_per_sample_train", "rpc-attention-kernel-pca.md",
     "SymViT (baseline)\t1.17M\t0.079\t0.010\t1435MB\t1181MB\t5.2M"),
    ("rpc-table13", "memory", "RPC-SymViT (2iter/all-layer)", "peak_mem_train_mb", "rpc-attention-kernel-pca.md",
     "RPC-SymViT (2iter/layer)\t1.35M\t0.092\t0.017\t1461MB\t1181MB\t5.2M"),
    ("rpc-table14", "imagenet-o", "RPC-AsymViT (Sym/Asym)", "aupr", "rpc-attention-kernel-pca.md",
     "RPC-AsymViT (Sym/Asym)\t72.34\t91.38\t32.79\t7.23\t17.58"),
]


@pytest.mark.skipif(not PAPERS.is_dir(), reason=f"the seed papers are not here ({PAPERS}): nothing to check against")
@pytest.mark.parametrize("study,row,column,metric,paper,line", SPOTS, ids=[f"{s[0]}:{s[1]}:{s[3]}" for s in SPOTS])
def test_published_values_are_the_papers(study, row, column, metric, paper, line):
    text = (PAPERS / paper).read_text()
    assert line in text, f"{line!r} not in {paper}"
    value = load_study(study).row(row).published[column][metric]
    numbers = [float(x) for x in re.findall(r"\d+\.\d+|\d+", line.split("\t", 1)[-1].replace("<b>", ""))]
    assert value in numbers, (value, line)


def test_digits_published_values_are_the_committed_baseline():
    base = pd.read_csv(ROOT / "results" / "baselines" / "smoke-digits.csv")
    s = load_study("digits-smoke")
    from robustbench_pid.studies.spec import attack_settings

    for col in s.columns:
        for r in s.rows:
            name = r.attack["name"] if r.attack else "clean"
            sub = base[(base.model == col.model) & (base.attack == name)]
            if r.attack:
                sub = sub[(sub.eps - attack_settings(r)["eps"]).abs() < 1e-6]
            for m in r.metrics:
                assert r.published[col.name][m] == pytest.approx(sub[sub.metric == m].value.item(), abs=0.005)


GOOD = """title = "t"
source = "s"
protocol = "paper"
[[column]]
name = "A"
model = "deit"
[[row]]
name = "pgd"
label = "PGD"
dataset = "imagenet"
attack = { name = "pgd", eps = "3/255" }
metrics = ["top1"]
published."A" = { top1 = 1.0 }
"""


@pytest.mark.parametrize("old,new,needle", [
    ('title = "t"', 'title = "t"\ncolour = 1', "unknown key(s) 'colour'"),
    ('metrics = ["top1"]', 'metrics = ["top1"]\nfoo = 2', "[[row]] #1: unknown key(s) 'foo'"),
    ('dataset = "imagenet"', 'dataset = "imagenet9"', "key 'dataset': unknown dataset 'imagenet9'"),
    ('name = "pgd", eps', 'name = "pgdx", eps', "key 'attack.name'"),
    ('eps = "3/255"', 'eps = "3/255", stepz = 3', "unknown setting(s) 'stepz'"),
    ('published."A" = { top1 = 1.0 }', 'published."B" = { top1 = 1.0 }', "key 'published.B': no such column"),
    ('metrics = ["top1"]', 'metrics = ["top1", "top5"]', "key 'published.A.top5': missing"),
    ('metrics = ["top1"]', 'metrics = ["top9"]', "key 'metrics': unknown metric 'top9'"),
    ('protocol = "paper"', 'protocol = "fast"', "key 'protocol'"),
])
def test_bad_study_files_are_refused_naming_file_key_and_reason(tmp_path, old, new, needle):
    p = tmp_path / "mine.toml"
    p.write_text(GOOD)
    assert load_study(str(p)).row("pgd").published == {"A": {"top1": 1.0}}
    p.write_text(GOOD.replace(old, new))
    with pytest.raises(UserError) as e:
        load_study(str(p))
    assert str(p) in str(e.value) and needle in str(e.value)


def test_unknown_study_lists_the_shipped_ones():
    with pytest.raises(UserError, match="pidformer-table1"):
        find_study("pidformer-table99")


def test_list_studies_prints_a_line_per_study_and_a_named_one_with_its_rows(capsys):
    from robustbench_pid.cli import main
    from robustbench_pid.studies.spec import study_names

    assert main(["list", "studies"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out[:-1]] == study_names() and len(out) == len(study_names()) + 1
    assert "pidformer-table1  " in out[study_names().index("pidformer-table1")] and "10 rows, 2 columns" in " ".join(out)
    assert "list studies NAME" in out[-1] and not any(ln.startswith(" ") for ln in out)  # rows: on request
    assert main(["list", "studies", "pidformer-table1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+spsa\s+SPSA", out, re.M) and "imagenet-c" in out and "rpc-table2" not in out
    assert main(["list", "attacks", "pgd"]) == 2
    assert "names are for `list studies NAME`" in capsys.readouterr().err


def test_docs_studies_page_is_the_generated_one():
    from robustbench_pid.studies.dryrun import studies_markdown

    text = (ROOT / "docs" / "studies.md").read_text()
    block = text.split("<!-- generated: studies -->\n", 1)[1].split("<!-- end generated -->", 1)[0]
    assert block.strip() == studies_markdown().strip()


def test_table1_cost_per_image_matches_the_scaling_plan():
    """docs/scaling.md counts 10,242 forward passes per image for SPSA (2 + 40 x 2 x 128), 22 f+b for PGD-20."""
    from robustbench_pid.studies.dryrun import row_passes

    s = load_study("pidformer-table1")
    assert row_passes(s.row("spsa")) == (1 + 10242, 0)
    assert row_passes(s.row("pgd")) == (1 + 2, 20)
    assert row_passes(s.row("imagenet-c")) == (76, 0) and row_passes(s.row("imagenet-o")) == (1, 0)


def test_two_column_names_that_become_one_folder_are_refused(tmp_path):
    """A column's runs are filed under <model>@<column as a folder name>: "A/B" and "A-B" shared one entry folder,
    so the second column's entry.json replaced the first's and its runs were read as the other column's."""
    p = tmp_path / "mine.toml"
    p.write_text(GOOD.replace('[[row]]', '[[column]]\nname = "A (x/y)"\nmodel = "deit"\n[[column]]\nname = '
                              '"A (x-y)"\nmodel = "deit"\n[[row]]', 1).replace('published."A" = { top1 = 1.0 }\n', ''))
    with pytest.raises(UserError, match=r"column names 'A \(x/y\)' and 'A \(x-y\)' become the same folder name "
                                        r"'A-x-y'.*rename one of them"):
        load_study(str(p))


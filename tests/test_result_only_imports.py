"""Result-only verbs (table, check, plot, report) are pandas jobs: they never import torch or timm.

Two layers: the modules of the results view import neither (any import, even inside a function,
read from the source), the CLI verb modules import only the standard library at the top; and
``robustbench-pid table/check/plot/report RUN`` in a fresh interpreter leave ``torch`` out of
``sys.modules`` (this one also needs the package's own ``__init__`` and the summarizing modules to
be torch-free).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import robustbench_pid as rbp

PKG = Path(rbp.__file__).resolve().parent
VIEW = ["core/labels", "studies/table", "studies/report"] + sorted(
    str(p.relative_to(PKG).with_suffix("")) for p in (PKG / "results").rglob("*.py"))
VERBS = ["table", "check", "plot", "report"]
HEAVY = ("torch", "timm", "torchvision")


def _imports(path: Path, top_level_only: bool = False):
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or "")


@pytest.mark.parametrize("name", VIEW)
def test_view_modules_never_import_torch(name):
    heavy = [m for m in _imports(PKG / f"{name}.py") if m.split(".")[0] in HEAVY]
    assert heavy == [], f"{name}.py imports {heavy}"


@pytest.mark.parametrize("verb", VERBS)
def test_verb_modules_import_only_light_modules_at_the_top(verb):
    top = set(_imports(PKG / "cli" / f"{verb}.py", top_level_only=True))
    assert top <= {"__future__", "argparse", "pathlib", "typing"}, top


PROBE = r"""
import json, sys, traceback

first = {}


class Watch:  # records who imports torch first; imports nothing itself
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "timm") and "stack" not in first:
            first["stack"] = "".join(traceback.format_stack(limit=25))
        return None


sys.meta_path.insert(0, Watch())
from robustbench_pid.cli import main

run, out = sys.argv[1], sys.argv[2]
codes = [main(["table", run]), main(["check", run, "--baseline", out + "/base.csv", "--update"]),
         main(["check", run, "--baseline", out + "/base.csv"]), main(["plot", run, "--out", out + "/plots"]),
         main(["report", run, "-o", out + "/report.html", "--n-boot", "100"])]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules, "timm": "timm" in sys.modules,
                  "stack": first.get("stack", "")}))
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "deit"
    rbp.evaluate(model="deit", attack="fgsm", eps=["2/255"], limit=8, batch_size=8, out=d)
    return d


def test_table_check_plot_report_run_without_torch(run_dir, tmp_path):
    p = subprocess.run([sys.executable, "-c", PROBE, str(run_dir), str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    out = p.stdout
    assert got["codes"] == [0, 0, 0, 0, 0]
    assert "| FGSM (2/255) | Top-1 Acc (%) [95% Wilson] |" in out and "PASSED" in out  # the verbs did their work
    assert (tmp_path / "plots" / "eps_curves_top1.svg").is_file() and (tmp_path / "report.html").is_file()
    assert not got["torch"] and not got["timm"], f"torch imported by:\n{got['stack']}"

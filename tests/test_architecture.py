"""The package's shape, checked statically (AST, nothing imported): no import cycles even counting
imports inside functions, benchmarks never reach up into the runner, loading the result-only verbs
(table, check, plot, report, merge) never imports torch, the result folder is the torch boundary, and no module holds several jobs' worth
of lines."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PKG = Path(__file__).resolve().parents[1] / "robustbench_pid"
MAX_LINES = 420  # "a file over ~400 lines is usually holding two jobs"


def _name(f: Path) -> str:
    parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, Path] = {_name(f): f for f in PKG.rglob("*.py")}


def _nodes(tree: ast.AST, at_import: bool):
    """Every node, or (``at_import``) only those run when the module is imported: not function bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not (at_import and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))):
                todo.append(child)


def _imports(mod: str, at_import: bool = False) -> Set[str]:
    """The modules of the package (and top-level third-party names) ``mod`` imports: anywhere in the
    file, or only at import time."""
    f = MODULES[mod]
    base_parts = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
    out: Set[str] = set()
    for node in _nodes(ast.parse(f.read_text()), at_import):
        names: List[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = base_parts[: len(base_parts) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            names = [src] + [f"{src}.{a.name}" for a in node.names]
        for n in names:
            while n and n not in MODULES and "." in n and n.startswith("robustbench_pid"):
                n = n.rsplit(".", 1)[0]
            if n in MODULES or not n.startswith("robustbench_pid"):
                out.add(n if n in MODULES else n.split(".")[0])
    out.discard(mod)
    return out


GRAPH = {m: {t for t in _imports(m) if t in MODULES} for m in MODULES}
AT_IMPORT = {m: _imports(m, at_import=True) for m in MODULES}


def _cycles() -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def _loaded_by(start: str) -> Set[str]:
    """The package modules importing ``start`` loads (its parents' ``__init__`` included)."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(t for t in AT_IMPORT[m] if t in MODULES)
            parent = m.rsplit(".", 1)[0]
            if "." in m and parent in MODULES:
                todo.append(parent)
    return seen


def test_no_import_cycles_counting_function_level_imports():
    assert _cycles() == []


RUN = "robustbench_pid.run"
RESULTS = "robustbench_pid.results"
HEAVY = {"torch", "timm", "torchvision"}
# the plug-in folders and the run machinery: all of them may load torch
TORCH_SIDE = tuple(f"robustbench_pid.{p}" for p in ("run", "attacks", "benchmarks", "models", "loaders", "data", "probes"))
# the one lazy reach across the boundary: conditions fills the attack columns of results written before those
# columns existed from the attack registry, inside a function, only for such old results
LAZY_EXCEPTIONS = {("robustbench_pid.results.conditions", "robustbench_pid.attacks")}


def _in(m: str, pkg: str) -> bool:
    return m == pkg or m.startswith(pkg + ".")


def test_benchmarks_and_attacks_never_import_the_runner():
    for m in MODULES:
        if _in(m, "robustbench_pid.benchmarks") or _in(m, "robustbench_pid.attacks"):
            assert not {t for t in GRAPH[m] if _in(t, RUN)}, (m, GRAPH[m])


def test_result_folder_is_the_torch_boundary():
    """Every module under robustbench_pid/results/: nothing it loads at import time imports torch, timm or
    torchvision, and it never imports the run machinery or a plug-in folder (function-level imports count)."""
    side = [m for m in MODULES if _in(m, RESULTS)]
    assert len(side) > 15, side  # the folder holds the result side, not an empty shell
    for m in side:
        heavy = {d for d in _loaded_by(m) if HEAVY & AT_IMPORT[d]}
        assert heavy == set(), f"{m} reaches torch through {sorted(heavy)}"
        across = {t for t in GRAPH[m] if t.startswith(TORCH_SIDE)
                  and not any(_in(t, b) for a, b in LAZY_EXCEPTIONS if a == m)}
        assert across == set(), f"{m} imports the torch side: {sorted(across)}"


def test_run_machinery_lives_in_its_folder():
    """The loop and its helpers are under robustbench_pid/run/, the result side under robustbench_pid/results/."""
    for name in ("runner", "context", "plan", "launcher", "claims", "provenance", "dryrun", "read_ahead"):
        assert f"{RUN}.{name}" in MODULES, name
    for name in ("store", "tables", "check", "plots", "report", "merge", "integrity", "summaries"):
        assert f"{RESULTS}.{name}" in MODULES, name


RESULT_ONLY = ["robustbench_pid.cli.table", "robustbench_pid.cli.check", "robustbench_pid.cli.plot",
               "robustbench_pid.cli.report", "robustbench_pid.cli.merge"]


def test_result_only_verbs_never_load_torch_or_timm():
    """Static half; tests/test_result_only_imports.py runs the verbs and looks at sys.modules."""
    for verb in RESULT_ONLY:
        heavy = {m for m in _loaded_by(verb) if {"torch", "timm", "torchvision"} & AT_IMPORT[m]}
        assert heavy == set(), f"{verb} reaches torch through {sorted(heavy)}"


def test_no_module_holds_several_jobs_worth_of_lines():
    big = {m: n for m, f in MODULES.items() if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_one_version_number():
    """``version.py`` (what runs record) says what pyproject.toml (what pip installs) says."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli backport (a dependency there)
        import tomli as tomllib

    from robustbench_pid.version import __version__

    project = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]

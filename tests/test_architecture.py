"""The package's shape, checked statically (AST, nothing imported): no import cycles even counting
imports inside functions, benchmarks never reach up into the runner, loading the result-only verbs
(table, check, plot, report, merge) never imports torch, and no module holds several jobs' worth
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


def test_benchmarks_and_attacks_never_import_the_runner():
    runner_side = {m for m in MODULES if m.split(".")[-1] in ("runner", "run_context", "launcher", "dryrun")}
    for m in MODULES:
        if m.startswith(("robustbench_pid.benchmarks", "robustbench_pid.attacks")):
            assert not (GRAPH[m] & runner_side), (m, GRAPH[m] & runner_side)


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

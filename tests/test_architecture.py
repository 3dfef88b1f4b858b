"""The package's shape, checked statically (AST, nothing imported).

- ``LAYERS`` names every folder and root module of the package and its layer; an import may go to the
  same layer or a lower one, never up (imports inside functions count: they climb just the same when
  they run);
- no import cycles, counting imports inside functions;
- ``results/`` is the torch boundary: nothing it loads at import time imports torch, timm or torchvision,
  and neither do the other torch-free modules (the study table and report, the shared names), so the
  result-only verbs (table, check, plot, report, merge) never load torch;
- a thin root (at most ``MAX_ROOT`` modules), folders of at most ``MAX_FOLDER`` modules, and no module
  holding several jobs' worth of lines.
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import Dict, List, Set, Tuple

PKG = Path(__file__).resolve().parents[1] / "robustbench_pid"
P = "robustbench_pid"
MAX_LINES = 420  # "a file over ~400 lines is usually holding two jobs"
MAX_ROOT = 6  # root modules, __init__ and __main__ included
MAX_FOLDER = 15  # modules directly in one folder, its __init__ included

# Lowest first. Each entry: the package's first-level folders and root modules (without .py) in that layer.
# Data flows up the table: spec -> model + data -> runner -> per-sample records -> tables and plots.
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("L0 shared names (no torch)", ("errors", "specs", "registry", "core")),
    ("L1 results: the torch boundary (pandas only)", ("results",)),
    ("L2 plug-ins and torch helpers", ("runtime", "hub", "data", "models", "loaders", "attacks", "probes")),
    ("L3 benchmarks: how a unit runs", ("benchmarks",)),
    ("L4 run machinery and training", ("run", "train")),
    ("L5 what is built on runs: studies, doctor, exports, the Python API", ("studies", "doctor", "export", "api")),
    ("L6 entry points", ("cli", "__main__", "__init__")),
]
LAYER_OF: Dict[str, int] = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
# The one reach up, inside a function: a condition's identity (results/conditions.py) describes an attack
# by its class (label, norm, settings) for records written before those columns existed. The runner stamps
# the columns on every record it writes now, so readers of current results never take this path.
ALLOWED_CLIMBS = {("robustbench_pid.results.conditions", "robustbench_pid.attacks")}


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


def _owner(n: str) -> str:
    """The package module an imported dotted name lives in (the longest known prefix)."""
    while n not in MODULES and "." in n:
        n = n.rsplit(".", 1)[0]
    return n


def _imports(mod: str, at_import: bool = False) -> Set[str]:
    """The package modules (and top-level third-party names) ``mod`` imports: anywhere in the file, or
    only at import time. ``from pkg import sub`` counts the submodule ``sub``, not ``pkg``'s ``__init__``."""
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
            subs = [f"{src}.{a.name}" for a in node.names]
            names = [s for s in subs if s in MODULES]
            if len(names) < len(subs):  # some names are attributes of ``src`` itself
                names.append(src)
        for n in names:
            if n == P or n.startswith(P + "."):
                owner = _owner(n)
                assert owner in MODULES, f"{mod} imports {n}, which is not a module of the package"
                out.add(owner)
            else:
                out.add(n.split(".")[0])
    out.discard(mod)
    return out


GRAPH = {m: {t for t in _imports(m) if t in MODULES} for m in MODULES}
AT_IMPORT = {m: _imports(m, at_import=True) for m in MODULES}


def _top(m: str) -> str:
    """The first-level folder or root module ``m`` belongs to (``__init__`` for the package itself)."""
    parts = m.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(m: str) -> int:
    return LAYER_OF[_top(m)]


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


def _in(m: str, pkg: str) -> bool:
    return m == pkg or m.startswith(pkg + ".")


def _imported_sources(mod: str):
    """Each module named by an import statement of ``mod`` (function bodies included), with its line."""
    f = MODULES[mod]
    base_parts = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
    for node in _nodes(ast.parse(f.read_text()), at_import=False):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = base_parts[: len(base_parts) - (node.level - 1)]
                yield ".".join(base + ([node.module] if node.module else [])), node.lineno
            else:
                yield node.module or "", node.lineno


def test_every_import_names_a_module_that_exists():
    """A moved module leaves no import behind pointing at its old place, not even inside a function
    (those only fail when the function runs)."""
    stale = [f"{MODULES[m].relative_to(PKG.parent)}:{line}: {src}" for m in MODULES
             for src, line in _imported_sources(m) if (src == P or src.startswith(P + ".")) and src not in MODULES]
    assert stale == []


def test_every_folder_and_root_module_has_a_layer():
    tops = {_top(m) for m in MODULES}
    assert tops - set(LAYER_OF) == set(), "add these to LAYERS"
    listed = Counter(n for _, names in LAYERS for n in names)
    assert [n for n, c in listed.items() if c > 1] == []
    assert {"results", "run", "studies", "cli", "train"} <= set(LAYER_OF)


def test_no_import_climbs_to_a_higher_layer():
    """Module-level and function-level imports alike."""
    climbs = sorted((m, t, LAYERS[layer(m)][0], LAYERS[layer(t)][0]) for m in MODULES for t in GRAPH[m]
                    if layer(t) > layer(m) and not any(m == a and _in(t, b) for a, b in ALLOWED_CLIMBS))
    assert climbs == []


def test_the_allowed_climb_is_still_needed_and_lazy():
    """An exception that no longer happens is removed from ``ALLOWED_CLIMBS``; the one that does stays
    inside a function (results/ never loads the attack registry, and so torch, at import time)."""
    for a, b in ALLOWED_CLIMBS:
        assert any(_in(t, b) for t in GRAPH[a]), (a, b)
        assert not any(_in(t, b) for t in AT_IMPORT[a]), (a, b)


def test_no_import_cycles_counting_function_level_imports():
    assert _cycles() == []


HEAVY = {"torch", "timm", "torchvision"}
# modules that must load without torch: the result side, the shared names, and the study's table and report
# (read by ``merge`` and ``report``)
TORCH_FREE = (f"{P}.results", f"{P}.core", f"{P}.errors", f"{P}.specs", f"{P}.registry",
              f"{P}.studies.table", f"{P}.studies.report", f"{P}.studies.spec")


def test_result_folder_and_torch_free_modules_never_load_torch():
    """Every module under robustbench_pid/results/ (and the other torch-free ones): nothing it loads at
    import time imports torch, timm or torchvision."""
    side = [m for m in MODULES if any(_in(m, p) for p in TORCH_FREE)]
    assert len([m for m in side if _in(m, f"{P}.results")]) > 15, side  # the folder holds the result side
    for m in side:
        heavy = {d for d in _loaded_by(m) if HEAVY & AT_IMPORT[d]}
        assert heavy == set(), f"{m} reaches torch through {sorted(heavy)}"


def test_benchmarks_and_attacks_never_import_the_runner():
    for m in MODULES:
        if _in(m, f"{P}.benchmarks") or _in(m, f"{P}.attacks"):
            assert not {t for t in GRAPH[m] if _in(t, f"{P}.run")}, (m, GRAPH[m])


def test_each_concept_lives_in_its_folder():
    """Where a reader looks for a piece is where it is."""
    homes = {
        "run": ("runner", "context", "plan", "claims", "provenance", "dryrun", "read_ahead", "spec_builder", "speed"),
        "runtime": ("device", "health", "launcher"),
        "hub": ("released", "download", "checkpoints"),
        "core": ("version", "labels", "shipped", "imagenet_info"),
        "studies": ("spec", "reproduce", "dryrun", "table", "report"),
        "results": ("store", "conditions", "inputs", "files.merge", "files.integrity", "files.run_files",
                    "tables.layouts", "tables.render", "ci.check", "ci.compare", "ci.baseline", "report.html", "report.plots",
                    "stats.metrics", "stats.stats", "summaries"),
    }
    for folder, names in homes.items():
        for name in names:
            assert f"{P}.{folder}.{name}" in MODULES, (folder, name)


RESULT_ONLY = [f"{P}.cli.table", f"{P}.cli.check", f"{P}.cli.plot", f"{P}.cli.report", f"{P}.cli.merge"]


def test_result_only_verbs_never_load_torch_or_timm():
    """Static half; tests/test_result_only_imports.py runs the verbs and looks at sys.modules."""
    for verb in RESULT_ONLY:
        heavy = {m for m in _loaded_by(verb) if HEAVY & AT_IMPORT[m]}
        assert heavy == set(), f"{verb} reaches torch through {sorted(heavy)}"


def test_thin_root_and_small_folders():
    root = sorted(f.name for f in PKG.glob("*.py"))
    assert len(root) <= MAX_ROOT, root
    folders = Counter(f.parent.relative_to(PKG.parent).as_posix() for f in PKG.rglob("*.py"))
    assert {d: n for d, n in folders.items() if n > MAX_FOLDER} == {}


def test_no_module_holds_several_jobs_worth_of_lines():
    big = {m: n for m, f in MODULES.items() if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_one_version_number():
    """``core/version.py`` (what runs record) says what pyproject.toml (what pip installs) says."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli backport (a dependency there)
        import tomli as tomllib

    from robustbench_pid.core.version import __version__

    project = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]

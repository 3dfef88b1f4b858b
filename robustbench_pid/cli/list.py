"""``robustbench-pid list KIND``: what is registered (attacks with settings, datasets, benchmarks, suites)."""
from __future__ import annotations

import argparse
import sys

NAME = "list"
HELP = "list registered attacks (with their settings), datasets, benchmarks, attack suites or studies (paper tables)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["attacks", "datasets", "benchmarks", "suites", "studies"])
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="with studies: show these studies in full (columns, rows, claims); without: one line each")


def run(a: argparse.Namespace) -> int:
    if a.names and a.kind != "studies":
        from ..errors import UserError

        raise UserError(f"list {a.kind} takes no NAME ({' '.join(a.names)}); names are for `list studies NAME`")
    if a.kind == "attacks":
        from ..attacks import attack_names, get_attack
        from ..core.labels import eps_text

        for name in attack_names():
            cls = get_attack(name)
            defaults = cls().params()
            doc = _first_line(cls)
            print(f"{name:12s} norm={cls.norm:5s} {doc}")
            print("    " + ", ".join(f"{k}={eps_text(v, cls.norm) if k == 'eps' else repr(v)}"
                                     for k, v in defaults.items()))
    elif a.kind == "datasets":
        from ..data import datasets

        for name, info in datasets.items():
            print(f"{name:16s} family={info.family:9s} classes={info.num_classes:<5d} "
                  f"splits={','.join(info.splits):10s} {info.description}")
    elif a.kind == "benchmarks":
        from ..benchmarks import benchmark_names, get_benchmark

        for name in benchmark_names():
            print(f"{name:16s} {_first_line(type(get_benchmark(name)))}")
    elif a.kind == "studies":
        from ..studies.spec import format_studies

        print(format_studies(a.names))
    else:
        from ..run.suites import load_suite, suite_names

        for name in suite_names():
            s = load_suite(name)
            print(f"{name:16s} {len(s['attacks']):3d} attack runs  {s['description']}")
    return 0


def _first_line(cls: type) -> str:
    """The module docstring's first line (dataclass docstrings are just the signature)."""
    doc = (sys.modules[cls.__module__].__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""

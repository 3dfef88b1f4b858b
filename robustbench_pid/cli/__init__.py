"""Command line: ``evaluate`` and the umbrella ``robustbench-pid VERB``.

Each verb is one module in this package defining ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``; adding a verb means adding a module.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import warnings
from types import ModuleType
from typing import Dict, List, Optional

from ..errors import UserError, write_error
from ..registry import UnknownNameError


def verbs() -> Dict[str, ModuleType]:
    """Verb name -> module. Verb modules import only argparse/pathlib/typing and torch-free project
    modules at their top (library work is imported inside ``run``), so ``--help`` starts fast."""
    out: Dict[str, ModuleType] = {}
    for m in pkgutil.iter_modules(__path__):
        if m.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{m.name}")
        if hasattr(mod, "NAME"):
            out[mod.NAME] = mod
    return dict(sorted(out.items()))


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """On the command line a warning meant for the user is one line, like an error: no source path and line."""
    if issubclass(category, UserWarning):
        return f"warning: {message}\n"
    return _DEFAULT_FORMAT(message, category, filename, lineno, line)


_DEFAULT_FORMAT = warnings.formatwarning


def _guard(fn, args) -> int:
    warnings.formatwarning = _format_warning  # restored when the verb returns (tests call verbs in-process)
    try:
        return int(fn(args) or 0)
    except (UserError, UnknownNameError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # disk full / permission lost outside the atomic writers (claims, folders)
        err = write_error(exc)
        if err is None:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work units are kept; re-run the same command to resume", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = _DEFAULT_FORMAT


_NEGATIVE = re.compile(r"^-\.?\d")  # -2/255, -0.1, -.5: a value, never an option name


def join_negative_values(argv: List[str]) -> List[str]:
    """``--eps -2/255`` -> ``--eps=-2/255``: argparse takes a value that starts with ``-`` and is not
    a plain number for an option and fails with its usage dump; joined, the value reaches our own
    validation and its one-line error (eps must be >= 0, ...)."""
    out: List[str] = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE.match(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = join_negative_values([*(sys.argv[1:] if argv is None else argv)])  # `list` is a verb module here
    modules = verbs()
    parser = argparse.ArgumentParser(prog="robustbench-pid", description="Robustness evaluation harness.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name, mod in modules.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
    args = parser.parse_args(argv)
    return _guard(modules[args.verb].run, args)


def evaluate_main(argv: Optional[List[str]] = None) -> int:
    from . import evaluate

    argv = join_negative_values([*(sys.argv[1:] if argv is None else argv)])  # `list` is a verb module here
    parser = argparse.ArgumentParser(prog="evaluate", description=evaluate.HELP)
    evaluate.add_arguments(parser)
    return _guard(evaluate.run, parser.parse_args(argv))

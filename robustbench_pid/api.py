"""The notebook API: the ``evaluate`` command as a function returning the tidy DataFrame.

``rbp.evaluate(model="pid_deit", attack="pgd", eps="3/255", limit=100)`` builds exactly the RunSpec
the ``evaluate`` command would build from the same options (it goes through that command's own
argument parser and ``build_spec``), so a notebook run and a shell run with the same settings share
their run folder, resume from each other and give identical records.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import pandas as pd

from .errors import UserError

EpsLike = Union[None, float, str, Sequence[Union[float, str]]]


def _parser() -> argparse.ArgumentParser:
    from .cli import evaluate as cmd

    p = argparse.ArgumentParser(prog="evaluate", add_help=False)
    cmd.add_arguments(p)
    return p


def _as_list(x: Union[None, str, Iterable[str]]) -> List[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    return list(x)


def _eps_text(eps: EpsLike) -> Optional[str]:
    if eps is None:
        return None
    if isinstance(eps, (str, int, float)):
        return str(eps)
    return ",".join(str(e) for e in eps)


def build_args(model: str, attack: Union[None, str, Sequence[str]] = None, eps: EpsLike = None,
               dataset: str = "digits", **kw: Any) -> argparse.Namespace:
    """The ``evaluate`` command's namespace for these options (``params={...}`` for ``--param``)."""
    args = _parser().parse_args(["--model", model])
    valid = sorted(vars(args))
    args.attack = _as_list(attack)
    args.eps = _eps_text(eps)
    args.dataset = dataset
    params: Dict[str, Any] = dict(kw.pop("params", None) or {})
    kw.setdefault("quiet", True)
    for k, v in kw.items():
        if k not in vars(args):
            raise UserError(f"evaluate() got an unknown option {k!r}; valid: {', '.join(valid)} "
                            f"(attack settings go in params={{...}})")
        if k == "out" and v is not None:
            v = Path(v)
        if k == "step_size" and v is not None:
            v = str(v)
        setattr(args, k, v)
    args.param = [f"{k}={v}" for k, v in params.items()] + list(kw.get("param", []) or [])
    return args


def evaluate(model: str, attack: Union[None, str, Sequence[str]] = None, eps: EpsLike = None,
             dataset: str = "digits", **kw: Any) -> pd.DataFrame:
    """Run an evaluation and return its tidy results (values in percent, with 95% intervals).

    Any ``evaluate`` command option is a keyword (dashes become underscores): ``suite``, ``limit``,
    ``protocol``, ``checkpoint``, ``steps``, ``batch_size``, ``out``, ``seed``, ... Attack settings
    without their own option go in ``params={"random_start": False}``. The run folder (records,
    run.json) is in ``df.attrs["run_dir"]``; pass it to ``rbp.table`` for paired tests.
    """
    from .cli.evaluate import build_spec
    from .results import load_results
    from .runner import run as run_spec

    args = build_args(model, attack, eps, dataset, **kw)
    spec = build_spec(args)
    if spec.dry_run:
        raise UserError("dry_run=True computes nothing; use the `evaluate --dry-run` command to see the plan")
    out = run_spec(spec)
    if not (out / "summary.csv").is_file():
        raise UserError(f"{out}: this process computed only its shard; merge the shards, then "
                        f"rbp.load_results({str(out)!r})")
    df = load_results(out)
    df.attrs["run_dir"] = os.path.abspath(out)  # still valid if the notebook changes directory
    return df

"""RobustBench's facts, kept as data with their sources (``_data/robustbench.json``): the model_info fields and
their types, the leaderboards' eps and sample sets, the ImageNet 5,000-image id list (a verbatim copy of
``robustbench/helper_files/imagenet_test_image_ids.txt``, its sha256 checked on every read), the corruption
order of the unaggregated CSV, the CIFAR-10 files. Every fact names the file and commit it was read from, so a
reader can check it; nothing here is typed from memory. Standard library only (L0).
"""
from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Dict, List, Optional, Tuple

from ..errors import UserError

NAME = "robustbench"
ACCURACY = re.compile(r"\d{1,3}\.\d{2}")  # how this project writes an accuracy field: percent, two decimals


@lru_cache(maxsize=1)
def facts() -> Dict[str, Any]:
    """The shipped facts (``_data/robustbench.json``)."""
    return json.loads((resources.files("robustbench_pid.core") / "_data" / "robustbench.json").read_text())


def source() -> str:
    """``<repository>@<commit>``: where every fact was read."""
    s = facts()["source"]
    return f"{s['repository']}@{s['commit']}"


THREATS = {"robustbench": "Linf", "robustbench-l2": "L2", "robustbench-corruptions": "corruptions"}  # suite -> threat
# the datasets whose samples are a leaderboard's corrupted copies -> the leaderboard's dataset
CORRUPTED = {"cifar10-c": "cifar10", "cifar100-c": "cifar100", "imagenet-c": "imagenet"}


def board_dataset(dataset: str) -> str:
    """RobustBench's name for the dataset a run read: cifar10-c is scored on the cifar10 corruptions leaderboard."""
    return CORRUPTED.get(dataset, dataset)


def leaderboard(dataset: str, threat: str = "Linf") -> Dict[str, Any]:
    """The ``threat`` leaderboard of ``dataset`` (threat model, eps text, size, sample set), or one error naming
    those there are. Keys in the facts: the dataset for L-inf, ``<dataset>/<threat>`` for the others (the corruptions
    leaderboard also under its corrupted data's name, cifar10-c for cifar10)."""
    boards = {k: v for k, v in facts()["leaderboards"].items() if k != "sources"}
    key = dataset if threat == "Linf" else f"{board_dataset(dataset) if threat == 'corruptions' else dataset}/{threat}"
    if key not in boards:
        have = ", ".join(f"{k.split('/')[0]} {v['threat_model']}" + (f" {v['eps']}" if v["eps"] else "")
                         for k, v in sorted(boards.items()))
        raise UserError(f"RobustBench has no {threat} leaderboard this project can run on dataset {dataset!r}; it has "
                        f"{have}: use one of those (--suite robustbench for L-inf, --suite robustbench-l2 for L2, "
                        f"--suite robustbench-corruptions for corruptions), or run the attacks yourself (e.g. --attack "
                        f"autoattack --eps 4/255)")
    return boards[key]


@lru_cache(maxsize=1)
def imagenet_subset() -> Tuple[str, ...]:
    """The 5,000 ``<wnid>/<file>`` ids of RobustBench's ImageNet leaderboard, in its order (sha256 checked)."""
    info = facts()["imagenet_subset"]
    data = (resources.files("robustbench_pid.core") / "_data" / info["file"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise UserError(f"the shipped RobustBench id list robustbench_pid/core/_data/{info['file']} does not match its "
                        f"recorded sha256 {info['sha256'][:12]}...; reinstall robustbench_pid")
    return tuple(line for line in data.decode().splitlines() if line)


def model_info_fields() -> Dict[str, Dict[str, Any]]:
    """model_info field -> {type, required (threat models), what}; types: str, bool, int, accuracy, ...|null."""
    return facts()["model_info"]["fields"]


def field_order() -> List[str]:
    return list(facts()["model_info"]["order"])


def corruption_order() -> List[str]:
    """The 15 corruptions in the column order of RobustBench's unaggregated_results.csv."""
    return list(facts()["corruptions"]["order"])


def cifar(name: str) -> Dict[str, Any]:
    """CIFAR-10's or CIFAR-100's files (pickled batches, their label key, md5 of the published files) and class
    names in label order (``name``: cifar10 | cifar100)."""
    return facts()[name]


def cifar10() -> Dict[str, Any]:
    return cifar("cifar10")


@lru_cache(maxsize=1)
def _entries() -> Dict[str, Any]:
    return json.loads((resources.files("robustbench_pid.core") / "_data" / "robustbench_entries.json").read_text())


def published(dataset: str, threat: str, name: str) -> Optional[Dict[str, Any]]:
    """RobustBench's published numbers of one model-zoo entry (its ``model_info`` file's clean_acc, autoattack_acc,
    external, eps, unreliable, as strings of percent), or None where the repository has no file for it. Pinned by
    scripts/robustbench_entries.py from the repository at the facts' commit (``entries_source``)."""
    return _entries()["entries"].get(f"{dataset}/{threat}/{name}")


def entries_source() -> str:
    s = _entries()["source"]
    return f"{s['repository']}@{s['commit'][:12]} ({s['files']})"


def check_value(name: str, value: Any) -> bool:
    """Does ``value`` have the type RobustBench's model_info files give field ``name``?"""
    kinds = model_info_fields()[name]["type"].split("|")
    for kind in kinds:
        if kind == "null" and value is None:
            return True
        if kind == "empty" and value == "":
            return True
        if kind == "accuracy" and isinstance(value, str) and ACCURACY.fullmatch(value) and float(value) <= 100:
            return True
        if kind == "str" and isinstance(value, str):
            return True
        if kind == "bool" and isinstance(value, bool):
            return True
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
    return False

"""Attack suites: declarative TOML files in ``attacks/`` (package data), or any path.

    description = "..."
    [[attack]]
    name = "pgd"                      # a registered attack
    eps = ["1/255", "2/255"]          # a number, an "a/b" string, or a list of them (one run each)
    steps = 20                        # any other setting of that attack, by its field name

Every key is checked: an unknown top-level key, attack name or setting, or a bad value is
refused with the file, the key and the reason. The protocol is not a suite key: the same suite
runs in either protocol, chosen per run (``--protocol``) and recorded in every record.

A leaderboard's protocol is a suite too (``leaderboard = "robustbench"``, ``attacks/robustbench.toml``): its
attacks take the leaderboard's eps for the run's dataset and the run its sample set (``core/robustbench.py``);
the run's provenance says whether it is comparable with the leaderboard (:func:`leaderboard_provenance`).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..attacks import get_attack
from ..core.labels import parse_eps
from ..errors import UserError
from ..registry import UnknownNameError
from ..core.shipped import shipped_dir
from ..specs import AttackSpec

TOP_KEYS = {"description", "attack", "leaderboard"}
LEADERBOARDS = ("robustbench", "robustbench-l2", "robustbench-corruptions")  # core/robustbench.py THREATS: threats
CORRUPTIONS_BOARD = "robustbench-corruptions"  # no attacks: clean passes over the released corrupted data


def suites_dir() -> Path:
    return shipped_dir("attack_suites")


def suite_names() -> List[str]:
    d = suites_dir()
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def find_suite(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".toml" and p.is_file():
        return p
    cand = suites_dir() / f"{name}.toml"
    if cand.is_file():
        return cand
    raise UserError(f"unknown suite {name!r}: no such file, and not in {suites_dir()}. "
                    f"Valid suites: {', '.join(suite_names()) or '(none)'}")


def load_suite(name: str, dataset: Optional[str] = None) -> Dict[str, Any]:
    """{'name', 'path', 'description', 'attacks': [AttackSpec, ...], 'leaderboard'}; a leaderboard suite's attacks
    get the leaderboard's eps for ``dataset`` (without one: each attack's default, for listings)."""
    path = find_suite(name)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 by definition
        raise UserError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); a suite is TOML, which is "
                        f"UTF-8: save it as UTF-8") from None
    unknown = set(data) - TOP_KEYS
    if "protocol" in unknown:
        raise UserError(f"{path}: key 'protocol' is not a suite setting: choose the protocol per run with "
                        f"--protocol standard|paper (the same suite runs in both)")
    if unknown:
        raise UserError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(TOP_KEYS))}")
    if not isinstance(data.get("description", ""), str):
        raise UserError(f"{path}: key 'description' must be a string")
    board = data.get("leaderboard")
    if board is not None and board not in LEADERBOARDS:
        raise UserError(f"{path}: key 'leaderboard': {board!r} is not a leaderboard this project knows; valid: "
                        f"{', '.join(LEADERBOARDS)}")
    board_eps = None
    if board == CORRUPTIONS_BOARD:
        if "attack" in data:
            raise UserError(f"{path}: the corruptions leaderboard runs no attacks (clean passes over corrupted data); "
                            f"remove the [[attack]] tables")
        return {"name": path.stem, "path": str(path), "description": data.get("description", ""), "attacks": [],
                "leaderboard": board}
    if board is not None and dataset is not None:
        from ..core.robustbench import THREATS, leaderboard

        board_eps = parse_eps(leaderboard(dataset, THREATS[board])["eps"])
    entries = data.get("attack", [])
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{path}: needs at least one [[attack]] table (key 'attack' must be an array of tables)")
    specs: List[AttackSpec] = []
    for i, entry in enumerate(entries):
        where = f"{path} [[attack]] #{i + 1}"
        entry = dict(entry)
        name_ = entry.pop("name", None)
        if not name_:
            raise UserError(f"{where}: missing key 'name'")
        if not isinstance(name_, str):
            raise UserError(f"{where}: key 'name' must be a string, got {name_!r}")
        try:
            cls = get_attack(name_)
        except UnknownNameError as exc:
            raise UserError(f"{where}: {exc}") from None
        eps_values: List[Optional[Any]] = [board_eps]
        if "eps" in entry and board is not None:
            raise UserError(f"{where}: key 'eps': a leaderboard suite takes the leaderboard's eps for the run's dataset; "
                            f"remove it")
        if "eps" in entry:
            raw = entry.pop("eps")
            raw_list = raw if isinstance(raw, list) else [raw]
            if not raw_list:
                raise UserError(f"{where}: key 'eps': empty list; give at least one value")
            bad = [e for e in raw_list if isinstance(e, bool) or not isinstance(e, (str, int, float))]
            if bad:
                raise UserError(f"{where}: key 'eps': {bad[0]!r} is not a number or an \"a/b\" string")
            try:
                eps_values = [parse_eps(e) if isinstance(e, str) else parse_eps(repr(float(e))) for e in raw_list]
            except (UserError, TypeError, ValueError) as exc:
                raise UserError(f"{where}: key 'eps': {exc}") from None
        for eps in eps_values:
            params = dict(entry) if eps is None else {**entry, "eps": eps}
            attack = cls.from_params(params, where=where)
            specs.append(AttackSpec(name_, attack.params()))
    return {"name": path.stem, "path": str(path), "description": data.get("description", ""), "attacks": specs,
            "leaderboard": board}


def leaderboard_options(suite: Optional[str], dataset: str, subset: Optional[int], protocol: str,
                        model: Optional[str] = None) -> Dict[str, Any]:
    """The dataset options a leaderboard suite sets (ImageNet: RobustBench's sample list), refusing what would make
    its numbers another protocol's: a seeded --subset, the paper protocol, a RobustBench entry of another threat model
    (``robustbench:L2/NAME`` under the L-inf leaderboard). {} for any other suite."""
    name = load_suite(suite)["leaderboard"] if suite else None
    if name is None:
        return {}
    from ..core.robustbench import THREATS, leaderboard

    board = leaderboard(dataset, THREATS[name])  # refuses a dataset without that leaderboard here
    if isinstance(model, str) and model.startswith("robustbench:"):
        threat = model[len("robustbench:"):].rpartition("/")[0] or "Linf"
        if threat != THREATS[name]:
            other = {v: k for k, v in THREATS.items()}.get(threat)
            raise UserError(f"--model {model} is RobustBench's {threat} entry and --suite {suite} its {THREATS[name]} "
                            f"leaderboard" + (f": use --suite {other}" if other else ": no leaderboard suite runs it"))
    if subset is not None:
        raise UserError(f"--suite {suite} runs the leaderboard's own sample set ({board['samples']}); drop --subset "
                        f"(--limit N takes its first N, recorded as not comparable)")
    if protocol != "standard":
        raise UserError(f"--suite {suite} is the leaderboard's protocol: pixel-space eps-balls, true labels; use "
                        f"--protocol standard")
    if name == CORRUPTIONS_BOARD:
        return {"sample_list": "robustbench"} if dataset == "imagenet-c" else {}
    return {"sample_list": "robustbench"} if dataset == "imagenet" else {}


def corruption_run(suite: Optional[str], dataset: str, benchmark: Optional[str], limit: Optional[int]
                   ) -> Optional[Dict[str, Any]]:
    """What ``--suite robustbench-corruptions`` makes of the run's settings: the dataset of the leaderboard's
    corrupted data (cifar10 -> cifar10-c, imagenet -> imagenet-c), its benchmark, and ``--limit N`` as the first N of
    each cell (RobustBench's n_examples: unlike --limit elsewhere, which takes the first N samples). None for other
    suites."""
    if not suite or load_suite(suite)["leaderboard"] != CORRUPTIONS_BOARD:
        return None
    from ..core.robustbench import CORRUPTED, board_dataset, leaderboard

    corrupted = {v: k for k, v in CORRUPTED.items()}
    name = dataset if dataset in CORRUPTED else corrupted.get(dataset)
    if name is None:
        leaderboard(dataset, "corruptions")  # the one error naming the leaderboards there are
    board = leaderboard(board_dataset(name), "corruptions")
    if benchmark not in (None, "robustbench_corruptions"):
        raise UserError(f"--suite {suite} runs benchmark robustbench_corruptions (RobustBench's protocol); drop "
                        f"--benchmark {benchmark}")
    if limit is not None and not 1 <= limit <= board["n"]:
        raise UserError(f"--limit {limit} under --suite {suite} takes the first N of each cell: give 1..{board['n']:,} "
                        f"(the leaderboard's n per cell)")
    return {"dataset": name, "benchmark": "robustbench_corruptions",
            "options": {"n_per_cell": limit} if limit is not None else {}}


def leaderboard_provenance(spec: Any, n_samples: int, dataset_prov: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What run.json records of a leaderboard suite's run: the protocol, its source, and whether the numbers are
    comparable with the leaderboard (and why not: fewer images, reduced precision, a copy that is not the
    published file, skipped images). None for other runs."""
    name = load_suite(spec.suite)["leaderboard"] if spec.suite else None
    if name is None:
        return None
    from ..core import robustbench as rb

    board = rb.leaderboard(spec.dataset, rb.THREATS[name])
    why = []
    if name == CORRUPTIONS_BOARD:
        n_samples = int(dataset_prov.get("n_per_condition") or 0)
        if n_samples != board["n"]:
            why.append(f"{n_samples:,} of the leaderboard's {board['n']:,} images per cell (--limit)")
        if dataset_prov.get("clean") is None and not dataset_prov.get("imagenet_root"):
            why.append("no clean condition (the leaderboard's clean_acc)")
        n_samples = board["n"]
    if n_samples != board["n"]:
        why.append(f"{n_samples:,} of the leaderboard's {board['n']:,} images" + (" (--limit)" if spec.limit else ""))
    if spec.precision != "fp32":
        why.append(f"--precision {spec.precision} (the attacks' passes in reduced precision)")
    if dataset_prov.get("n_unreadable"):
        why.append(f"{dataset_prov['n_unreadable']} unreadable image(s) skipped")
    if dataset_prov.get("published_md5") is False:
        why.append(f"the {spec.dataset} files are not the published ones (md5)")
    return {"name": rb.NAME, "source": rb.source(), "threat_model": board["threat_model"], "eps": board["eps"],
            "samples": board["samples"], "n": board["n"], "comparable": not why, "reasons": why}

"""Attack suites: declarative TOML files in ``attacks/`` (package data), or any path.

    description = "..."
    [[attack]]
    name = "pgd"                      # a registered attack
    eps = ["1/255", "2/255"]          # a number, an "a/b" string, or a list of them (one run each)
    steps = 20                        # any other setting of that attack, by its field name

Every key is checked: an unknown top-level key, attack name or setting, or a bad value is
refused with the file, the key and the reason. The protocol is not a suite key: the same suite
runs in either protocol, chosen per run (``--protocol``) and recorded in every record.
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

TOP_KEYS = {"description", "attack"}


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


def load_suite(name: str) -> Dict[str, Any]:
    """{'name', 'path', 'description', 'attacks': [AttackSpec, ...]}"""
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
        eps_values: List[Optional[Any]] = [None]
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
    return {"name": path.stem, "path": str(path), "description": data.get("description", ""), "attacks": specs}

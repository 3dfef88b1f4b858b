"""A study folder's hand-editable files, checked against what they describe (torch-free).

``reproduce`` writes ``study.toml`` (the study as it ran) and ``<model>@<column>/entry.json`` beside
ordinary run folders ``<model>@<column>/<protocol>/<row>/``; ``table``, ``report``, ``merge`` and the
pair table read them back. Both are plain text a person can edit, and an edit would relabel runs (an
entry naming another column or model) or show invented numbers (a "published" value changed in the
copy). So before anything is read from a folder:

- each entry is a JSON object whose model and column name its own folder (``slug(model@column)``),
  whose column is one of the study's with that column's architecture arguments;
- the study copy is the one the entries recorded (its sha256) and, for a shipped study, the shipped
  definition (rows, columns, published values, pairs);
- each finished row run is what its row and entry say: its run.json's model, architecture
  arguments, dataset, benchmark, protocol folder, and attack with the row's settings.

Anything that differs is one error naming the file, what differs and how to fix it.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..core.paths import slug
from ..errors import UserError
from .spec import CONVERGED_DIR, STUDIES_DIR, Column, Row, Study, attack_settings, parse_study, study_names

STUDY_FILE = "study.toml"
ENTRY_FILE = "entry.json"
RERUN = "run reproduce for that model again into this folder (it rewrites the file and keeps the finished rows)"


def entry_dir_name(model: str, column: str) -> str:
    return slug(f"{model}@{column}")


def sha256_text(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_entry(f: Path) -> Dict[str, Any]:
    """One ``entry.json``: a JSON object with text ``model`` and ``column`` that name its folder."""
    try:
        info = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{f} is damaged (not JSON); {RERUN}") from None
    if not isinstance(info, dict):
        raise UserError(f"{f} is damaged (a JSON {type(info).__name__}, not an object with model and column); "
                        f"{RERUN}")
    for key in ("model", "column"):
        if not isinstance(info.get(key), str) or not info[key]:
            raise UserError(f"{f} is damaged (no {key!r} text in it); {RERUN}")
    want = entry_dir_name(info["model"], info["column"])
    if f.parent.name != want:
        raise UserError(f"{f} says model {info['model']!r}, column {info['column']!r}, but its folder is "
                        f"{f.parent.name!r} (reproduce names it {want!r}): the file was edited and would relabel the "
                        f"runs; restore its model and column to the folder's, or {RERUN}")
    return {**info, "dir": f.parent}


def entries(out: Path) -> List[Dict[str, Any]]:
    """The (model, column) entries of a study folder, in the order they were first run, each checked."""
    found = [read_entry(f) for f in sorted(Path(out).glob(f"*/{ENTRY_FILE}"))]
    return sorted(found, key=lambda e: (str(e.get("created", "")), str(e["dir"])))


def _shipped(found: List[Dict[str, Any]], name: Optional[str]) -> Optional[Path]:
    """The shipped definition the folder's study was run from, if any (entries older than the ``shipped`` key:
    a study of a shipped study's name)."""
    flags = {e.get("shipped") for e in found}
    if name is None or name not in study_names() or flags == {False}:
        return None
    return STUDIES_DIR / f"{name}.toml"


def _published(s: Study) -> Dict[Any, float]:
    return {(r.name, c, m): v for r in s.rows for c, vals in (r.published or {}).items() for m, v in vals.items()}


def study_difference(copy: Study, ref: Study, extension: bool = False) -> Optional[str]:
    """The first thing a study copy says differently from its reference (rows, columns, published values, pairs);
    with ``extension``, rows, columns and claims the reference adds are no difference (a shipped study that grew
    since the folder was made: everything the copy says must still be what the reference says)."""
    a, b = _published(copy), _published(ref)
    for k in sorted(set(a) | (set(a) if extension else set(b)), key=str):
        if a.get(k) != b.get(k):
            row, col, metric = k
            return (f"row {row!r}, column {col!r}: published {metric} {a.get(k, '(none)')} where the study has "
                    f"{b.get(k, '(none)')}")
    mine_cols = [(c.name, c.model, c.model_args) for c in copy.columns]
    ref_cols = [(c.name, c.model, c.model_args) for c in ref.columns]
    if (not all(c in ref_cols for c in mine_cols)) if extension else mine_cols != ref_cols:
        return "its columns (names, models or architecture arguments)"
    mine = {r.name: r for r in copy.rows}
    theirs = {r.name: r for r in ref.rows}
    for r in (copy.rows if extension else ref.rows):
        m, t = (r, theirs.get(r.name)) if extension else (mine.get(r.name), r)
        if m is None or t is None or (m.dataset, m.benchmark, m.attack, m.metrics) != (t.dataset, t.benchmark, t.attack,
                                                                                      t.metrics):
            what = "missing" if (m is None or t is None) else "its dataset, benchmark, attack or metrics"
            return f"row {r.name!r} ({what})"
    if not extension and [r.name for r in copy.rows] != [r.name for r in ref.rows]:
        return "its rows"
    if copy.protocol != ref.protocol or (not all(p in ref.pairs for p in copy.pairs) if extension
                                         else copy.pairs != ref.pairs):
        return "its claims ([[pair]]) or protocol"
    return None


def folder_study(out: Path, found: List[Dict[str, Any]]) -> Study:
    """The study copy of folder ``out``, checked against what the entries recorded and the shipped study."""
    out = Path(out)
    copy = out / STUDY_FILE
    names = sorted({str(e["study"]) for e in found if e.get("study")})
    if len(names) > 1:
        raise UserError(f"{out}: its entries name different studies ({', '.join(names)}); one study folder holds one "
                        f"study: restore the 'study' of the edited entry.json, or {RERUN}")
    name = names[0] if names else None
    study = parse_study(copy, name=name)
    sha = sha256_text(copy)
    for e in found:
        if e.get("study_sha256") not in (None, sha):
            raise UserError(f"{copy} was changed after {e['dir'].name} ran (its sha256 is not the one "
                            f"{e['dir'].name}/{ENTRY_FILE} recorded), so its published values and rows cannot be "
                            f"trusted: restore the study file it ran, or run the study into a new folder")
    ref = _shipped(found, name)
    if ref is not None and ref.is_file():
        diff = study_difference(study, parse_study(ref, name=name), extension=True)
        if diff is not None:
            raise UserError(f"{copy} differs from the shipped study {name!r} ({ref}) in {diff}: the copy was edited "
                            f"(or made by another version of the study); restore it with a copy of {ref}, or run the "
                            f"study into a new folder")
    for e in found:
        try:
            col = study.column(e["column"])
        except UserError as exc:
            raise UserError(f"{e['dir'] / ENTRY_FILE}: {exc}; restore its column, or {RERUN}") from None
        if dict(e.get("model_args") or {}) != dict(col.model_args):
            raise UserError(f"{e['dir'] / ENTRY_FILE}: model_args {e.get('model_args')} differ from those of column "
                            f"{col.name!r} in {copy} ({col.model_args}); restore them, or {RERUN}")
    return study


def _same(want: Any, got: Any) -> bool:
    """A row's setting as written in TOML against the value its run recorded ("4/255" is a number there)."""
    if isinstance(want, str) and isinstance(got, (int, float)) and not isinstance(got, bool):
        from ..core.labels import parse_eps

        try:
            want = parse_eps(want)
        except (UserError, ValueError):
            return False
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(float(want), float(got), rel_tol=1e-9, abs_tol=1e-12)
    return bool(want == got)


def _run_attacks(info: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    spec = info.get("spec")
    attacks = spec.get("attacks") if isinstance(spec, dict) else None
    return attacks if isinstance(attacks, list) else None


def run_mismatch(info: Dict[str, Any], entry: Dict[str, Any], column: Column, row: Row, proto: str) -> Optional[str]:
    """What a finished row run (its run.json ``info``) says differently from its entry and its row, or None."""
    if info.get("model") != entry["model"]:
        return f"ran model {info.get('model')!r}, but {ENTRY_FILE} says {entry['model']!r}"
    spec = info.get("spec") if isinstance(info.get("spec"), dict) else {}
    asked = spec.get("arch_kwargs", info.get("arch_kwargs"))  # the arguments requested (the run's own adds defaults)
    args = asked if isinstance(asked, dict) else {}
    for k, v in column.model_args.items():
        if k not in args or not _same(v, args[k]):
            return f"ran {k}={args.get(k, '(default)')}, but column {column.name!r} is {k}={v}"
    if info.get("dataset") != row.dataset:
        return f"ran dataset {info.get('dataset')!r}, but row {row.name!r} is {row.dataset!r}"
    if row.benchmark and info.get("benchmark") != row.benchmark:
        return f"ran benchmark {info.get('benchmark')!r}, but row {row.name!r} is {row.benchmark!r}"
    if proto == CONVERGED_DIR and not spec.get("converge"):
        return f"is in the {CONVERGED_DIR}/ folder but ran no --converge ladder"
    if proto in ("paper", "standard") and info.get("protocol") != proto:
        return f"ran the {info.get('protocol')} protocol, but is in the {proto}/ folder"
    attacks = _run_attacks(info)
    if attacks is None:
        return None  # a run.json from before the spec was recorded: nothing more to compare
    names = [str(a.get("attack")) for a in attacks if isinstance(a, dict)]
    if row.attack is None:
        return f"attacked with {', '.join(names)}, but row {row.name!r} has no attack" if names else None
    ran = [a for a in attacks if isinstance(a, dict) and a.get("attack") == row.attack["name"]]
    if not ran:
        return f"ran {', '.join(names) or 'no attack'}, but row {row.name!r} is {row.attack['name']}"
    params = ran[0].get("params") if isinstance(ran[0].get("params"), dict) else {}
    for k, v in attack_settings(row).items():
        if k not in params or not _same(v, params[k]):
            got = params.get(k, "(unset)")
            got = f"{got:g}" if isinstance(got, float) else got
            return f"ran {row.attack['name']} {k}={got}, but row {row.name!r} says {k}={row.attack.get(k, v)}"
    return None


def checked_folder(out: Path) -> Tuple[Study, List[Dict[str, Any]]]:
    """(the study, its entries) of folder ``out``, after every check above, every finished row run included."""
    from ..results.files.run_files import read_json
    from ..results.files.verify import is_complete

    found = entries(out)
    study = folder_study(Path(out), found)
    for e in found:
        column = study.column(e["column"])
        for proto in sorted(p.name for p in e["dir"].iterdir() if p.is_dir()):
            for r in study.rows:
                run_dir = e["dir"] / proto / r.name
                if is_complete(run_dir):
                    check_row_run(run_dir, read_json(run_dir / "run.json") or {}, e, column, r, proto)
    return study, found


def check_row_run(run_dir: Path, info: Dict[str, Any], entry: Dict[str, Any], column: Column, row: Row,
                  proto: str) -> None:
    """Refuse a row run folder whose run.json contradicts its entry or its row (an edited file, a moved run)."""
    why = run_mismatch(info, entry, column, row, proto)
    if why is not None:
        raise UserError(f"{run_dir}: the run {why}: {STUDY_FILE} or {ENTRY_FILE} was edited (or the run folder moved), "
                        f"so the table would mislabel it; restore the file, or run reproduce for that model into a "
                        f"new folder")

"""``robustbench-pid export RUN --robustbench DIR`` (``rbp.export_robustbench``): what RobustBench asks of a new entry,
written from one finished run.

DIR gets, in RobustBench's own layout (facts and sources: ``core/_data/robustbench.json``):

- ``model_info/<dataset>/<Linf|L2|corruptions>/<model id>.json``: the entry (``model_info.py``), written last, so a
  file there means everything beside it is complete;
- Linf and L2: ``external_evaluation/<model id>.pt``, the adversarial images as RobustBench's external-evaluation template
  asks ("a .pt tensor of the same size as the corresponding test set"): float32 (n, C, H, W) in [0, 1], in the
  run's sample order, which is the test set's order (``--converge``: each sample's worst case, else AutoAttack's
  final points; a plain tensor, loadable with ``torch.load(..., weights_only=True)``), and
  ``external_evaluation/<model id>.md``, the template's fields filled in from the run;
- corruptions: ``model_info/<dataset>/corruptions/unaggregated_results.csv``, the model's row of accuracies per
  (corruption, severity) in RobustBench's column order;
- ``export.json``: the source run, each file's sha256, whether the entry is RobustBench-comparable.

The run's files are read through the verified readers (records, summary, images against run.json's sha256), so
a damaged run is refused before anything is written.
"""
from __future__ import annotations

import json
import numbers
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ..core import robustbench as rb
from ..core.paths import check_path_name
from ..errors import UserError, write_error
from .model_info import Entry, Given, check_entry, corruption_entry, linf_entry, pct

FLAGS = {"name": "--name TITLE", "authors": "--authors", "venue": "--venue", "link": "--link",
         "reported": "--reported ACC", "additional_data": "--additional-data",
         "number_forward_passes": "--forward-passes N"}


@dataclass
class Exported:
    """What was written (paths), the one warning line about fields the run cannot know ("" if none), notes."""

    files: List[Path]
    entry: Dict[str, Any]
    warning: str = ""
    notes: List[str] = field(default_factory=list)


def export_robustbench(run: Union[str, Path], out: Union[str, Path], *, model_id: Optional[str] = None,
                       name: Optional[str] = None, authors: Optional[str] = None, venue: Optional[str] = None,
                       link: Optional[str] = None, reported: Union[None, str, float] = None,
                       architecture: Optional[str] = None, additional_data: Optional[bool] = None,
                       forward_passes: Optional[int] = None, eps: Union[None, str, float] = None,
                       warn: bool = True) -> Exported:
    """Write the RobustBench entry of the finished run ``run`` into ``out``; fields the run cannot know come from
    the keywords (or stay empty, named in one warning)."""
    given = check_given(model_id=model_id, name=name, authors=authors, venue=venue, link=link, reported=reported,
                        architecture=architecture, additional_data=additional_data, forward_passes=forward_passes,
                        eps=eps)
    from ..results.files.adversarial import read_adversarial, run_folder, verify_all
    from ..results.store import load_runs, summarize

    d, info = run_folder(run)
    target = Path(out)
    _check_target(target, d)
    verify_all(d, info)  # every image file of the run, before anything is written
    records = load_runs(d).records
    summary = summarize(records)
    info = {**info, "path": str(d)}
    corrupted = "corruption" in records.columns and records["corruption"].fillna("").astype(str).ne("").any()
    entry = (corruption_entry if corrupted else linf_entry)(records, summary, info, given)
    problems = check_entry(entry.info, entry.threat)
    if problems:  # the builder's own bug, never the user's input: stop before writing a wrong entry
        raise RuntimeError(f"the RobustBench entry does not fit RobustBench's field list: {problems}")
    mid = given.model_id or check_path_name(str(info.get("model")).replace(":", "-"), "the model id (--model-id)")
    images = (read_adversarial(d, attack=entry.condition["attack"], eps=entry.condition["eps"])
              if entry.condition is not None else None)  # before any write: refused when absent or damaged
    folder = target / "model_info" / entry.info["dataset"] / entry.threat
    written: List[Path] = []
    if images is not None:
        written.append(_write_tensor(target / "external_evaluation" / f"{mid}.pt", images.images))
        written.append(_write_text(target / "external_evaluation" / f"{mid}.md",
                                   _issue_text(mid, entry, info, len(images.sample_ids))))
    if entry.unaggregated is not None:
        table = entry.unaggregated.rename(index={entry.unaggregated.index[0]: mid})
        written.append(_write_text(folder / "unaggregated_results.csv", table.to_csv()))
    entry_path = folder / f"{mid}.json"
    comparable = not entry.notes
    manifest = {"run": str(d), "run_id": info.get("run_id"), "model_id": mid, "robustbench_comparable": comparable,
                "notes": entry.notes, "robustbench_facts": rb.source(),
                "files_sha256": {str(p.relative_to(target)): _sha(p) for p in written}}
    written.append(_write_text(target / "export.json", json.dumps(manifest, indent=2) + "\n"))
    written.append(_write_text(entry_path, json.dumps(entry.info, indent=2) + "\n"))  # last: the entry is complete
    line = _warning(entry.missing)
    if warn and line:
        warnings.warn(line, UserWarning, stacklevel=2)
    return Exported(written, entry.info, line, entry.notes)


def check_given(**kw: Any) -> Given:
    """The caller's fields, checked where they enter (command line and Python alike)."""
    from ..core.labels import parse_eps

    for k in ("name", "authors", "venue", "link", "architecture"):
        if kw[k] is not None and not isinstance(kw[k], str):
            raise UserError(f"export: {k} must be text, got {kw[k]!r}")
    if kw["model_id"] is not None:
        check_path_name(kw["model_id"], "the model id (--model-id)", "Name2025Title")
    if kw["additional_data"] is not None and not isinstance(kw["additional_data"], bool):
        raise UserError(f"export: additional_data must be True or False, got {kw['additional_data']!r}")
    fp = kw["forward_passes"]
    if fp is not None and (isinstance(fp, bool) or not isinstance(fp, numbers.Integral) or fp < 1):
        raise UserError(f"export: --forward-passes must be a whole number >= 1 (passes per prediction), got {fp!r}")
    rep = kw["reported"]
    if rep is not None and rep != "":
        try:
            value = float(rep) if not isinstance(rep, bool) else float("nan")
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 <= value <= 100:
            raise UserError(f"export: --reported {rep!r} must be the paper's robust accuracy in percent (0 to 100), "
                            f"e.g. 54.66, or left out")
        kw["reported"] = pct(value)
    if kw["eps"] is not None:
        if isinstance(kw["eps"], bool) or not isinstance(kw["eps"], (str, numbers.Real)):
            raise UserError(f"export: eps must be a number or text like 4/255, got {kw['eps']!r}")
        kw["eps"] = parse_eps(str(kw["eps"]))
    return Given(**kw)


def _check_target(target: Path, run_dir: Path) -> None:
    if target.exists() and not target.is_dir():
        raise UserError(f"{target} is a file: give a folder for the RobustBench files (--robustbench DIR)")
    inside = target.resolve() == run_dir.resolve() or run_dir.resolve() in target.resolve().parents
    if inside:
        raise UserError(f"{target} is inside the run folder {run_dir}: a run folder holds only what its run wrote "
                        f"(checksummed); give --robustbench a folder outside it")


def _warning(missing: List[str]) -> str:
    if not missing:
        return ""
    names = [m.split(" ")[0] for m in missing]
    shown = ", ".join(f"{m}" if " " in m else f"{m} ('')" for m in missing)
    return (f"fields the run cannot know were left at their defaults: {shown}; give "
            f"{', '.join(FLAGS[n] for n in names if n in FLAGS)}")


def _issue_text(mid: str, entry: Entry, info: Dict[str, Any], n: int) -> str:
    """RobustBench's "New external evaluation(s)" issue fields, filled in from the run."""
    e = entry.info
    acc = e.get("external", e.get("autoattack_acc"))
    method = ("robustbench_pid --converge: " if "external" in e else "AutoAttack (standard) via robustbench_pid: ")
    return "\n".join([
        f"## Target model\n+ **Model identifier(s):** {mid}",
        f"+ **Leaderboard(s):** {e['dataset']}, {entry.threat} (eps {e['eps']})",
        "\n## New evaluation",
        f"+ **Link to adversarial images:** {mid}.pt ({n:,} images, float32 in [0, 1], the test set's order)",
        f"+ **Robust accuracy:** {acc}%", f"+ **Author(s):** {e['authors']}",
        f"+ **Description of the method used:** {method}{e.get('footnote', '')}",
        *(f"\nNote: {x}" for x in entry.notes), ""])


def _sha(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_text(path: Path, text: str) -> Path:
    from ..results.files.run_files import atomic_write_bytes

    _mkdir(path.parent)
    atomic_write_bytes(path, text.encode())
    return path


def _write_tensor(path: Path, images: Any) -> Path:
    """A plain float32 tensor, written to a temp file and renamed (no half-written file under the final name)."""
    import torch

    _mkdir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(torch.from_numpy(images).contiguous(), f)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        err = write_error(exc, path)
        if err is None:
            raise
        raise err from None
    return path


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {folder}: {exc.strerror or exc}; give --robustbench a writable folder") from None


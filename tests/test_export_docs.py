"""docs/results.md's "Results that travel" numbers are what docs/export_numbers.py renders from a fresh run of the
worked example and from files the writer produces, never typed by hand."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("export_numbers", ROOT / "docs" / "export_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["export_numbers"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_results_md_blocks_equal_a_fresh_run_of_the_worked_example():
    numbers = _script()
    bodies = numbers.rendered()
    assert numbers.stale_blocks(bodies) == []
    assert "| 8-bit (where the verdict survives it) | 150," in bodies["export-disk"]
    assert '"autoattack_acc": "' in bodies["export-example"] and "warning: fields the run cannot know" in \
        bodies["export-example"]


def test_a_hand_edited_number_is_noticed(monkeypatch, tmp_path):
    numbers = _script()
    doc = tmp_path / "results.md"
    text = (ROOT / "docs" / "results.md").read_text()
    doc.write_text(text.replace("| 8-bit (where the verdict survives it) | 150,", "| 8-bit (where the verdict "
                                                                                  "survives it) | 140,"))
    monkeypatch.setattr(numbers, "DOC", doc)
    body = {"export-disk": numbers.disk_block().rstrip("\n") + "\n"}
    assert numbers.stale_blocks(body) == ["docs/results.md: block export-disk"]

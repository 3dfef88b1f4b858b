"""Every writer replaces a symlink standing at its output path instead of writing through it (issue 45): a link
in an output folder can point anywhere, and writing through it changed a file outside that folder. Plots, the
report, tables, the baseline and its sidecar, the study copy and doctor's JSON all go through a temp file and a
rename; the file outside stays as it was and the link becomes a regular file holding the output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from robustbench_pid.cli import main

SECRET = b"outside the output folder\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "r"
    assert main(["evaluate", "--model", "pid_deit", "--attack", "fgsm", "--eps", "1/255", "--eps", "2/255",
                 "--limit", "8", "--quiet", "--device", "cpu", "--out", str(out)]) == 0
    return out


def _link(tmp_path: Path, at: Path) -> Path:
    """A symlink at ``at`` to a file outside its folder; returns that file."""
    target = tmp_path / "elsewhere" / f"{at.name}.victim"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(SECRET)
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return target


def _replaced(at: Path, victim: Path) -> None:
    assert victim.read_bytes() == SECRET, f"{victim} was written through the link at {at}"
    assert at.is_file() and not at.is_symlink() and at.stat().st_size > 0


def test_plot_replaces_links_in_its_folder(run_dir, tmp_path, capsys):
    d = tmp_path / "plots"
    victims = {name: _link(tmp_path, d / name) for name in ("eps_curves_top1.png", "eps_curves_top1.svg")}
    assert main(["plot", str(run_dir), "--out", str(d)]) == 0
    for name, victim in victims.items():
        _replaced(d / name, victim)
    assert (d / "eps_curves_top1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_report_and_baseline_replace_links(run_dir, tmp_path, capsys):
    table, report = tmp_path / "o" / "t.md", tmp_path / "o" / "r.html"
    victims = {p: _link(tmp_path, p) for p in (table, report)}
    assert main(["table", str(run_dir), "-o", str(table)]) == 0
    assert main(["report", str(run_dir), "-o", str(report)]) == 0
    for p, victim in victims.items():
        _replaced(p, victim)
    assert "| FGSM" in table.read_text() and "<html" in report.read_text().lower()
    # a baseline (and its per-sample sidecar) linked to a shared one elsewhere: --update writes here, not there
    shared = tmp_path / "shared" / "base.csv"
    assert main(["check", str(run_dir), "--baseline", str(shared), "--update", "--metric", "top5"]) == 0
    before = {p: p.read_bytes() for p in (shared, shared.with_name("base.samples.parquet"))}
    base = tmp_path / "b" / "base.csv"
    base.parent.mkdir()
    base.symlink_to(shared)
    base.with_name("base.samples.parquet").symlink_to(shared.with_name("base.samples.parquet"))
    assert main(["check", str(run_dir), "--baseline", str(base), "--update"]) == 0
    assert {p: p.read_bytes() for p in before} == before, "the shared baseline was written through the links"
    for p in (base, base.with_name("base.samples.parquet")):
        assert p.is_file() and not p.is_symlink()
    assert main(["check", str(run_dir), "--baseline", str(base)]) == 0  # the baseline written is a working one
    assert "top1" in base.read_text() and "top1" not in shared.read_text()


def test_reproduce_writes_the_study_copy_instead_of_through_a_link(tmp_path, capsys):
    out = tmp_path / "study"
    victim = _link(tmp_path, out / "study.toml")
    victim.unlink()  # a dangling link: is_file() is False, so reproduce writes its copy there
    assert main(["reproduce", "digits-smoke", "--model", "pid_deit", "--only", "clean", "--limit", "4", "--quiet",
                 "--device", "cpu", "--out", str(out)]) == 0
    assert not victim.exists(), "the study copy was written through the link"
    assert (out / "study.toml").is_file() and not (out / "study.toml").is_symlink()
    assert "Digits smoke study" in (out / "study.toml").read_text()


def test_doctor_json_replaces_a_link(tmp_path, monkeypatch):
    import io

    import torch

    from robustbench_pid import doctor
    from robustbench_pid.doctor.base import Settings

    monkeypatch.setattr(doctor, "plan", lambda s: [])
    js = tmp_path / "d" / "doctor.json"
    victim = _link(tmp_path, js)
    doctor.run_doctor("cpu", quick=True, json_path=js, out=io.StringIO(),
                      settings=Settings(torch.device("cpu"), True, tmp_path))
    _replaced(js, victim)
    assert json.loads(js.read_text())["exit_code"] == 0

"""Issue 65: the leaderboard surfaces say the real cause, with nothing else on the screen.

A file saved in a checkpoint's place that is no checkpoint (an HTML download page, an empty file, a Git LFS pointer)
is named as what it is, with the advice to download it again, never ``--allow-pickle``; other packages'
deprecation warnings stay off the screen unless ``ROBUSTBENCH_PID_VERBOSE`` is set; an L2 radius typed in L-inf
units gets one note; the evidence header never prints an empty list of indicators."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from robustbench_pid.cli import evaluate_main
from robustbench_pid.errors import CheckpointError
from robustbench_pid.hub import sniff
from robustbench_pid.loaders.file import load_file
from robustbench_pid.results.report.evidence_text import format_evidence
from robustbench_pid.runtime import third_party

HTML = (b"<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head><body><form "
        b"action='https://drive.usercontent.google.com/download'>Download anyway</form></body></html>")
LFS_SHA = "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393"
LFS = f"version https://git-lfs.github.com/spec/v1\noid sha256:{LFS_SHA}\nsize 146214617\n".encode()
KINDS = {"html": (HTML, "an HTML page (title 'Google Drive - Virus scan warning')"),
         "empty": (b"", "an empty file (0 bytes)"),
         "lfs": (LFS, "a Git LFS pointer")}


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _the_line(kind: str, line: str) -> None:
    """What every such error line must say: what the file is, that it is no checkpoint, to download it again;
    never the pickle advice."""
    assert line.startswith("error: "), line
    assert f"is not a checkpoint: it is {KINDS[kind][1]}" in line, line
    assert "Download the file again" in line and "allow-pickle" not in line and "pickle" not in line.lower(), line
    if kind == "lfs":  # the pointer names the real file: its size and sha256 are in the advice
        assert f"146,214,617 bytes, sha256 {LFS_SHA}" in line, line


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sniff_names_each_stand_in_by_its_first_bytes(tmp_path: Path, kind: str) -> None:
    found = sniff.sniff(_write(tmp_path / "x.pt", KINDS[kind][0]))
    assert found is not None and found.what.startswith(KINDS[kind][1])
    if kind == "lfs":
        assert (found.size, found.sha256) == (146214617, LFS_SHA)


def test_sniff_leaves_real_checkpoints_and_other_content_to_the_loader(tmp_path: Path) -> None:
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    torch.save(sd, tmp_path / "zip.pt")
    torch.save(sd, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    save_file(sd, str(tmp_path / "w.safetensors"))
    _write(tmp_path / "garbage.pt", b"\x80\x02garbage")
    for name in ("zip.pt", "legacy.pt", "w.safetensors", "garbage.pt"):
        assert sniff.sniff(tmp_path / name) is None, name
    assert sniff.sniff(_write(tmp_path / "e.pt", b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>")
                       ).what == "an XML document"
    assert sniff.sniff(_write(tmp_path / "bom.pt", b"\xef\xbb\xbf\n  <html><body>sign in</body></html>")
                       ).what == "an HTML page"


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("allow_pickle", [False, True])
def test_a_stand_in_given_as_checkpoint_file_is_named_even_with_allow_pickle(tmp_path: Path, kind: str,
                                                                          allow_pickle: bool) -> None:
    path = _write(tmp_path / "w.pt", KINDS[kind][0])
    with pytest.raises(CheckpointError) as exc:
        load_file(str(path), allow_pickle=allow_pickle)
    _the_line(kind, f"error: {exc.value}")


@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors"])
def test_a_truncated_checkpoint_is_damage_and_never_gets_the_pickle_advice(tmp_path: Path, fmt: str) -> None:
    """Half of a real file (torch's zip, its legacy format, safetensors): damage, to be downloaded again. The legacy
    format starts with complete small pickles, so 'it parses as a pickle' alone must not call it a pickle of objects."""
    sd = {"w": torch.randn(64, 64)}
    full = tmp_path / ("w.safetensors" if fmt == "safetensors" else "w.pt")
    if fmt == "safetensors":
        save_file(sd, str(full))
    else:
        torch.save(sd, full, _use_new_zipfile_serialization=fmt == "zip")
    half = _write(tmp_path / f"half{full.suffix}", full.read_bytes()[:full.stat().st_size // 2])
    with pytest.raises(CheckpointError) as exc:
        load_file(str(half))
    msg = str(exc.value)
    assert "pickle" not in msg and ("corrupt, truncated" in msg or "damaged or truncated" in msg), msg
    assert "download or copy it again" in msg.lower(), msg


def test_a_checkpoint_that_pickles_objects_still_gets_the_opt_in_advice(tmp_path: Path) -> None:
    import argparse

    torch.save({"w": torch.zeros(2), "args": argparse.Namespace(lr=0.1)}, tmp_path / "obj.pt",
               _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"refused to load: it pickles `argparse.Namespace`.*--allow-pickle"):
        load_file(str(tmp_path / "obj.pt"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_zoo_models_checkpoint_file_that_is_a_stand_in_is_one_error_line(tmp_path: Path, capsys, kind: str
                                                                          ) -> None:
    path = _write(tmp_path / "deit.pth", KINDS[kind][0])
    out = tmp_path / "run"
    code = evaluate_main(["--model", "deit", "--checkpoint", str(path), "--attack", "pgd", "--eps", "1/255",
                          "--limit", "4", "--quiet", "--out", str(out)])
    got = capsys.readouterr()
    assert code == 2 and got.out == ""
    lines = got.err.strip().splitlines()
    assert len(lines) == 1, got.err
    _the_line(kind, lines[0])
    assert str(path) in lines[0]
    assert not (out / "records.parquet").exists() and not (out / "summary.csv").exists()


def test_a_shipped_checkpoint_replaced_by_an_lfs_pointer_says_to_restore_it(tmp_path: Path, monkeypatch) -> None:
    from robustbench_pid.loaders import embedded

    entry = {"file": "deit_digits.safetensors", "sha256": "0" * 64, "arch": "deit"}
    monkeypatch.setattr(embedded, "manifest_entry", lambda name: entry)
    monkeypatch.setattr(embedded, "checkpoints_dir", lambda: tmp_path)
    _write(tmp_path / entry["file"], LFS)
    with pytest.raises(CheckpointError, match=r"is not a checkpoint: it is a Git LFS pointer.*git lfs pull.*"
                                              r"Restore the shipped checkpoints"):
        embedded.load_embedded("deit")


def test_other_packages_deprecations_go_to_the_debug_log_and_ours_stay(monkeypatch, caplog) -> None:
    monkeypatch.delenv(third_party.VERBOSE_ENV, raising=False)
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, *a, **k: shown.append((category,
                                                                                                  str(message))))
    ours = str(Path(third_party.__file__))
    with caplog.at_level(logging.DEBUG, logger=third_party.LOG.name), warnings.catch_warnings():
        warnings.simplefilter("always")
        with third_party.quiet_deprecations():
            warnings.warn_explicit("moved", FutureWarning, "/site-packages/timm/models/registry.py", 4)
            warnings.warn_explicit("old", DeprecationWarning, "/site-packages/x/y.py", 1)
            warnings.warn_explicit("theirs, not a deprecation", UserWarning, "/site-packages/x/y.py", 2)
            warnings.warn_explicit("ours", FutureWarning, ours, 1)
    assert shown == [(UserWarning, "theirs, not a deprecation"), (FutureWarning, "ours")]
    logged = [r.getMessage() for r in caplog.records if r.name == third_party.LOG.name]
    assert len(logged) == 2 and "timm/models/registry.py:4: FutureWarning: moved" in logged[0]
    shown.clear()
    monkeypatch.setenv(third_party.VERBOSE_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with third_party.quiet_deprecations():
            warnings.warn_explicit("moved", FutureWarning, "/site-packages/timm/models/registry.py", 4)
    assert shown == [(FutureWarning, "moved")]


@pytest.mark.parametrize("eps, noted", [("8/255", True), ("0.05", True), ("0.5", False), ("0.1", False)])
def test_an_l2_radius_below_the_usual_ones_runs_with_one_note(tmp_path: Path, capsys, eps: str, noted: bool
                                                              ) -> None:
    code = evaluate_main(["--model", "deit", "--attack", "pgd_l2", "--eps", eps, "--steps", "2", "--limit", "4",
                          "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0 and (tmp_path / "run" / "records.parquet").is_file()
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    if not noted:
        assert notes == []
        return
    assert len(notes) == 1, err
    radius = "8/255 = 0.03137" if eps == "8/255" else "0.05"
    assert f"--attack pgd_l2 --eps {radius}: an L2 radius well below the usual ones (0.25 / 0.5 / 1.0 on CIFAR, 3.0 " \
           f"on ImageNet)" in notes[0] and "--eps 0.5" in notes[0]


def test_the_python_attack_entry_notes_a_small_l2_radius_too(capsys) -> None:
    import robustbench_pid as rbp

    x, y = torch.rand(2, 3, 32, 32), torch.tensor([1, 2])
    adv = rbp.attack("deit", x, y, "pgd_l2", "8/255", dataset="digits", steps=1)
    assert float((adv - x).flatten(1).norm(dim=1).max()) <= 8 / 255 + 1e-6  # run at the radius given
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")][0].startswith(
        "note: --attack pgd_l2 --eps 8/255 = 0.03137: an L2 radius well below")


def _passes_only(attack: str) -> pd.DataFrame:
    return pd.DataFrame([{"model": "m", "attack": attack, "setting": attack, "eps": 8 / 255, "norm": "linf",
                          "metric": m, "value": v} for m, v in (("passes_forward", 10.0), ("passes_backward", 5.0))])


def test_the_evidence_header_never_prints_an_empty_list_of_indicators() -> None:
    head = format_evidence(_passes_only("autoattack")).splitlines()[0]
    assert "()" not in head and "(;" not in head and "shown" not in head
    assert head.startswith("evidence that each attack worked: passes per attacked sample; no indicator of attack "
                           "failure applies to these attacks without an extra run (docs/attacks.md)")
    # --indicators cannot see a library loop's iterates: only what it would compute is offered
    assert head.endswith("; unconstrained, unstable, transfer need --indicators (an extra run per attack)")
    pgd = format_evidence(_passes_only("pgd")).splitlines()[0]
    assert "silent, incomplete, unconstrained, no-grad, unstable, transfer need --indicators" in pgd
    rows = pd.concat([_passes_only("pgd"), pd.DataFrame([{"model": "m", "attack": "pgd", "setting": "pgd",
                                                          "eps": 8 / 255, "norm": "linf", "metric": "silent_success",
                                                          "value": 0.0}])])
    assert "indicator of attack failure shown (silent; docs/attacks.md)" in format_evidence(rows).splitlines()[0]


# --- robustbench: models, through RobustBench's own loader, in a fresh process (its import is process-wide) ---

from test_robustbench_models import _cifar, package  # noqa: E402,F401  (the fetched release; a CIFAR-10 test file)


def _evaluate_standard(tmp_path: Path, *extra: str, env: dict = None) -> subprocess.CompletedProcess:
    from robustbench_pid.hub import robustbench_pkg as rp

    dead = "http://127.0.0.1:9"  # a download attempt fails loudly
    base = {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead,
            "ROBUSTBENCH_PID_PACKAGES": str(rp.packages_dir()), "OMP_NUM_THREADS": "1"}
    base.pop(third_party.VERBOSE_ENV, None)
    data = tmp_path / "data" if (tmp_path / "data").exists() else _cifar(tmp_path / "data", n=4)
    cmd = [sys.executable, "-m", "robustbench_pid", "evaluate", "--model", "robustbench:Standard", "--dataset",
           "cifar10", "--data-root", str(data), "--checkpoint-dir", str(tmp_path / "models"), "--attack", "pgd",
           "--eps", "8/255", "--device", "cpu", "--out", str(tmp_path / "run"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env={**base, **(env or {})}, timeout=300)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_robustbench_checkpoint_that_is_a_stand_in_is_one_error_line(package: Path, tmp_path: Path, kind: str
                                                                      ) -> None:
    path = _write(tmp_path / "models" / "cifar10" / "Linf" / "Standard.pt", KINDS[kind][0])
    for extra in ((), ("--allow-pickle",)):
        out = _evaluate_standard(tmp_path, *extra)
        assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        _the_line(kind, lines[0])
        assert str(path) in lines[0] and "robustbench.utils.load_model('Standard'" in lines[0]
        assert not (tmp_path / "run" / "records.parquet").exists()


def test_a_missing_robustbench_checkpoint_prints_one_line_and_verbose_mode_shows_the_rest(package: Path,
                                                                                        tmp_path: Path) -> None:
    out = _evaluate_standard(tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: robustbench:Standard"), \
        out.stderr
    loud = _evaluate_standard(tmp_path, env={third_party.VERBOSE_ENV: "1"})
    assert loud.returncode == 2
    moved = [line for line in loud.stderr.splitlines() if "FutureWarning" in line]
    assert any("timm.models.registry" in line for line in moved), loud.stderr  # what the default mode keeps off
    assert loud.stderr.strip().splitlines()[-1] == out.stderr.strip()

"""A study folder's hand-editable files are checked against the runs they describe and the shipped study (issue 45):
an entry.json naming another column or model mislabelled the comparison, an edited study.toml copy showed an
invented "published" value, and a damaged entry.json (a list, a string, no model) was a traceback. Each is now one
error line naming the file, what differs and the fix, and the fix it names works."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from robustbench_pid.cli import main

ONLY = ["--only", "clean", "--only", "fgsm-2"]


def _reproduce(study: str, out: Path, model: str = "pid_deit", *extra: str) -> int:
    return main(["reproduce", study, "--model", model, *ONLY, "--limit", "4", "--quiet", "--device", "cpu",
                 "--out", str(out), *extra])


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("study") / "smoke"
    assert _reproduce("digits-smoke", out) == 0
    return out


@pytest.fixture()
def folder(made, tmp_path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(made, out)
    return out


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    return err


def _entry(folder: Path) -> Path:
    return folder / "pid_deit@PID-DeiT-digits" / "entry.json"


def test_the_folder_as_written_reads_back(folder, capsys):
    assert main(["merge", str(folder)]) == 0
    info = json.loads(_entry(folder).read_text())
    assert info["shipped"] is True and len(info["study_sha256"]) == 64
    assert "| Clean | Top-1 Acc (%) | 99.72 |" in (folder / "table.md").read_text()


@pytest.mark.parametrize("key, value, says", [
    ("column", "Softmax DeiT (digits)", "says model 'pid_deit', column 'Softmax DeiT (digits)', but its folder is "
                                        "'pid_deit@PID-DeiT-digits'"),
    ("model", "deit", "says model 'deit', column 'PID DeiT (digits)', but its folder is 'pid_deit@PID-DeiT-digits'"),
    ("model_args", {"depth": 2}, "model_args {'depth': 2} differ from those of column 'PID DeiT (digits)'"),
    ("study", "claims-digits", "its entries name different studies"),
])
def test_an_edited_entry_is_refused_naming_what_differs(folder, capsys, key, value, says):
    e = _entry(folder)
    info = json.loads(e.read_text())
    info[key] = value
    e.write_text(json.dumps(info))
    if key == "study":  # one entry of another study beside the real one
        other = folder / "deit@Softmax-DeiT-digits"
        other.mkdir()
        (other / "entry.json").write_text(json.dumps({**info, "model": "deit", "column": "Softmax DeiT (digits)",
                                                      "study": "digits-smoke"}))
    for argv in (["merge", str(folder)], ["report", str(folder), "-o", str(folder.parent / "r.html")]):
        err = _error(capsys, *argv)
        assert says in err
    assert not (folder.parent / "r.html").exists()


@pytest.mark.parametrize("text, says", [('["pid_deit"]', "a JSON list, not an object"), ('"pid_deit"', "a JSON str"),
                                        ('{"column": "PID DeiT (digits)"}', "no 'model' text in it"),
                                        ('{"model": "pid_deit", "column": 3}', "no 'column' text in it")])
def test_a_damaged_entry_is_one_error_line_and_the_fix_it_names_works(folder, capsys, text, says):
    _entry(folder).write_text(text)
    err = _error(capsys, "merge", str(folder))
    assert says in err and "run reproduce for that model again into this folder" in err
    assert _reproduce("digits-smoke", folder) == 0  # the fix: the entry is rewritten, the finished rows are kept
    assert json.loads(_entry(folder).read_text())["model"] == "pid_deit"
    assert main(["merge", str(folder)]) == 0


def test_an_invented_published_value_in_the_study_copy_is_refused(folder, capsys):
    copy = folder / "study.toml"
    copy.write_text(copy.read_text().replace('published."PID DeiT (digits)" = { top1 = 99.72, top5 = 100.0 }',
                                             'published."PID DeiT (digits)" = { top1 = 12.34, top5 = 100.0 }'))
    err = _error(capsys, "merge", str(folder))
    assert "study.toml was changed after pid_deit@PID-DeiT-digits ran" in err
    for e in folder.glob("*/entry.json"):  # a folder from before the hash was recorded: the shipped study still says
        info = json.loads(e.read_text())
        del info["study_sha256"], info["shipped"]
        e.write_text(json.dumps(info))
    err = _error(capsys, "merge", str(folder))
    assert "differs from the shipped study 'digits-smoke'" in err
    assert "row 'clean', column 'PID DeiT (digits)': published top1 12.34 where the study has 99.72" in err
    assert "restore it with a copy of" in err
    shutil.copyfile(Path(err.split("restore it with a copy of ")[1].split(", or run")[0]), copy)  # the fix it names
    assert main(["merge", str(folder)]) == 0


def test_a_row_edited_in_the_copy_of_your_own_study_is_refused_by_its_run(tmp_path, capsys):
    """A study of your own has no shipped definition: the entries' hash, and the runs themselves, say what ran."""
    from robustbench_pid.studies.spec import STUDIES_DIR

    mine = tmp_path / "mine.toml"
    shutil.copyfile(STUDIES_DIR / "digits-smoke.toml", mine)
    out = tmp_path / "mine"
    assert _reproduce(str(mine), out) == 0
    assert json.loads(_entry(out).read_text())["shipped"] is False
    copy = out / "study.toml"
    copy.write_text(copy.read_text().replace('attack = { name = "fgsm", eps = "2/255" }',
                                             'attack = { name = "fgsm", eps = "8/255" }'))
    assert "study.toml was changed after" in _error(capsys, "merge", str(out))
    info = json.loads(_entry(out).read_text())
    del info["study_sha256"]
    _entry(out).write_text(json.dumps(info))
    err = _error(capsys, "merge", str(out))
    assert "fgsm-2: the run ran fgsm eps=0.00784314, but row 'fgsm-2' says eps=8/255" in err
    copy.write_text(copy.read_text().replace('name = "fgsm", eps = "8/255" }', 'name = "pgd", eps = "2/255" }', 1))
    assert "the run ran fgsm, but row 'fgsm-2' is pgd" in _error(capsys, "merge", str(out))


def test_a_run_of_another_model_in_an_entry_is_refused(folder, capsys):
    """An entry folder holding a row run of another model (a run folder moved in by hand)."""
    run = folder / "pid_deit@PID-DeiT-digits" / "standard" / "clean" / "run.json"
    info = json.loads(run.read_text())
    info["model"] = "deit"
    run.write_text(json.dumps(info))
    err = _error(capsys, "report", str(folder), "-o", str(folder / "r.html"))  # merge would finalize it again
    assert "clean: the run ran model 'deit', but entry.json says 'pid_deit'" in err and not (folder / "r.html").exists()


def test_a_folder_of_an_earlier_version_of_a_shipped_study_is_extended_not_refused(folder, capsys):
    """A shipped study that since gained a row is no edit: the folder reads back, and reproduce brings its copy up
    to date (finished runs kept); a copy whose existing row was changed is still refused, in reads and in runs."""
    copy = folder / "study.toml"
    text = copy.read_text()
    i = text.index("[[row]]\nname = \"pgd-4\"")
    j = text.index("[[row]]", i + 1)
    older = text[:i] + text[j:]  # the study as it was before it had row pgd-4
    copy.write_text(older)
    entry = json.loads(_entry(folder).read_text())
    _entry(folder).write_text(json.dumps({**entry, "study_sha256": __import__("hashlib").sha256(
        copy.read_bytes()).hexdigest()}))
    assert main(["merge", str(folder)]) == 0  # rows the shipped study added are no difference
    capsys.readouterr()
    assert _reproduce("digits-smoke", folder) == 0
    assert "made by an earlier version of study 'digits-smoke'" in capsys.readouterr().out
    assert copy.read_text() == text and main(["merge", str(folder)]) == 0
    changed = text.replace('name = "fgsm", eps = "2/255"', 'name = "fgsm", eps = "3/255"', 1)
    assert changed != text
    copy.write_text(changed)
    entry = json.loads(_entry(folder).read_text())
    _entry(folder).write_text(json.dumps({**entry, "study_sha256": __import__("hashlib").sha256(
        copy.read_bytes()).hexdigest()}))
    assert "differs from the shipped study" in _error(capsys, "merge", str(folder))
    assert _reproduce("digits-smoke", folder) == 2
    assert "holds another study" in capsys.readouterr().err

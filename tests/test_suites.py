"""Suite files: the shipped ones load with the published settings; bad files are refused with the
file, the key and the reason."""
from __future__ import annotations

import pytest

from robustbench_pid.errors import UserError
from robustbench_pid.run.suites import load_suite, suite_names


def _settings(suite, name):
    return [s.params for s in suite["attacks"] if s.attack == name]


def test_shipped_suites_load():
    names = suite_names()
    for n in ("smoke", "paper-table1", "eps-sweep", "autoattack"):
        assert n in names
        s = load_suite(n)
        assert s["attacks"] and s["description"]


def test_paper_table1_has_the_published_settings():
    s = load_suite("paper-table1")
    assert [a.attack for a in s["attacks"]] == ["fgsm", "pgd", "spsa", "sld", "noise"]
    (fgsm,) = _settings(s, "fgsm")
    assert fgsm["eps"] == pytest.approx(3 / 255)
    (pgd,) = _settings(s, "pgd")
    assert pgd["eps"] == pytest.approx(3 / 255) and pgd["steps"] == 20
    assert pgd["step_size_factor"] == 0.15 and pgd["random_start"] is True
    (spsa,) = _settings(s, "spsa")
    assert (spsa["eps"], spsa["iterations"], spsa["lr"], spsa["fd_delta"], spsa["n_samples"]) == (0.1, 40, 0.01, 0.01, 128)
    (sld,) = _settings(s, "sld")
    assert (sld["eps"], sld["step_size"], sld["iterations"], sld["q"]) == (10.0, 1.0, 20, 99.0)
    (noise,) = _settings(s, "noise")
    assert noise["eps"] == 0.3


def test_eps_sweep_is_one_to_six_over_255_for_fgsm_and_pgd():
    s = load_suite("eps-sweep")
    grid = [i / 255 for i in range(1, 7)]
    assert [p["eps"] for p in _settings(s, "fgsm")] == pytest.approx(grid)
    pgd = _settings(s, "pgd")
    assert [p["eps"] for p in pgd][:6] == pytest.approx(grid)
    assert all(p["step_size_factor"] == 0.15 and p["steps"] == 20 for p in pgd)


def test_autoattack_suite():
    s = load_suite("autoattack")
    aa = _settings(s, "autoattack")
    assert [p["eps"] for p in aa] == pytest.approx([1 / 255, 4 / 255])
    assert all(p["version"] == "standard" for p in aa)


@pytest.mark.parametrize("body,needles", [
    ('bogus = 1\n[[attack]]\nname = "fgsm"\n', ["bogus", "unknown top-level"]),
    ('protocol = "paper"\n[[attack]]\nname = "fgsm"\n', ["protocol", "--protocol"]),
    ('[[attack]]\nname = "nope"\n', ["#1", "nope"]),
    ('[[attack]]\nname = "fgsm"\nsteps = 3\n', ["#1", "steps", "fgsm"]),
    ('[[attack]]\nname = "fgsm"\n[[attack]]\nname = "pgd"\nsteps = "many"\n', ["#2", "steps", "int"]),
    ('[[attack]]\nname = "pgd"\neps = "3/0"\n', ["#1", "eps"]),
    ('[[attack]]\nname = "pgd"\neps = [-0.1]\n', ["#1", "eps", ">= 0"]),
    ('[[attack]]\nname = "pgd"\neps = []\n', ["#1", "eps", "empty"]),
    ('[[attack]]\nname = "pgd"\neps = true\n', ["#1", "eps"]),
    ('[[attack]]\nname = "pgd"\neps = 3\n', ["#1", "3/255"]),
    ('[[attack]]\nname = "pgd"\nrandom_start = "maybe"\n', ["random_start", "bool"]),
    ('[[attack]]\nname = "sld"\nq = 100\n', ["q", "[0, 100)"]),
    ('[[attack]]\nname = "spsa"\nlr = -1\n', ["lr", "> 0"]),
    ('[[attack]]\nname = "pgd"\nstop_topk = 0\n', ["stop_topk"]),
    ('[[attack]]\nsteps = 3\n', ["missing key 'name'"]),
    ('description = "x"\n', ["[[attack]]"]),
    ('[[attack]\nname = "pgd"\n', ["not valid TOML"]),
    ('description = 3\n[[attack]]\nname = "fgsm"\n', ["description", "string"]),
])
def test_bad_suites_are_refused_with_file_key_reason(tmp_path, body, needles):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(UserError) as exc:
        load_suite(str(path))
    msg = str(exc.value)
    assert str(path) in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_unknown_suite_name_lists_the_valid_ones():
    with pytest.raises(UserError) as exc:
        load_suite("no-such-suite")
    assert "paper-table1" in str(exc.value)


def test_l1_and_l2_eps_not_bounded_by_one(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[[attack]]\nname = "sld"\neps = 10.0\n[[attack]]\nname = "cw"\neps = 2.5\n'
                    '[[attack]]\nname = "pgd_l2"\neps = 3\n')
    s = load_suite(str(path))
    assert [a.params["eps"] for a in s["attacks"]] == [10.0, 2.5, 3.0]

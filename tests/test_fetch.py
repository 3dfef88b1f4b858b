"""``robustbench-pid fetch`` and registry names, offline: a loopback HTTP server (Range support) serves a small
checkpoint; success, a hash mismatch refused, a partial download resumed, and ``--checkpoint NAME`` with the
file present (verified, recorded) and absent (one line with the URL, the fetch command and where to put it)."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pandas as pd
import pytest
import torch

import robustbench_pid.hub.released as released
from robustbench_pid.cli import main
from robustbench_pid.errors import CheckpointError
from robustbench_pid.loaders import read_checkpoint
from robustbench_pid.models import load_model
from robustbench_pid.results.files.run_files import default_out
from robustbench_pid.run.spec_builder import build_spec
from zoo_helpers import randomized


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /NAME from ``files``; honours ``Range: bytes=N-`` with 206; logs every request's Range header."""

    files: Dict[str, bytes] = {}
    seen: List[Tuple[str, str]] = []
    ignore_range = False  # answer 200 with the whole file, as a server without Range support does
    cut_next = 0  # cut the connection after this many bytes of the next response (0: never)

    def do_GET(self) -> None:  # noqa: N802
        name = self.path.lstrip("/")
        rng = self.headers.get("Range", "")
        self.seen.append((name, rng))
        if name not in self.files:
            self.send_error(404)
            return
        data, status = self.files[name], 200
        if rng.startswith("bytes=") and not self.ignore_range:
            start = int(rng[len("bytes="):].split("-")[0])
            if start >= len(data):
                self.send_error(416)
                return
            data, status = data[start:], 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        cut, type(self).cut_next = type(self).cut_next, 0
        self.wfile.write(data[:cut] if cut else data)
        if cut:
            self.close_connection = True

    def log_message(self, *args: object) -> None:  # keep the test output quiet
        pass


@pytest.fixture()
def server() -> Iterator[Tuple[str, type]]:
    handler = type("Handler", (_Handler,), {"files": {}, "seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.timeout = 5
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _checkpoint_bytes(seed: int = 0) -> bytes:
    """A DeiT-release-style file ({'model': state_dict}) of the digits DeiT, as bytes."""
    buf = io.BytesIO()
    torch.save({"model": randomized("deit_digits_patch4_32", seed).state_dict()}, buf)
    return buf.getvalue()


def test_fetch_url_downloads_verifies_and_refuses_a_mismatch(server, tmp_path: Path, capsys) -> None:
    url, h = server
    data = _checkpoint_bytes()
    h.files["w.pth"] = data
    sha = hashlib.sha256(data).hexdigest()
    assert main(["fetch", f"{url}/w.pth", "--sha256", sha, "--to", str(tmp_path / "a"), "--quiet"]) == 0
    assert (tmp_path / "a" / "w.pth").read_bytes() == data and not (tmp_path / "a" / "w.pth.part").exists()
    assert "sha256 ok" in capsys.readouterr().out
    # a prefix (as torch.hub checks a file name's hash) is enough
    assert main(["fetch", f"{url}/w.pth", "--sha256", sha[:8], "--to", str(tmp_path / "p"), "--quiet"]) == 0
    # the wrong hash: refused, nothing under the final name, no part left to resume
    bad = ("0" if sha[0] != "0" else "1") + sha[1:]
    assert main(["fetch", f"{url}/w.pth", "--sha256", bad, "--to", str(tmp_path / "b"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not match the expected" in err and "nothing was written" in err
    assert not (tmp_path / "b" / "w.pth").exists() and not (tmp_path / "b" / "w.pth.part").exists()
    # a URL needs --sha256; a bad hash argument is named
    assert main(["fetch", f"{url}/w.pth", "--to", str(tmp_path / "c")]) == 2
    assert "needs --sha256" in capsys.readouterr().err
    assert main(["fetch", f"{url}/w.pth", "--sha256", "xyz", "--to", str(tmp_path / "c")]) == 2
    assert "64 hex digits" in capsys.readouterr().err
    assert main(["fetch", f"{url}/missing.pth", "--sha256", sha, "--to", str(tmp_path / "c"), "--quiet"]) == 2
    assert "404" in capsys.readouterr().err and not (tmp_path / "c" / "missing.pth").exists()
    # no lock file is left beside the downloads, after a download or a refused one (issue 33)
    assert sorted(p.name for p in tmp_path.rglob("*.lock")) == []


def test_a_partial_download_is_resumed_with_a_range_request(server, tmp_path: Path) -> None:
    url, h = server
    data = _checkpoint_bytes(1)
    h.files["w.pth"] = data
    (tmp_path / "w.pth.part").write_bytes(data[:1000])  # an interrupted earlier fetch
    sha = hashlib.sha256(data).hexdigest()
    assert main(["fetch", f"{url}/w.pth", "--sha256", sha, "--to", str(tmp_path), "--quiet"]) == 0
    assert h.seen == [("w.pth", "bytes=1000-")]  # only the missing bytes were asked for
    assert (tmp_path / "w.pth").read_bytes() == data and not (tmp_path / "w.pth.part").exists()
    # a complete part (the server answers 416 to the range) is verified and kept
    (tmp_path / "v.pth.part").write_bytes(data)
    h.files["v.pth"] = data
    assert main(["fetch", f"{url}/v.pth", "--sha256", sha, "--to", str(tmp_path), "--quiet"]) == 0
    assert h.seen[-1] == ("v.pth", f"bytes={len(data)}-") and (tmp_path / "v.pth").read_bytes() == data



def test_a_dropped_connection_keeps_the_part_and_the_next_fetch_resumes_it(server, tmp_path: Path, capsys) -> None:
    url, h = server
    data = _checkpoint_bytes(5)
    h.files["w.pth"] = data
    sha = hashlib.sha256(data).hexdigest()
    h.cut_next = 3000
    assert main(["fetch", f"{url}/w.pth", "--sha256", sha, "--to", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is kept: run the same command again to resume" in err
    assert (tmp_path / "w.pth.part").stat().st_size == 3000 and not (tmp_path / "w.pth").exists()
    assert main(["fetch", f"{url}/w.pth", "--sha256", sha, "--to", str(tmp_path), "--quiet"]) == 0
    assert h.seen == [("w.pth", ""), ("w.pth", "bytes=3000-")] and (tmp_path / "w.pth").read_bytes() == data


def test_a_server_that_ignores_range_sends_the_whole_file_again(server, tmp_path: Path) -> None:
    url, h = server
    data = _checkpoint_bytes(6)
    h.files["w.pth"] = data
    h.ignore_range = True
    (tmp_path / "w.pth.part").write_bytes(b"x" * 500)  # not even the right bytes: restarted, not appended to
    assert main(["fetch", f"{url}/w.pth", "--sha256", hashlib.sha256(data).hexdigest(), "--to", str(tmp_path),
                 "--quiet"]) == 0
    assert h.seen == [("w.pth", "bytes=500-")] and (tmp_path / "w.pth").read_bytes() == data


def _registry(tmp_path: Path, url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry with one entry served by the loopback server; the cache dir under tmp_path."""
    reg = tmp_path / "registry.toml"
    reg.write_text(f'''
[tiny_digits]
architecture = "deit_digits_patch4_32"
model = "deit"
file = "tiny_digits-{prefix}.pth"
urls = ["{url}/tiny_digits-{prefix}.pth"]
sha256 = ""
hash_prefix = "{prefix}"
paper_table = "test"
licence = "test"
''')
    monkeypatch.setattr(released, "registry_path", lambda: reg)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_registry_name_absent_then_fetched_then_loaded_and_recorded(server, tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    url, h = server
    data = _checkpoint_bytes(2)
    prefix = hashlib.sha256(data).hexdigest()[:8]
    h.files[f"tiny_digits-{prefix}.pth"] = data
    _registry(tmp_path, url, prefix, monkeypatch)
    cache = tmp_path / "cache" / "robustbench_pid" / "checkpoints"
    # absent: one line naming the URL, the fetch command and where to put the file
    with pytest.raises(CheckpointError) as e:
        load_model("deit", "tiny_digits", dataset="digits")
    msg = str(e.value)
    assert "\n" not in msg and f"{url}/tiny_digits-{prefix}.pth" in msg
    assert "`robustbench-pid fetch tiny_digits`" in msg and str(cache / f"tiny_digits-{prefix}.pth") in msg
    # fetch by name: into the user cache dir, verified against the file name's hash prefix
    assert main(["fetch", "tiny_digits", "--quiet"]) == 0
    assert (cache / f"tiny_digits-{prefix}.pth").read_bytes() == data
    # present: --checkpoint NAME (bare or released:NAME) loads it; the name and published hash are recorded
    for spec in ("tiny_digits", "released:tiny_digits"):
        m = load_model("deit", spec, dataset="digits")
        assert m.info["checkpoint_name"] == "tiny_digits" and m.info["checkpoint_published_hash"] == prefix
        assert m.info["checkpoint_sha256"] == hashlib.sha256(data).hexdigest()
        assert m.info["checkpoint_source"] == "released"
    out = tmp_path / "run"
    assert main(["evaluate", "--model", "deit", "--checkpoint", "tiny_digits", "--attack", "fgsm", "--eps", "2/255",
                 "--limit", "8", "--out", str(out), "--quiet"]) == 0
    recs = pd.read_parquet(out / "records.parquet")
    cols = list(recs.columns)
    assert cols[cols.index("checkpoint_sha256") + 1: cols.index("checkpoint_sha256") + 3] == [
        "checkpoint_name", "checkpoint_published_hash"]
    assert set(recs["checkpoint_name"]) == {"tiny_digits"} and set(recs["checkpoint_published_hash"]) == {prefix}
    tidy = pd.read_csv(out / "summary.csv", dtype=str)
    assert set(tidy["checkpoint_name"]) == {"tiny_digits"} and set(tidy["checkpoint_published_hash"]) == {prefix}
    # --checkpoint-dir is searched first and recorded in the spec
    other = tmp_path / "mine"
    other.mkdir()
    (other / f"tiny_digits-{prefix}.pth").write_bytes(data)
    m = load_model("deit", "tiny_digits", dataset="digits", checkpoint_dir=str(other))
    assert m.info["checkpoint"] == str(other / f"tiny_digits-{prefix}.pth")
    info = json.loads((out / "run.json").read_text())
    assert info["checkpoint_name"] == "tiny_digits" and info["checkpoint_published_hash"] == prefix
    spec = build_spec("deit", checkpoint="tiny_digits", checkpoint_dir=other)
    assert spec.as_dict()["checkpoint_dir"] == str(other)  # recorded in run.json's spec
    # where the file lives does not name another run folder: the file's sha256 identifies the weights
    assert default_out(spec) == default_out(build_spec("deit", checkpoint="tiny_digits"))


def test_a_registry_file_that_does_not_match_its_hash_is_refused_before_it_is_read(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    data = _checkpoint_bytes(3)
    prefix = hashlib.sha256(data).hexdigest()[:8]
    _registry(tmp_path, "http://127.0.0.1:9", prefix, monkeypatch)
    d = tmp_path / "mine"
    d.mkdir()
    (d / f"tiny_digits-{prefix}.pth").write_bytes(_checkpoint_bytes(4))  # another file under the right name
    with pytest.raises(CheckpointError, match="does not match the published hash prefix"):
        read_checkpoint("tiny_digits", checkpoint_dir=str(d))


def test_other_checkpoints_record_empty_registry_columns(tmp_path: Path) -> None:
    m = load_model("deit", None, dataset="digits")  # embedded:deit_digits
    assert m.info["checkpoint_name"] == "" and m.info["checkpoint_published_hash"] == ""


def test_the_shipped_registry_matches_timm_and_its_file_names() -> None:
    """Every URL and hash prefix of the shipped registry is the one timm's source names (no typed hashes)."""
    from timm.models import get_pretrained_cfg

    reg = released.read_registry()
    assert {"deit_tiny", "deit_small", "deit_base", "fan_tiny"} <= set(reg)
    for rel in reg.values():
        if rel.timm_hub:
            cfg = get_pretrained_cfg(rel.timm_hub)
            assert list(rel.urls) == [cfg.url] and cfg.hf_hub_id == f"timm/{rel.timm_hub}", rel.name
            assert rel.file == cfg.url.rsplit("/", 1)[1] and rel.architecture == rel.timm_hub.split(".")[0]
        if rel.hash_prefix:
            assert rel.file.rsplit("-", 1)[1].split(".")[0] == rel.hash_prefix
        assert rel.licence and rel.paper_table and rel.evidence
    assert not reg["fan_tiny"].urls and not reg["fan_tiny"].published_hash  # nothing known locally: unknown


def test_fetch_of_an_entry_without_hash_or_url_says_what_to_do(capsys) -> None:
    assert main(["fetch", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "deit_tiny" in listed and "a1311bcf" in listed and "hash unknown" in listed
    assert main(["fetch", "fan_tiny", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be verified" in err and "--sha256 HEX" in err
    assert main(["fetch", "fan_tiny", "--sha256", "ab" * 32, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no download URL" in err and "https://github.com/NVlabs/FAN" in err and "fetch URL --sha256" in err
    assert main(["fetch", "deit_tiny", "--sha256", "ab" * 32, "--quiet"]) == 2  # contradicts the file name's hash
    assert "contradicts the registry's published hash" in capsys.readouterr().err
    assert main(["fetch", "deit_tiyn"]) == 2
    assert "Did you mean 'deit_tiny'" in capsys.readouterr().err


def test_a_registry_entry_without_a_hash_loads_only_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    """The registry cannot verify such a file: that is said on the terminal before the file is read, and louder
    when --allow-pickle would unpickle it."""
    _registry(tmp_path, "http://127.0.0.1:9", "", monkeypatch)
    d = tmp_path / "mine"
    d.mkdir()
    (d / "tiny_digits-.pth").write_bytes(_checkpoint_bytes(5))
    with pytest.warns(UserWarning, match="has no published hash in the registry: .* could not be verified$"):
        got = read_checkpoint("tiny_digits", checkpoint_dir=str(d))
    assert got.published_hash == "" and "could not be verified" in " ".join(got.notes)
    with pytest.warns(UserWarning, match="unpickled because --allow-pickle was given: only do that for a file"):
        read_checkpoint("tiny_digits", checkpoint_dir=str(d), allow_pickle=True)


def test_timm_weights_hosted_at_a_url_are_checked_against_the_hash_in_their_name(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """torch.hub's rule (NAME-<hex>.pth has a sha256 starting with <hex>) holds for a file already in the cache
    too: another file under that name is refused before it is read."""
    from types import SimpleNamespace

    from robustbench_pid.loaders import timm_hub

    data = _checkpoint_bytes(6)
    prefix = hashlib.sha256(data).hexdigest()[:8]
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(timm_hub, "_cfg", lambda name: SimpleNamespace(url=f"http://127.0.0.1:9/w-{prefix}.pth",
                                                                      hf_hub_id=None))
    cached = tmp_path / "torch" / "hub" / "checkpoints" / f"w-{prefix}.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(_checkpoint_bytes(7))  # not the published file
    with pytest.raises(CheckpointError, match=f"does not start with {prefix}, the hash prefix in its name"):
        timm_hub.load_timm("tiny.url")
    cached.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 9\n")
    with pytest.raises(CheckpointError, match=r"is not a checkpoint: it is a Git LFS pointer.*Download the file "
                                              r"again \(9 bytes, sha256 a{64}\) \(delete it; the next run downloads"):
        timm_hub.load_timm("tiny.url")  # issue 65: what the cached file is, before the hash's "not the published one"
    cached.write_bytes(data)
    got = timm_hub.load_timm("tiny.url")
    assert got.sha256.startswith(prefix) and "model" not in got.state_dict


def test_a_malformed_url_is_one_error_line(tmp_path: Path, capsys) -> None:
    assert main(["fetch", "https://[::1/a.pth", "--sha256", "ab" * 4, "--to", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a valid URL (Invalid IPv6 URL)" in err and not (tmp_path / "f").exists()


@pytest.mark.parametrize("file", ["..", ".", "../x.pth", "/tmp/x.pth", ".hidden.pth"])
def test_a_registry_file_name_that_names_another_place_is_refused(tmp_path, file):
    """The registry's file name is joined to --checkpoint-dir / the cache: '..' passed the bare-name check
    (Path('..').name == '..') and a download would have been renamed onto the parent folder."""
    reg = tmp_path / "registry.toml"
    reg.write_text(f'[x]\narchitecture = "deit_tiny_patch16_224"\nfile = "{file}"\n')
    with pytest.raises(CheckpointError, match=r"\[x\] file must be a bare file name .*not starting with a dot"):
        released.read_registry(reg)
    reg.write_text('[x]\narchitecture = "deit_tiny_patch16_224"\nfile = "deit_tiny-a1311bcf.pth"\n')
    assert released.read_registry(reg)["x"].file == "deit_tiny-a1311bcf.pth"


def test_a_download_that_is_a_web_page_says_so_and_a_registry_file_that_is_one_is_named(server, tmp_path: Path,
                                                                                      capsys, monkeypatch) -> None:
    """Issue 65: a server answering with an HTML page instead of the file (Google Drive's virus-scan page) is named
    in the mismatch, and a registry name whose file is such a page says what it is, the real file's sha256, and how
    to fetch it again, before the hash check's generic 'corrupt, truncated or another file'."""
    url, h = server
    page = b"<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head></html>"
    h.files["w.pth"] = page
    sha = hashlib.sha256(_checkpoint_bytes()).hexdigest()
    assert main(["fetch", f"{url}/w.pth", "--sha256", sha, "--to", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(the server sent an HTML page (title 'Google Drive - Virus scan warning'), not " \
                                    "the file)" in err and "nothing was written" in err
    data = _checkpoint_bytes(3)
    full = hashlib.sha256(data).hexdigest()
    _registry(tmp_path, "http://127.0.0.1:9", full[:8], monkeypatch)
    d = tmp_path / "mine"
    d.mkdir()
    (d / f"tiny_digits-{full[:8]}.pth").write_bytes(page)
    with pytest.raises(CheckpointError, match=r"is not a checkpoint: it is an HTML page .*Download the file again "
                                              r"with `robustbench-pid fetch tiny_digits"):
        read_checkpoint("tiny_digits", checkpoint_dir=str(d))

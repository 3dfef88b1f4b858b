"""Decoding the next chunk while the current one is computed (``read_ahead``, ``Context.chunks``).

The DataLoader alone prefetches ``prefetch_factor x workers`` batches; the runner holds a whole
chunk before computing it, so without a thread draining the loader most of the next chunk would
be decoded while the device waits. These tests pin the behaviour: order and errors as without the
thread, a bounded look-ahead, nothing left running, and (with a worker) the whole next chunk
decoded while the current one is held.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest
import torch

from robustbench_pid.run.read_ahead import read_ahead
from robustbench_pid.run.context import prepare
from robustbench_pid.specs import RunSpec


def _alive(name: str) -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_items_in_order_and_nothing_left_running() -> None:
    assert list(read_ahead(iter(range(50)), depth=2, name="t-order")) == list(range(50))
    assert not _alive("t-order")


def test_an_error_is_raised_where_it_happened() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise KeyError("bad image 3")

    got = []
    with pytest.raises(KeyError, match="bad image 3"):
        for v in read_ahead(items(), name="t-error"):
            got.append(v)
    assert got == [1, 2] and not _alive("t-error")


def test_look_ahead_is_bounded_and_closing_stops_the_producer() -> None:
    produced: List[int] = []

    def items() -> Iterator[int]:
        for i in range(1000):
            produced.append(i)
            yield i

    gen = read_ahead(items(), depth=1, name="t-bound")
    assert next(gen) == 0
    deadline = time.time() + 10
    while len(produced) < 3 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    # taken (1) + queued (depth 1) + one produced and waiting to be queued
    assert len(produced) == 3
    gen.close()
    assert not _alive("t-bound") and len(produced) == 3
    with pytest.raises(ValueError, match="depth"):
        next(read_ahead(iter([1]), depth=0))


@pytest.fixture
def touching_digits(tmp_path: Path, monkeypatch):
    """Digits whose every read leaves a file behind (the DataLoader's forked worker inherits the patch)."""
    from robustbench_pid.data.digits import Digits

    marks = tmp_path / "reads"
    marks.mkdir()
    real = Digits.__getitem__

    def touching(self, i):
        (marks / str(int(i))).touch()
        return real(self, i)

    monkeypatch.setattr(Digits, "__getitem__", touching)
    return marks


def test_next_chunk_is_decoded_while_the_current_one_is_held(tmp_path: Path, touching_digits: Path) -> None:
    """With one worker and prefetch 4, chunk 2 (10 batches of 4) is read completely while chunk 1
    is held: the read-ahead thread keeps the worker busy. The batches equal those read in-process."""
    spans = [(0, 8), (8, 48)]
    ctx = prepare(RunSpec(model="deit", limit=48, batch_size=4, num_workers=1, quiet=True, device="cpu",
                          out=tmp_path / "r"))
    seen = {}
    for k, (span, got) in enumerate(ctx.chunks(spans)):
        if k == 0:
            deadline = time.time() + 30
            while len(list(touching_digits.iterdir())) < 48 and time.time() < deadline:
                time.sleep(0.05)
            assert len(list(touching_digits.iterdir())) == 48, "the next chunk was not read while this one was held"
        seen[span] = list(got)  # a chunk's batches are released when the pass moves on
    assert not _alive("chunk-reader")
    plain = prepare(RunSpec(model="deit", limit=48, batch_size=4, quiet=True, device="cpu", out=tmp_path / "p"))
    for span, got in plain.chunks(spans):
        assert [b.sample_ids for b in got] == [b.sample_ids for b in seen[span]]
        for a, b in zip(got, seen[span]):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_a_chunk_is_released_before_the_next_one_is_read(tmp_path: Path, monkeypatch) -> None:
    """Once every unit of a span has run, its batches (a whole chunk on the device) are dropped before the next
    span's first image is read, even by whoever still holds the chunk (the loops' variables do while the next one
    is read); iterating it then is an error, not other samples' batches."""
    import weakref

    from robustbench_pid.data.digits import Digits

    refs: List[weakref.ref] = []
    alive_at_read: List[int] = []
    real = Digits.__getitem__

    def reading(self, i):
        alive_at_read.append(sum(r() is not None for r in refs))
        return real(self, i)

    monkeypatch.setattr(Digits, "__getitem__", reading)
    ctx = prepare(RunSpec(model="deit", limit=24, batch_size=4, quiet=True, device="cpu", out=tmp_path / "r"))
    alive_at_read.clear()
    kept = []
    for span, got in ctx.chunks([(0, 8), (8, 16), (16, 24)]):
        kept.append(got)
        refs[:] = [weakref.ref(b.x) for b in got]
        assert len(refs) == 2 and all(r() is not None for r in refs)
    assert alive_at_read == [0] * 24  # no image of the previous chunk alive while the next was read
    with pytest.raises(RuntimeError, match=r"batches of \[0:8\] were released"):
        list(kept[0])


def test_leaving_a_pass_early_joins_the_thread_and_the_loader_serves_again(tmp_path: Path) -> None:
    spans = [(0, 8), (8, 16), (16, 24)]
    ctx = prepare(RunSpec(model="deit", limit=24, batch_size=4, num_workers=1, quiet=True, device="cpu",
                          out=tmp_path / "r"))
    for span, _ in ctx.chunks(spans):
        break
    assert not _alive("chunk-reader")
    again = [(span, [b.sample_ids for b in got]) for span, got in ctx.chunks(spans)]
    assert [s for s, _ in again] == spans
    assert [len(ids) for _, got in again for ids in got] == [4] * 6


def test_a_bad_image_in_the_next_chunk_stops_the_run_with_one_line_and_keeps_finished_units(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """The worker's error reaches the user as the one line it started as, although the read-ahead
    thread met it while an earlier chunk was computing; that chunk's units are saved."""
    import json

    from robustbench_pid.cli import evaluate_main
    from robustbench_pid.data.digits import Digits
    from robustbench_pid.errors import UserError

    real = Digits.__getitem__

    def failing(self, i):
        if int(i) == 12:
            raise UserError("cannot read image digits/12: broken; pass --skip-unreadable to skip it")
        return real(self, i)

    monkeypatch.setattr(Digits, "__getitem__", failing)
    out = tmp_path / "run"
    rc = evaluate_main(["--model", "deit", "--attack", "fgsm", "--eps", "2/255", "--limit", "16", "--chunk-size", "8",
                        "--batch-size", "4", "--workers", "1", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and lines == ["error: cannot read image digits/12: broken; pass --skip-unreadable to skip it"], err
    done = sorted((json.loads(p.read_text())["attack"], json.loads(p.read_text())["start"])
                  for p in (out / "units").glob("*.json"))
    assert done == [("clean", 0), ("fgsm", 0)]
    assert not (out / "records.parquet").exists() and not _alive("chunk-reader")

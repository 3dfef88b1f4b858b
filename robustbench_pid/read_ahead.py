"""Produce the next items of an iterator on a background thread while the caller works on the
current one.

Why: the runner holds a whole chunk of samples on the device while every condition of that chunk
runs. A DataLoader only prefetches ``prefetch_factor x workers`` batches, so without a consumer
its workers stall after a few batches and most of the next chunk would be decoded while the
device waits. A thread that drains the loader into whole chunks, one chunk ahead, keeps the
workers decoding during the compute (the plain ``for x, y in loader`` loop gets that overlap for
free, because it consumes batch by batch).

The thread only moves what worker processes produced (the runner uses it with ``--workers N >=
1``): with ``workers=0`` the dataset itself would run on this thread, and a dataset transform that
drew from torch's global RNG would then race with a work unit's seeded draws.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterator, Tuple, TypeVar

T = TypeVar("T")

_ITEM, _END, _ERROR = 0, 1, 2


def read_ahead(items: Iterator[T], depth: int = 1, name: str = "read-ahead") -> Iterator[T]:
    """Yield ``items`` in order while a thread produces up to ``depth`` of them ahead.

    An exception raised by ``items`` is re-raised here, where it would have been raised without
    the thread. Closing the generator (a ``break``, an error in the caller, Ctrl-C) stops the
    thread after the item it is producing and joins it, so ``items`` is never used by two
    threads and nothing is left running.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    q: "queue.Queue[Tuple[int, object]]" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: Tuple[int, object]) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((_ITEM, item)) or stop.is_set():  # closed: do not read another item
                    return
            put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            put((_ERROR, exc))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == _ITEM:
                yield value  # type: ignore[misc]
            elif kind == _END:
                return
            else:
                raise value  # type: ignore[misc]
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting to put, then let it finish its item
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()

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


class read_ahead(Iterator[T]):
    """Iterate ``items`` in order while a thread, started at once, produces up to ``depth`` ahead.

    An exception raised by ``items`` is re-raised by ``next``, where it would have been raised
    without the thread. :meth:`close` stops the thread after the item it
    is producing and joins it, so ``items`` is never used by two threads and nothing is left
    running. A class, not a generator function: a generator's body (and so the thread) would
    only start at the first ``next``, and closing a generator never started skips its cleanup.
    """

    def __init__(self, items: Iterator[T], depth: int = 1, name: str = "read-ahead") -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._q: "queue.Queue[Tuple[int, object]]" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._items = items
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
        self._thread.start()

    def _put(self, entry: Tuple[int, object]) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                put = self._put((_ITEM, item))
                del item  # not held while the next one is produced: the consumer may be done with it (a batch)
                if not put or self._stop.is_set():  # closed: do not read another item
                    return
            self._put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            self._put((_ERROR, exc))

    def __iter__(self) -> "read_ahead[T]":
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        kind, value = self._q.get()
        if kind == _ITEM:
            return value  # type: ignore[return-value]
        self.close()
        if kind == _END:
            raise StopIteration
        raise value  # type: ignore[misc]

    def close(self) -> None:
        self._done = True
        self._stop.set()
        while self._thread.is_alive():  # unblock a producer waiting to put, then let it finish its item
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

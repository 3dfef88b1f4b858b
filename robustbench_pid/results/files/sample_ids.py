"""The evaluated samples' ids as ``plan.json`` stores them: runs of consecutive numbered ids, not one string each.

Why: the plan is written before the first batch and read back only by the exactly-once check (``merge``), yet a
suite's ids are many (CIFAR-10-C: 76 conditions x 10,000, ImageNet-C: 3.75M) and as a list of Python strings they
cost ~80 bytes each in the process that scores them (plus the JSON text), memory the allocator does not give back.
Nearly all are ``<prefix><integer>`` with the integers consecutive (``gaussian_noise/1/test/0`` ..
``gaussian_noise/1/test/9999``, ``test/0`` .., ``0`` ..), so a run is stored as ``[prefix, start, count]``.

Canonical parse: an id's integer is its whole trailing digit string (``0-9``, at most 18 digits), written without
leading zeros (``0`` itself, ``7``, ``10``, not ``007``); its prefix is the rest, so a prefix never ends in a digit.
``prefix + str(integer)`` and the pair determine each other, so two packed ids are equal exactly when their pairs
are (``a1`` + ``0`` and ``a`` + ``10`` are the one id ``a10``, parsed as ``a`` + ``10``). Anything else (``img.JPEG``,
``img_007``, a lone numbered id) is stored as itself, a string. A plan written before this module, a plain list of
strings, reads the same: every entry a literal.

Nothing here builds all the ids at once: :func:`pack` consumes an iterator, :class:`SampleIds` generates the ids of
one slice (one unit's) at a time and finds duplicates from the runs' intervals. No torch, no pandas.
"""
from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

Entry = Union[str, List[Any]]  # a literal id, or [prefix, start, count]
MAX_DIGITS = 18  # a longer trailing number stays a literal (Python refuses str() of ints past 4,300 digits anyway)


def parse(sid: str) -> Optional[Tuple[str, int]]:
    """(prefix, integer) of a canonical numbered id, else None."""
    k = len(sid)
    while k and "0" <= sid[k - 1] <= "9":
        k -= 1
    digits = sid[k:]
    if not digits or len(digits) > MAX_DIGITS or (digits[0] == "0" and len(digits) > 1):
        return None
    return sid[:k], int(digits)


def pack(ids: Iterable[Any]) -> List[Entry]:
    """The ids (each ``str()``'ed), in order, as entries: runs of two or more as ``[prefix, start, count]``."""
    out: List[Entry] = []
    run: Optional[List[Any]] = None  # [prefix, start, count] being extended

    def flush() -> None:
        if run is not None:
            out.append(run if run[2] > 1 else f"{run[0]}{run[1]}")

    for sid in ids:
        sid = str(sid)
        got = parse(sid)
        if got is not None and run is not None and got[0] == run[0] and got[1] == run[1] + run[2]:
            run[2] += 1
            continue
        flush()
        run = [got[0], got[1], 1] if got is not None else None
        if got is None:
            out.append(sid)
    flush()
    return out


class SampleIds(Sequence[str]):
    """Stored entries (``pack``'s, or an old plan's list of strings) read as the sequence of ids they stand for."""

    def __init__(self, entries: Iterable[Any]) -> None:
        self._entries: List[Entry] = []
        self._starts: List[int] = []  # position of each entry's first id
        n = 0
        for e in entries:
            if isinstance(e, (list, tuple)):
                if len(e) != 3 or not isinstance(e[0], str) or any(type(v) is not int or v < 0 for v in e[1:]) \
                        or (e[0] and "0" <= e[0][-1] <= "9"):  # such a prefix would make ids no parse gives
                    raise ValueError(f"not a run of sample ids [prefix, start, count]: {e!r}")
                e = [e[0], int(e[1]), int(e[2])]
                size = e[2]
            else:
                e, size = str(e), 1
            self._entries.append(e)
            self._starts.append(n)
            n += size
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            return self.slice(start, stop) if step == 1 else [self[j] for j in range(start, stop, step)]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        j = bisect.bisect_right(self._starts, i) - 1
        e = self._entries[j]
        return e if isinstance(e, str) else f"{e[0]}{e[1] + i - self._starts[j]}"

    def __iter__(self) -> Iterator[str]:
        for e in self._entries:
            if isinstance(e, str):
                yield e
            else:
                p, s, c = e
                for k in range(s, s + c):
                    yield f"{p}{k}"

    def slice(self, start: int, stop: int) -> List[str]:
        """The ids at positions [start, stop), generated for just these positions."""
        start, stop = max(0, start), min(self._n, stop)
        out: List[str] = []
        if start >= stop:
            return out
        j = bisect.bisect_right(self._starts, start) - 1
        while j < len(self._entries) and self._starts[j] < stop:
            e, at = self._entries[j], self._starts[j]
            if isinstance(e, str):
                out.append(e)
            else:
                p, s, c = e
                lo, hi = max(start, at) - at, min(stop, at + c) - at
                out += [f"{p}{k}" for k in range(s + lo, s + hi)]
            j += 1
        return out

    def duplicates(self, limit: int = 5) -> List[str]:
        """Up to ``limit`` ids that occur more than once (sorted), from the runs' intervals and the literals: no list
        of every id. A literal that parses canonically (an old plan's, or a lone numbered id) counts as a run of one."""
        spans: Dict[str, List[Tuple[int, int]]] = {}
        literals: Counter = Counter()
        for e in self._entries:
            got = parse(e) if isinstance(e, str) else (e[0], e[1])
            if got is None:
                literals[e] += 1
            elif isinstance(e, str) or e[2]:
                spans.setdefault(got[0], []).append((got[1], got[1] + (1 if isinstance(e, str) else e[2])))
        dup = {s for s, c in literals.items() if c > 1}
        for p, sp in spans.items():
            sp.sort()
            end = sp[0][1]
            for s, e in sp[1:]:
                for k in range(s, min(e, end)):  # [s, min(e, end)) lies in an earlier interval too
                    if len(dup) >= limit:
                        break
                    dup.add(f"{p}{k}")
                end = max(end, e)
        return sorted(dup)[:limit]

"""The released CIFAR-10-C / CIFAR-100-C ``.npy`` files, checked and read memory-mapped.

Why its own module: the arrays are 153.6 MB each and there are 15 of them, so nothing here loads a file whole.
A file is checked from its ``.npy`` header and its size alone (shape, dtype, C order, and that the bytes the header
promises are all there: a truncated download is caught before any image is scored), and rows are read through a
memory map of just the rows asked for, dropped right after the copy, so the pages of one file never pile up in the
process's memory while the 75 cells are scored.

Identity: size and mtime (ns) per file, not a sha256. Hashing would read all 2.3 GB before the first image (also
for ``--limit 10``), and the published archives come with no per-file hash to check one against (Zenodo gives the
tar's md5 only); size and mtime still change when a file is replaced or re-extracted.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from ..errors import UserError


@dataclass(frozen=True)
class ReleasedArray:
    """One checked ``.npy`` file: where its data starts, its shape and dtype, and its identity."""

    path: Path
    shape: Tuple[int, ...]
    dtype: str
    offset: int  # bytes before the first element (the header's length)
    size: int
    mtime_ns: int

    def identity(self) -> Dict[str, Any]:
        return {"file": self.path.name, "size": self.size, "mtime_ns": self.mtime_ns}

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as an in-memory copy; the memory map covers only them and is closed on return."""
        row = int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize
        mm = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset + start * row,
                       shape=(stop - start, *self.shape[1:]))
        try:
            return np.array(mm)
        finally:
            mm._mmap.close()  # type: ignore[attr-defined]  # unmapped now, not when the GC gets to it


def open_array(path: Path, what: str, fix: str, shape: Sequence[int], kinds: str) -> ReleasedArray:
    """``path`` checked as a ``.npy`` array of ``shape`` whose dtype kind is in ``kinds`` ("u": uint8 images, "iu":
    integer labels), every byte the header promises present; else one error naming the file and ``fix``."""
    if not path.is_file():
        raise UserError(f"{what}: {path} is missing; {fix}")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got_shape, fortran, dtype = reader(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError, EOFError) as exc:
        raise UserError(f"{what}: {path} is not a readable .npy file ({str(exc).splitlines()[0][:120]}): damaged; "
                        f"{fix}") from None
    st = path.stat()
    if tuple(got_shape) != tuple(shape) or dtype.kind not in kinds or (kinds == "u" and dtype.itemsize != 1):
        raise UserError(f"{what}: {path} holds a {got_shape} {dtype} array, not the released {tuple(shape)} "
                        f"{'uint8' if kinds == 'u' else 'integer'} one; {fix}")
    if fortran:
        raise UserError(f"{what}: {path} is stored in Fortran order, which the released files are not; {fix}")
    need = offset + int(np.prod(got_shape, dtype=np.int64)) * dtype.itemsize
    if st.st_size != need:
        how = "truncated" if st.st_size < need else "longer than its header says"
        raise UserError(f"{what}: {path} is {how} ({st.st_size:,} bytes; its {tuple(got_shape)} {dtype} array needs "
                        f"{need:,}); {fix}")
    return ReleasedArray(path, tuple(int(v) for v in got_shape), dtype.str, offset, int(st.st_size),
                         int(st.st_mtime_ns))

"""Arrays too large to hold in memory: written in chunks to a temporary ``.npy`` file and
memory-mapped read-only.

The file is written with plain writes (its pages sit in the page cache, not in the process), and
the process maps only the pages it reads: a simulation of 10,000 devices × 60 images keeps its
1.9 GB of normalised images on disk and touches only the shards of the devices that train. The
file is removed when the array (and every view of it) is garbage-collected, or at exit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = ["SPILL_BYTES", "is_spilled", "spill", "spill_rows", "copy_spilled"]

#: an array larger than this is spilled to a file by the loaders that can (`edge_sdk.data.datasets`)
SPILL_BYTES = 256 * 2**20
#: bytes per chunk written or gathered: the most a spill maps or holds at once
_CHUNK_BYTES = 32 * 2**20


#: each spilled file's array (the object `spill` returned, not a view of it)
_SPILLED: dict[os.PathLike[str] | str, weakref.ref[np.ndarray]] = {}


def is_spilled(array: np.ndarray) -> bool:
    """True for an array `spill` returned (not a view of one)."""
    ref = _SPILLED.get(getattr(array, "filename", None) or "")
    return ref is not None and ref() is array


def _remove(folder: Path, filename: os.PathLike[str] | str) -> None:
    _SPILLED.pop(filename, None)
    shutil.rmtree(folder, ignore_errors=True)


def _rows_per_chunk(row_shape: tuple[int, ...], dtype: np.dtype) -> int:
    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
    return max(1, _CHUNK_BYTES // row_bytes)


def spill(shape: tuple[int, ...], dtype: np.dtype | type, chunks: Iterable[np.ndarray]) -> np.memmap:
    """An array of ``shape``/``dtype`` whose rows are the concatenation of ``chunks`` (each
    ``(n, *shape[1:])``), written to a temporary file and returned memory-mapped read-only."""
    dtype = np.dtype(dtype)
    folder = Path(tempfile.mkdtemp(prefix="edgefl-spill-"))
    path = folder / "array.npy"
    try:
        rows = 0
        with open(path, "wb") as fh:
            np.lib.format.write_array_header_2_0(
                fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)})
            for chunk in chunks:
                chunk = np.ascontiguousarray(chunk, dtype=dtype)
                if chunk.shape[1:] != tuple(shape[1:]):
                    raise ValueError(f"a chunk of shape {chunk.shape} does not fit an array of shape {shape}")
                fh.write(chunk.data)
                rows += len(chunk)
        if rows != shape[0]:
            raise ValueError(f"the chunks gave {rows} rows, the array has {shape[0]}")
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    _SPILLED[array.filename] = weakref.ref(array)
    weakref.finalize(array, _remove, folder, array.filename)
    return array


def spill_rows(source: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``source[rows]``: spilled when ``source`` is, a plain copy otherwise.

    A spilled source is read row by row with ``pread``, not through a mapping: the page cache
    maps a written file in large folios (up to 2 MB), so gathering scattered rows through a
    mapping mapped nearly the whole file into the process (1.9 GB for 10,000 × 60 images)."""
    if not is_spilled(source):
        return source[rows]
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(source)):
        raise IndexError(f"rows must lie in [0, {len(source)})")
    row_shape, dtype = source.shape[1:], source.dtype
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    step = _rows_per_chunk(row_shape, dtype)

    def chunks() -> Iterable[np.ndarray]:
        with open(source.filename, "rb", buffering=0) as fh:
            fd = fh.fileno()
            for start in range(0, len(rows), step):
                part = rows[start:start + step]
                chunk = np.empty((len(part), *row_shape), dtype)
                for out, row in zip(chunk, part.tolist(), strict=True):
                    if os.preadv(fd, [out], source.offset + row * row_bytes) != row_bytes:
                        raise ValueError(f"{source.filename}: cut short at row {row}")
                yield chunk

    return spill((len(rows), *row_shape), dtype, chunks())


def copy_spilled(array: np.ndarray | int, path: str | os.PathLike[str]) -> None:
    """Save ``array`` as the ``.npy`` file ``path``: a spilled array's file is linked or copied
    (never read through the mapping), any other array saved with `numpy.save`."""
    if not isinstance(array, np.ndarray) or not is_spilled(array):
        np.save(path, np.asarray(array), allow_pickle=False)
        return
    try:
        os.link(array.filename, path)
    except OSError:  # another filesystem, or links not allowed
        shutil.copyfile(array.filename, path)

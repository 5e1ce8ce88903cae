"""A device's tensors kept in a file instead of memory, read back one tensor at a time.

An accepted update beyond the fleet's memory budget (`FleetLimits.updates_in_memory_bytes`) is
written to a file of its own and handed on as a `SpooledTensors`: a read-only mapping whose
every item maps its part of the file (`numpy.memmap`, mode ``r``) when asked for. Aggregation
reads one tensor of every device at a time (`coordinator.aggregate.robust`), so what it holds
at once is that tensor once per device, not every device's whole update. The file is removed
when the mapping is no longer referenced (or at exit).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

__all__ = ["SpooledTensors", "pick"]

_ALIGN = 64  # each tensor starts on a 64-byte boundary of the file


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class SpooledTensors(Mapping[str, np.ndarray]):
    """Named tensors stored in one file; ``self[name]`` maps that tensor read-only."""

    def __init__(self, path: str, layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]]) -> None:
        self.path = path
        self._layout = layout  # name -> (offset, dtype, shape)
        self._remove = weakref.finalize(self, _unlink, path)

    @classmethod
    def write(cls, tensors: Mapping[str, np.ndarray], directory: str | Path) -> SpooledTensors:
        """Write ``tensors`` to a new file in ``directory`` (native byte order, C order)."""
        layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        fd, path = tempfile.mkstemp(prefix="update-", suffix=".bin", dir=directory)
        try:
            with os.fdopen(fd, "wb") as out:
                offset = 0
                for name, value in tensors.items():
                    array = np.asarray(value)
                    dtype = array.dtype.newbyteorder("=")
                    layout[name] = (offset, dtype, tuple(array.shape))
                    data = array.astype(dtype, copy=False).tobytes(order="C")
                    out.write(data)
                    padding = -len(data) % _ALIGN
                    out.write(b"\0" * padding)
                    offset += len(data) + padding
        except BaseException:
            _unlink(path)
            raise
        return cls(path, layout)

    def __getitem__(self, name: str) -> np.ndarray:
        offset, dtype, shape = self._layout[name]
        size = int(np.prod(shape))
        if size == 0:
            return np.zeros(shape, dtype=dtype)
        return np.asarray(np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=(size,))).reshape(shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout)

    def __len__(self) -> int:
        return len(self._layout)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors (as in memory)."""
        return sum(int(np.prod(shape)) * dtype.itemsize for _, dtype, shape in self._layout.values())

    def view(self, names: Mapping[str, str]) -> SpooledTensors:
        """The tensors of ``names`` (new name -> name here), still in this file (which stays while
        the view does)."""
        subset = SpooledTensors.__new__(SpooledTensors)
        subset.path, subset._layout = self.path, {new: self._layout[old] for new, old in names.items()}
        subset._remove = self._remove  # the file goes when the last holder does
        subset._owner = self
        return subset

    def __repr__(self) -> str:
        return f"SpooledTensors({len(self)} tensors, {self.nbytes} bytes in {self.path})"


def pick(tensors: Mapping[str, np.ndarray], names: Iterable[str], prefix: str = "") -> Mapping[str, np.ndarray]:
    """The tensors ``prefix + name`` of ``tensors`` under their ``names``: a dict of them, or, for
    tensors kept in a file, a view that maps each only when it is read."""
    if isinstance(tensors, SpooledTensors):
        return tensors.view({name: prefix + name for name in names})
    return {name: tensors[prefix + name] for name in names}

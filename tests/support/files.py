"""Files and figures the tests make that the packages never need: idx files (the MNIST format) and
per-class counts of a partition."""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edge_sdk.data.datasets import _IDX_CODES
from edge_sdk.data.partition import _check_labels

__all__ = ["label_counts", "write_idx"]


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` in idx format (gzip-compressed if ``path`` ends in .gz)."""
    array = np.asarray(array)
    found = next(((code, dt) for code, dt in _IDX_CODES.items()
                  if array.dtype.kind == dt.kind and array.dtype.itemsize == dt.itemsize), None)
    if found is None:
        raise ValueError(f"idx cannot store dtype {array.dtype}; use uint8, int8, int16, "
                         "int32, float32 or float64")
    code, dt = found
    if not 1 <= array.ndim <= 255 or any(d >= 2**32 for d in array.shape):
        raise ValueError(f"idx cannot store shape {array.shape}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    data = header + np.ascontiguousarray(array, dtype=dt).tobytes()
    path = Path(path)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def label_counts(labels: np.ndarray, indices: np.ndarray | Sequence[np.ndarray],
                 num_classes: int) -> np.ndarray:
    """Per-class sample counts: 1-D for one index array, clients x classes for a list."""
    labels = _check_labels(labels)
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels reach {labels.max()} but num_classes={num_classes}")
    if isinstance(indices, np.ndarray) and indices.ndim == 1 and indices.dtype.kind in "iu":
        return np.bincount(labels[indices], minlength=num_classes)
    return np.stack([np.bincount(labels[np.asarray(ix, dtype=np.int64)], minlength=num_classes)
                     for ix in indices]) if len(indices) else np.zeros((0, num_classes), np.int64)

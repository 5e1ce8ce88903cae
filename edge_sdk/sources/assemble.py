"""The last step of every read: drop bad rows (counted), order newest first, keep `max_samples`."""

from __future__ import annotations

import numpy as np

from edge_sdk.data.local_data import LocalData
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.sources.base import NoData, Skipped
from edge_sdk.sources.keys import newest_first
from edge_sdk.sources.labels import NOT_A_CLASS
from edge_sdk.sources.options import ReadOptions, raw_preprocessing

__all__ = ["NAN", "NOT_A_NUMBER", "WRONG_SHAPE", "assemble", "drop", "parse_numbers"]

#: reasons a row is skipped (besides labels.NOT_A_CLASS and keys.BAD_KEY)
NAN = "NaN"  # a NaN or infinite value (or an SQL NULL)
NOT_A_NUMBER = "not a number"  # a feature cell that does not parse as a number (an empty one too)
WRONG_SHAPE = "wrong shape"  # a row with another number of cells, an image of another size


def drop(ok: np.ndarray, bad: np.ndarray, reason: str, skipped: Skipped) -> None:
    """Clear ``ok`` where ``bad``, counting the rows newly dropped under ``reason``."""
    newly = bad & ok
    count = int(newly.sum())
    if count:
        skipped[reason] += count
        ok &= ~bad


def parse_numbers(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An N x F object array of cells (numbers, numeric text, None) as float64, and a mask of the
    rows with a cell that is not a number (zeros there). None becomes NaN."""
    try:
        return cells.astype(np.float64), np.zeros(len(cells), dtype=bool)
    except (ValueError, TypeError, OverflowError):
        pass
    out = np.zeros(cells.shape, dtype=np.float64)
    bad = np.zeros(len(cells), dtype=bool)
    for i, row in enumerate(cells):
        try:
            out[i] = row.astype(np.float64)
        except (ValueError, TypeError, OverflowError):
            bad[i] = True
    return out, bad


def assemble(x: np.ndarray, y: np.ndarray, keys: np.ndarray, options: ReadOptions, skipped: Skipped, where: str,
             *, ok: np.ndarray | None = None, order: np.ndarray | None = None,
             preprocessing: Preprocessing | None = None, unit: str = "rows") -> LocalData:
    """The valid rows of ``x`` (N x sample shape), ``y`` (class indices, -1: not a class) and
    ``keys``, newest first (by ``order``, larger newer; else the last row first), at most
    ``options.max_samples``; rows already marked not ``ok`` are dropped (the caller counted them).
    ``preprocessing`` defaults to raw values. No valid row: NoData."""
    ok = np.ones(len(y), dtype=bool) if ok is None else ok.copy()
    drop(ok, y < 0, NOT_A_CLASS, skipped)
    if x.dtype.kind == "f" and x.size:
        drop(ok, ~np.isfinite(x.reshape(len(x), -1)).all(axis=1), NAN, skipped)
    index = newest_first(len(y), order)
    index = index[ok[index]][:options.max_samples]
    if not len(index):
        why = f" (skipped {skipped.summary()})" if skipped else ""
        raise NoData(f"{where}: no valid {unit}{why}")
    labels = y[index]
    num_classes = options.known_classes() or int(labels.max()) + 1
    if preprocessing is None:
        preprocessing = raw_preprocessing(tuple(int(n) for n in x.shape[1:]), options.classes)
    return LocalData(np.ascontiguousarray(x[index], dtype=np.float32), labels, num_classes, preprocessing,
                     np.ascontiguousarray(keys[index], dtype=np.uint64))

"""Labels to class indices: integers as they are, names through the task's class names."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from edge_sdk.sources.options import ReadOptions

__all__ = ["NOT_A_CLASS", "map_labels"]

#: the reason a row whose label is not one of the task's classes is skipped
NOT_A_CLASS = "label not a class"
_BAD, _NAME = -1, -2


def map_labels(cells: np.ndarray | Sequence[Any], options: ReadOptions, where: str) -> np.ndarray:
    """One int64 class index per label, -1 where the label is not a class (negative, at or above the
    class count, a name not in ``options.classes``, empty, fractional). A name is looked up in the
    class names first, then read as an integer index. String labels without ``[data] classes`` are a
    one-line ValueError naming ``where``."""
    limit = options.class_limit
    array = cells if isinstance(cells, np.ndarray) else None
    if array is not None and array.dtype.kind in "iuf":
        with np.errstate(invalid="ignore"):
            ok = (array >= 0) & (array < limit)
            if array.dtype.kind == "f":
                ok &= np.floor(array) == array  # NaN fails every comparison
        out = np.full(len(array), _BAD, dtype=np.int64)
        out[ok] = array[ok].astype(np.int64)
        return out
    names = {name: i for i, name in enumerate(options.classes)}
    cache: dict[tuple[type, Any], int] = {}  # by type too: True, 1 and 1.0 are one dict key
    out = np.empty(len(cells), dtype=np.int64)
    for i, cell in enumerate(cells.tolist() if array is not None else cells):
        try:
            out[i] = cache[type(cell), cell]
        except KeyError:
            out[i] = cache[type(cell), cell] = _index(cell, names, limit)
        except TypeError:  # an unhashable cell (a list from a loader)
            out[i] = _BAD
    named = out == _NAME
    if named.any() and not options.classes and not (out >= 0).any():
        names_seen = sorted(str(k[1]) for k, v in cache.items() if v == _NAME)[:3]
        examples = ", ".join(repr(n)[:20] for n in names_seen)
        raise ValueError(f"{where}: the labels are names ({examples}, ...): add [data] classes = [...], the task's "
                         "class names in its order (the same on every device)")
    out[named] = _BAD
    return out


def _index(cell: Any, names: dict[str, int], limit: int) -> int:
    if isinstance(cell, bytes):
        try:
            cell = cell.decode("utf-8")
        except UnicodeDecodeError:
            return _BAD
    if isinstance(cell, str):
        text = cell.strip()
        if text in names:
            return names[text]
        try:
            cell = int(text)
        except ValueError:
            try:
                cell = float(text)
            except ValueError:
                return _NAME if text else _BAD
    if isinstance(cell, (bool, np.bool_)):
        return _BAD
    if isinstance(cell, (float, np.floating)):
        if not math.isfinite(cell) or cell != math.floor(cell):
            return _BAD
        cell = int(cell)
    if isinstance(cell, (int, np.integer)):
        return int(cell) if 0 <= cell < limit else _BAD
    return _BAD

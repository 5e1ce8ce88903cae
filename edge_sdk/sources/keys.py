"""Stable sample keys: a row key or timestamp column, or a hash of the sample.

A key never changes as the data grows, so the federated-evaluation holdout chosen by it does not
move. A key column also orders the rows: the largest value is the newest.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["BAD_KEY", "check_key_column", "hash_bytes", "hash_samples", "hash_texts", "is_timestamp", "key_column",
           "newest_first"]

#: the reason a row whose key cell is neither a number nor an ISO-8601 timestamp is skipped
BAD_KEY = "key not a number or timestamp"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def hash_bytes(blobs: Iterable[bytes], count: int) -> np.ndarray:
    """One uint64 per blob: the first 8 bytes (little-endian) of its BLAKE2b digest."""
    keys = np.empty(count, dtype=np.uint64)
    for i, blob in enumerate(blobs):
        keys[i] = int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")
    return keys


def hash_samples(x: np.ndarray) -> np.ndarray:
    """A key per sample: the hash of its values as little-endian float32 bytes (so the same raw
    values give the same key whether stored as uint8 or float)."""
    rows = np.ascontiguousarray(x, dtype="<f4").reshape(len(x), int(np.prod(x.shape[1:])))
    return hash_bytes((row.tobytes() for row in rows), len(rows))


def hash_texts(rows: Sequence[Sequence[str]]) -> np.ndarray:
    """A key per text row (e.g. a CSV line's cells): the hash of its cells joined by U+001F."""
    return hash_bytes(("\x1f".join(row).encode("utf-8", "surrogatepass") for row in rows), len(rows))


def _parse(cell: Any) -> int | float | None:
    """A key cell as an int (integers; ISO-8601 timestamps in microseconds since the epoch, UTC
    when no zone is given) or a finite float; None when it is neither."""
    if isinstance(cell, bool):
        return None
    if isinstance(cell, int):
        return cell if _INT64[0] <= cell <= _INT64[1] else None
    if isinstance(cell, float):
        if not math.isfinite(cell):
            return None
        return int(cell) if cell.is_integer() and abs(cell) < 2.0 ** 63 else cell
    if not isinstance(cell, str):
        return None
    text = cell.strip()
    try:
        return _parse(int(text))
    except ValueError:
        pass
    try:
        return _parse(float(text))
    except ValueError:
        pass
    if len(text) > 64:
        return None
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def key_column(cells: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(order, keys, bad)`` of a key column's cells: ``order`` sorts the rows (larger is newer;
    int64 when every cell is an integer, else float64), ``keys`` one uint64 per row (an integer's
    two's complement, a fraction's float64 bits), ``bad`` True where a cell is neither a number
    nor a timestamp (order and key 0 there)."""
    fast = _integers(cells)
    if fast is not None:
        return fast, fast.view(np.uint64), np.zeros(len(fast), dtype=bool)
    values = [_parse(c) for c in cells]
    bad = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    clean = [0 if v is None else v for v in values]
    if all(type(v) is int for v in clean):
        order = np.array(clean, dtype=np.int64)
        return order, order.view(np.uint64), bad
    order = np.array(clean, dtype=np.float64)
    keys = np.array([v if type(v) is int else 0 for v in clean], dtype=np.int64).view(np.uint64)
    fractions = np.fromiter((type(v) is float for v in clean), dtype=bool, count=len(clean))
    keys[fractions] = order[fractions].view(np.uint64)
    return order, keys, bad


def check_key_column(order: np.ndarray, keys: np.ndarray, bad: np.ndarray, column: str, where: str) -> None:
    """Refuse, in one line naming ``where`` and ``column``, a key column that cannot be one: a
    fraction (a reading, not a row id or timestamp: likely a feature taken for the key) or a
    value shared by two rows (a key names one sample, and decides its side for good)."""
    good = ~bad
    if order.dtype.kind == "f" and good.any():
        fractions = order[good][order[good] != np.floor(order[good])]
        if len(fractions):
            raise ValueError(f"{where}: key column {column!r} holds fractions such as {fractions[0]:g}: a key is a "
                             "row id or timestamp (is a feature first? name the key with [data] key)")
    unique, counts = np.unique(keys[good], return_counts=True)
    if len(unique) < int(good.sum()):
        twice = int(unique[counts > 1][0].view(np.int64))
        raise ValueError(f"{where}: key column {column!r} holds {int(good.sum()) - len(unique)} repeated value(s) "
                         f"(e.g. {twice}): a key must name one row (a row id, or a finer timestamp)")


def is_timestamp(cell: Any) -> bool:
    """Whether ``cell`` is ISO-8601 timestamp text (not a plain number)."""
    if not isinstance(cell, str):
        return False
    text = cell.strip()
    try:
        float(text)
        return False
    except ValueError:
        return _parse(text) is not None


def _integers(cells: Sequence[Any]) -> np.ndarray | None:
    """The cells as int64 when every one is an integer or integer text (the common row id or epoch
    timestamp column, parsed at numpy speed), else None."""
    if not len(cells):
        return None
    kinds = {type(c) for c in cells}
    if kinds not in ({int}, {str}):
        return None
    try:
        return np.array(cells).astype(np.int64) if kinds == {str} else np.array(cells, dtype=np.int64)
    except (ValueError, OverflowError):
        return None


def newest_first(count: int, order: np.ndarray | None = None) -> np.ndarray:
    """Row indices newest first: by ``order`` descending (ties: the later row first), or, without
    one, the last row first."""
    if order is None:
        return np.arange(count - 1, -1, -1)
    return np.argsort(order, kind="stable")[::-1].copy()

"""Rows of named columns (a CSV file, an SQL query's result) as samples: features, a label, a key."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edge_sdk.data.local_data import LocalData
from edge_sdk.sources.assemble import NOT_A_NUMBER, assemble, drop, parse_numbers
from edge_sdk.sources.base import NoData, Skipped
from edge_sdk.sources.keys import BAD_KEY, check_key_column, is_timestamp, key_column
from edge_sdk.sources.labels import map_labels
from edge_sdk.sources.options import ReadOptions

__all__ = ["Columns", "read_table"]


@dataclass(frozen=True)
class Columns:
    """Which columns are what: ``label``; ``features`` (None: every other column); ``key``, a row id
    or timestamp giving order and key (None: none; ``first`` True: the first column)."""

    label: str = "label"
    features: tuple[str, ...] | None = None
    key: str | None = None
    first_is_key: bool = False

    def indices(self, names: Sequence[str], where: str) -> tuple[int, list[int], int | None]:
        """(label, features, key) column positions in ``names``; a missing column is a ValueError."""
        def find(column: str, setting: str) -> int:
            if column not in names:
                shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
                raise ValueError(f"[data] {setting} {column!r} is not a column of {where} (columns: {shown})")
            return names.index(column)

        label = find(self.label, "label")
        key = find(self.key, "key") if self.key is not None else (0 if self.first_is_key else None)
        if key == label and self.key is None:
            raise ValueError(f"[data] key: the first column of {where} is the label {self.label!r}; put a row id or "
                             "timestamp first (SELECT rowid, ...) or name one with [data] key")
        if key == label:
            raise ValueError(f"[data] key and label of {where} are both {self.label!r}")
        if self.features is not None:
            features = [find(f, "features") for f in self.features]
        else:
            features = [i for i in range(len(names)) if i not in (label, key)]
        if not features:
            raise ValueError(f"{where} has no feature columns (columns: {', '.join(names[:20])})")
        if label in features or key in features:
            raise ValueError(f"[data] features of {where} include the label or key column")
        return label, features, key


def read_table(names: Sequence[str], rows: list[Sequence], columns: Columns, options: ReadOptions,
               skipped: Skipped, where: str, row_keys: np.ndarray | None = None) -> LocalData:
    """Samples from ``rows`` (each as long as ``names``): features reshaped to
    ``options.input_shape`` (default: F), the label mapped to a class, order and key from the key
    column, else the last row newest and ``row_keys`` (one per row) as keys."""
    label, features, key = columns.indices(list(names), where)
    shape = options.input_shape or (len(features),)
    if math.prod(shape) != len(features):
        raise ValueError(f"[data] input_shape {list(shape)} holds {math.prod(shape)} values but {where} has "
                         f"{len(features)} feature columns")
    if not rows:
        raise NoData(f"{where}: no valid rows (skipped {skipped.summary()})" if skipped else f"{where} has no rows")
    table = np.empty((len(rows), len(names)), dtype=object)
    table[:] = rows
    ok = np.ones(len(rows), dtype=bool)
    order = None
    if key is not None:
        order, keys, bad = key_column(table[:, key].tolist())
        check_key_column(order, keys, bad, names[key], where)
        drop(ok, bad, BAD_KEY, skipped)
    elif row_keys is not None:
        keys = row_keys
    else:
        raise ValueError(f"{where}: no key column and no row keys")
    x, bad = parse_numbers(table[:, features])
    if bad.all():
        _no_timestamp_feature(table, features, names, where)
    drop(ok, bad, NOT_A_NUMBER, skipped)
    if options.unlabelled:  # the rows to serve: an empty label; the labelled ones left out, not skipped
        ok &= np.array([_empty(cell) for cell in table[:, label]], dtype=bool)
        y = np.zeros(len(rows), dtype=np.int64)
    else:
        y = map_labels(table[:, label], options, where)
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf: skipped as NaN
        x = x.astype(np.float32).reshape((len(rows), *shape))
    return assemble(x, y, keys, options, skipped, where, ok=ok, order=order)


def _no_timestamp_feature(table: np.ndarray, features: list[int], names: Sequence[str], where: str) -> None:
    """No row has numeric features: if a feature column holds timestamps, say so in one line (it
    is the key, misplaced) rather than skipping every row as "not a number"."""
    for i in features:
        if all(is_timestamp(cell) for cell in table[:20, i]):
            raise ValueError(f"{where}: column {names[i]!r} holds timestamps but is read as a feature; name it "
                             f"with [data] key = {names[i]!r} (or select it first)")


def _empty(cell: object) -> bool:
    """An empty label: an SQL NULL, an empty CSV cell, blanks, NaN."""
    if cell is None:
        return True
    if isinstance(cell, str):
        return not cell.strip()
    return isinstance(cell, float) and cell != cell

"""Keys and labels every source shares (issue 38, part 3): key columns (integers, fractions,
ISO-8601 timestamps), newest-first order, labels through the task's class names."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.sources import ReadOptions
from edge_sdk.sources.keys import hash_samples, key_column, newest_first
from edge_sdk.sources.labels import map_labels


def test_key_cells_of_every_kind():
    order, keys, bad = key_column([5, "7", " 6 ", "8.0", 2.5, "1970-01-01T00:00:01Z", "x", None, "nan", True])
    assert bad.tolist() == [False] * 6 + [True] * 4
    assert keys[:4].tolist() == [5, 7, 6, 8]  # "8.0" is the integer 8
    assert keys[4] == np.array([2.5]).view(np.uint64)[0]  # a fraction: its float64 bits
    assert keys[5] == 1_000_000  # a timestamp: microseconds since the epoch
    assert order[:5].tolist() == [5.0, 7.0, 6.0, 8.0, 2.5]


def test_timestamps_with_and_without_a_zone():
    _, keys, bad = key_column(["2024-01-01T00:00:00Z", "2024-01-01 00:00:00", "2024-01-01T01:00:00+01:00"])
    assert not bad.any() and len(set(keys.tolist())) == 1  # no zone is UTC


def test_negative_and_large_integer_keys_keep_order_and_distinct_keys():
    order, keys, bad = key_column([-3, 2**62, -(2**63), 2**64])
    assert bad.tolist() == [False, False, False, True]
    assert order.dtype == np.int64 and newest_first(4, order)[0] == 1
    assert len(set(keys[:3].tolist())) == 3


def test_newest_first_breaks_ties_by_the_later_row():
    assert newest_first(4, np.array([1, 3, 3, 0])).tolist() == [2, 1, 0, 3]
    assert newest_first(3).tolist() == [2, 1, 0]


def test_hash_keys_differ_by_sample_and_ignore_the_stored_type():
    x = np.arange(12, dtype=np.uint8).reshape(3, 4)
    keys = hash_samples(x)
    assert len(set(keys.tolist())) == 3 and hash_samples(x.astype(np.float64)).tolist() == keys.tolist()
    assert hash_samples(x[1:]).tolist() == keys[1:].tolist()


@pytest.mark.parametrize("cells, options, expected", [
    (["on", "off", " on ", "1", "dim", "", None, 0, 2, 1.0, 1.5, True], ReadOptions(classes=("off", "on")),
     [1, 0, 1, 1, -1, -1, -1, 0, -1, 1, -1, -1]),
    (np.array([0, 3, -1, 9]), ReadOptions(num_classes=4), [0, 3, -1, -1]),
    (np.array([0.0, 2.0, 2.5, np.nan]), ReadOptions(), [0, 2, -1, -1]),
    (np.array([5, 1], dtype=np.uint64), ReadOptions(num_classes=3), [-1, 1]),
    (["1", "2", "x"], ReadOptions(), [1, 2, -1]),  # some integers: a stray name is a bad row
    (["2", "1"], ReadOptions(classes=("3", "2", "1")), [1, 2]),  # a class name first, then an index
])
def test_labels_map_to_class_indices(cells, options, expected):
    assert map_labels(cells, options, "where").tolist() == expected


def test_string_labels_without_classes_are_one_line_saying_to_add_them():
    with pytest.raises(ValueError, match=r"^/x.csv: the labels are names \('off', 'on', \.\.\.\): add \[data\] classes"):
        map_labels(["on", "off", "on"], ReadOptions(), "/x.csv")

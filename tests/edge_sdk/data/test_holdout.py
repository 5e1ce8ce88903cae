"""The federated-evaluation holdout: chosen by stable keys, so it never moves as data grows."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.data.holdout import MIN_CLASS_SAMPLES, check_holdout, sample_keys, split_holdout
from edge_sdk.methods import LocalData


def _data(n: int, classes: int = 4, seed: int = 0, keys: bool = True) -> LocalData:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1, 4, 4)).astype(np.float32)
    y = (np.arange(n) % classes).astype(np.int64)
    return LocalData(x, y, classes, keys=np.arange(n, dtype=np.uint64) * 7 + 3 if keys else None)


def test_a_sample_never_changes_side_as_the_data_grows() -> None:
    small, grown = _data(500), _data(2000)  # the first 500 samples (and keys) are the same
    a, b = split_holdout(small, 0.2), split_holdout(grown, 0.2)
    held_small = set(a.holdout.keys.tolist())
    held_grown = set(b.holdout.keys.tolist())
    trained_grown = set(b.train.keys.tolist())
    assert held_small <= held_grown and not held_small & trained_grown
    assert set(a.train.keys.tolist()) <= trained_grown


def test_the_share_is_the_fraction_for_every_class() -> None:
    split = split_holdout(_data(8000, classes=4), 0.2)
    assert len(split.holdout) + len(split.train) == 8000
    for c in range(4):
        share = np.sum(split.holdout.y == c) / 2000
        assert 0.17 < share < 0.23, (c, share)


def test_dropping_the_oldest_rows_moves_nothing() -> None:
    data = _data(1000)
    newest = LocalData(data.x[300:], data.y[300:], 4, keys=data.keys[300:])
    held = set(split_holdout(data, 0.3).holdout.keys.tolist())
    assert set(split_holdout(newest, 0.3).holdout.keys.tolist()) == held & set(newest.keys.tolist())


def test_a_small_class_stays_in_training() -> None:
    data = _data(400, classes=4)
    y = data.y.copy()
    y[:MIN_CLASS_SAMPLES - 1] = 4  # a fifth class with too few samples
    data = LocalData(data.x, y, 5, keys=data.keys)
    split = split_holdout(data, 0.5)
    assert not np.any(split.holdout.y == 4)
    assert np.sum(split.train.y == 4) == MIN_CLASS_SAMPLES - 1


def test_too_little_data_holds_nothing_out_and_says_so() -> None:
    split = split_holdout(_data(3, classes=1), 0.2)
    assert split.holdout is None and len(split.train) == 3
    assert "too little data" in split.note


def test_without_keys_the_samples_are_hashed_and_the_choice_is_the_same_every_time() -> None:
    data = _data(600, keys=False)
    a, b = split_holdout(data, 0.25), split_holdout(data, 0.25)
    np.testing.assert_array_equal(a.holdout.x, b.holdout.x)
    assert 0.18 < len(a.holdout) / 600 < 0.32
    keys = sample_keys(data.x, data.y)
    assert keys.dtype == np.uint64 and len(set(keys.tolist())) == 600
    relabelled = sample_keys(data.x, (data.y + 1) % 4)
    assert not np.any(keys == relabelled)  # the label is part of a sample


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 0.95, 1, float("nan"), "0.2", True, None])
def test_a_holdout_outside_the_range_is_refused(bad) -> None:
    with pytest.raises(ValueError, match=r"holdout must be a fraction in \(0, 0.9\]"):
        check_holdout(bad)


def test_keys_must_be_one_uint64_per_sample() -> None:
    data = _data(10)
    with pytest.raises(ValueError, match="keys must be a uint64"):
        LocalData(data.x, data.y, 4, keys=np.arange(10))
    with pytest.raises(ValueError, match="keys must be a uint64"):
        LocalData(data.x, data.y, 4, keys=np.arange(9, dtype=np.uint64))

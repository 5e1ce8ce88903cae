"""The federated-evaluation holdout: chosen by stable keys, so it never moves as data grows."""

from __future__ import annotations

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.data.holdout import MIN_HOLDOUT, check_holdout, sample_keys, split_holdout
from edge_sdk.methods.pfedpara import personal_split
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


def test_a_small_class_is_held_out_like_any_other() -> None:
    data = _data(400, classes=4)
    y = data.y.copy()
    y[:4] = 4  # a fifth class of four samples: each one's side is still its key's
    split = split_holdout(LocalData(data.x, y, 5, keys=data.keys), 0.5)
    alone = split_holdout(LocalData(data.x[:4], y[:4], 5, keys=data.keys[:4]), 0.5)
    assert set(split.train.keys[split.train.y == 4].tolist()) == set(alone.train.keys.tolist())


def test_a_device_with_one_held_out_sample_neither_trains_nor_evaluates_it() -> None:
    for n in range(1, 60):  # the smallest device whose keys hold exactly one sample out
        split = split_holdout(_data(n, classes=1), 0.2)
        if split.waiting == 1:
            break
    assert split.holdout is None and split.waiting == 1 and len(split.train) == n - 1
    assert "too few to evaluate" in split.note and f"at least {MIN_HOLDOUT}" in split.note


def test_too_little_data_evaluates_nothing_and_says_so() -> None:
    split = split_holdout(_data(1, classes=1), 0.2)
    assert split.holdout is None and len(split.train) + split.waiting == 1
    assert "held out" in split.note


def _keys_of(data: LocalData, keyed: bool) -> list[int]:
    return (data.keys if keyed else sample_keys(data.x, data.y)).tolist()


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(list(range(40))), labels=st.lists(st.integers(0, 3), min_size=40, max_size=40),
       fraction=st.sampled_from([0.1, 0.2, 0.5]), keyed=st.booleans())
def test_no_held_out_key_is_ever_trained_on_as_rows_arrive(order, labels, fraction, keyed) -> None:
    """Rows arrive one at a time in any order and class mix, from one row on: no key that any
    split of the growing data held out (evaluated or waiting) is trained on in any other step,
    for the device's holdout and for pFedPara's own split of its training side."""
    x = np.random.default_rng(0).normal(size=(40, 1, 2, 2)).astype(np.float32)
    y = np.asarray(labels, np.int64)
    trained: set[int] = set()
    held: set[int] = set()
    evaluated: set[int] = set()
    personal_trained: set[int] = set()
    personal_held: set[int] = set()
    for n in range(1, 41):
        rows = np.asarray(order[:n])
        keys = rows.astype(np.uint64) * np.uint64(2654435761) + np.uint64(11) if keyed else None
        data = LocalData(x[rows], y[rows], 4, keys=keys)
        split = split_holdout(data, fraction)
        train_keys = _keys_of(split.train, keyed)
        trained |= set(train_keys)
        held |= set(_keys_of(data, keyed)) - set(train_keys)
        if split.holdout is not None:
            evaluated |= set(_keys_of(split.holdout, keyed))
        assert len(split.train) + (len(split.holdout) if split.holdout is not None else 0) + split.waiting == n
        p_train, p_held = personal_split(split.train, fraction)
        personal_trained |= {k for k, t in zip(train_keys, p_train) if t}
        personal_held |= {k for k, t in zip(train_keys, p_train) if not t}
        assert not np.any(p_train & p_held)
    assert not trained & held and evaluated <= held
    assert not personal_trained & personal_held


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

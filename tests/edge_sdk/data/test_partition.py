"""Partitioners: coverage, class skew, determinism and spec validation."""

from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.partition import parse_spec, partition
from tests.support.files import label_counts


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    """Real labels with unequal class sizes (sklearn digits: 174-183 per class)."""
    return load_dataset("digits", test_fraction=0.2).y_train


@pytest.fixture(scope="module")
def skewed_labels() -> np.ndarray:
    """Synthetic labels with very unequal classes (20..200 samples)."""
    rng = np.random.default_rng(3)
    return rng.permutation(np.repeat(np.arange(10), np.arange(1, 11) * 20))


def _assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert len(allidx) == n and len(np.unique(allidx)) == n
    assert allidx.min() == 0 and allidx.max() == n - 1
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize("spec", ["iid", "shards:1", "shards:2", "shards:5", "dirichlet:0.1",
                                  "dirichlet:1", "dirichlet:100"])
@pytest.mark.parametrize("clients", [1, 7, 20])
def test_disjoint_and_cover(digits_labels: np.ndarray, spec: str, clients: int) -> None:
    parts = partition(digits_labels, clients, spec, seed=5)
    assert len(parts) == clients and all(len(p) >= 1 for p in parts)
    _assert_disjoint_cover(parts, len(digits_labels))


def test_iid_is_balanced(digits_labels: np.ndarray) -> None:
    parts = partition(digits_labels, 10, "iid")
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    counts = label_counts(digits_labels, parts, 10)
    assert (counts > 0).all()  # every client sees every class


@pytest.mark.parametrize("clients", [5, 10, 23, 50])
def test_shards_2_gives_two_classes_per_client(digits_labels: np.ndarray, clients: int) -> None:
    parts = partition(digits_labels, clients, "shards:2", seed=clients)
    classes_per_client = (label_counts(digits_labels, parts, 10) > 0).sum(axis=1)
    assert classes_per_client.max() <= 2
    assert (classes_per_client == 2).mean() >= 0.9


def test_shards_with_unequal_classes(skewed_labels: np.ndarray) -> None:
    parts = partition(skewed_labels, 10, "shards:3", seed=1)
    _assert_disjoint_cover(parts, len(skewed_labels))
    classes_per_client = (label_counts(skewed_labels, parts, 10) > 0).sum(axis=1)
    assert classes_per_client.max() <= 3 and (classes_per_client == 3).mean() >= 0.9


def test_shards_with_fewer_shards_than_classes(digits_labels: np.ndarray) -> None:
    parts = partition(digits_labels, 2, "shards:2")  # 4 shards for 10 classes: must mix
    _assert_disjoint_cover(parts, len(digits_labels))
    counts = label_counts(digits_labels, parts, 10)
    assert ((counts > 0).sum(axis=1) < 10).all()  # still label-sorted, not IID


def test_dirichlet_skew_depends_on_alpha(digits_labels: np.ndarray) -> None:
    def skew(alpha: float) -> float:
        counts = label_counts(digits_labels, partition(digits_labels, 10, f"dirichlet:{alpha}",
                                                       seed=2), 10)
        dist = counts / counts.sum(axis=1, keepdims=True)
        return float(np.abs(dist - 0.1).sum(axis=1).mean())  # mean L1 distance from uniform

    low, high = skew(0.1), skew(100.0)
    assert low > 0.8  # most clients are dominated by a few classes
    assert high < 0.25  # near-uniform label mix
    counts = label_counts(digits_labels, partition(digits_labels, 10, "dirichlet:0.1", seed=2), 10)
    assert (counts == 0).sum() > 20  # many (client, class) pairs are empty


def test_deterministic_by_seed(digits_labels: np.ndarray) -> None:
    for spec in ("iid", "shards:2", "dirichlet:0.5"):
        a = partition(digits_labels, 8, spec, seed=11)
        b = partition(digits_labels, 8, spec, seed=11)
        c = partition(digits_labels, 8, spec, seed=12)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_min_size_and_bounded_retries(digits_labels: np.ndarray) -> None:
    parts = partition(digits_labels, 10, "dirichlet:0.3", seed=0, min_size=40)
    assert min(len(p) for p in parts) >= 40
    with pytest.raises(ValueError, match="after 5 draws"):
        partition(digits_labels, 100, "dirichlet:0.01", min_size=10, max_retries=5)


@pytest.mark.parametrize("spec", ["", "iid:3", "shards", "shards:0", "shards:-2", "shards:1.5",
                                  "dirichlet", "dirichlet:0", "dirichlet:-1", "dirichlet:nan",
                                  "dirichlet:inf", "dirichlet:abc", "random", 3])
def test_bad_specs_rejected(digits_labels: np.ndarray, spec: object) -> None:
    with pytest.raises(ValueError, match="spec"):
        partition(digits_labels, 4, spec)  # type: ignore[arg-type]


def test_bad_arguments_rejected(digits_labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="num_clients"):
        partition(digits_labels, 0)
    with pytest.raises(ValueError, match="cannot give"):
        partition(digits_labels, len(digits_labels) + 1)
    with pytest.raises(ValueError, match="1-D integer"):
        partition(digits_labels.astype(float), 4)
    with pytest.raises(ValueError, match="non-negative"):
        partition(np.array([0, -1, 2]), 1)
    assert parse_spec("Dirichlet:0.5") == ("dirichlet", 0.5)
    assert parse_spec("shards:3") == ("shards", 3.0)


def test_label_counts_shapes(digits_labels: np.ndarray) -> None:
    parts = partition(digits_labels, 3, "iid")
    matrix = label_counts(digits_labels, parts, 10)
    assert matrix.shape == (3, 10) and matrix.sum() == len(digits_labels)
    assert np.array_equal(label_counts(digits_labels, parts[1], 10), matrix[1])
    assert np.array_equal(matrix.sum(axis=0), np.bincount(digits_labels, minlength=10))
    with pytest.raises(ValueError, match="num_classes"):
        label_counts(digits_labels, parts, 5)

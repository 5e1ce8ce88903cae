"""Every rejection code of `coordinator.aggregate.validation.validate_update` at its exact boundary (issue 35)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from coordinator.aggregate.validation import MAX_SAMPLES, TensorSpec, UpdateRejected, expected_from, validate_update
from edge_sdk.protocol.messages import Update

EXPECTED = {"w": TensorSpec((2, 3)), "n": TensorSpec((), "int64"), "h": TensorSpec((4,), "float16")}


def good(**changes) -> Update:
    tensors = {"w": np.zeros((2, 3), np.float32), "n": np.array(5, np.int64), "h": np.ones(4, np.float16)}
    fields = {"label": "full", "tensors": tensors, "num_samples": 10, "metrics": {"loss": 0.5}}
    fields.update(changes)
    return Update(**fields)


def with_tensor(name: str, value: np.ndarray) -> Update:
    return good(tensors={**good().tensors, name: value})


def code_of(update: Update, max_samples: int = 100, label: str = "full") -> str | None:
    try:
        validate_update(update, EXPECTED, label, max_samples)
    except UpdateRejected as e:
        assert isinstance(e, ValueError) and str(e) == e.message
        return e.code
    return None


def test_a_good_update_passes():
    assert code_of(good()) is None


def test_wrong_label():
    assert code_of(good(label="half")) == "wrong_label"
    assert code_of(good(), label="half") == "wrong_label"
    with pytest.raises(UpdateRejected, match="update is for 'half', device was assigned 'full'"):
        validate_update(good(label="half"), EXPECTED, "full", 100)


@pytest.mark.parametrize("n, max_samples, code", [
    (0, 100, "bad_samples"), (1, 100, None), (100, 100, None), (101, 100, "bad_samples"),
    (-1, 100, "bad_samples"), (1, 1, None), (2, 1, "bad_samples"), (1, 0, "bad_samples"),
    # whatever a device registered, MAX_SAMPLES (1e8) is the ceiling
    (MAX_SAMPLES, 10 * MAX_SAMPLES, None), (MAX_SAMPLES + 1, 10 * MAX_SAMPLES, "bad_samples"),
])
def test_sample_count_boundaries(n, max_samples, code):
    assert code_of(good(num_samples=n), max_samples=max_samples) == code


def test_sample_count_message_names_the_effective_limit():
    with pytest.raises(UpdateRejected, match=r"num_samples=101 is impossible: must be 1\.\.100$"):
        validate_update(good(num_samples=101), EXPECTED, "full", 100)
    with pytest.raises(UpdateRejected, match=r"must be 1\.\.100000000$"):
        validate_update(good(num_samples=MAX_SAMPLES + 1), EXPECTED, "full", 10 * MAX_SAMPLES)


def test_missing_and_extra_tensors():
    tensors = good().tensors
    assert code_of(good(tensors={k: v for k, v in tensors.items() if k != "n"})) == "bad_tensors"
    assert code_of(good(tensors={**tensors, "x": np.zeros(1, np.float32)})) == "bad_tensors"
    assert code_of(good(tensors={})) == "bad_tensors"
    # the message names at most five of each, sorted
    six = {f"x{i}": np.zeros(1, np.float32) for i in range(6)}
    with pytest.raises(UpdateRejected) as e:
        validate_update(good(tensors=six), EXPECTED, "full", 100)
    assert e.value.code == "bad_tensors"
    assert e.value.message == ("missing tensors ['h', 'n', 'w'], "
                               "unexpected ['x0', 'x1', 'x2', 'x3', 'x4']")
    many = {f"m{i}": TensorSpec((1,)) for i in range(7)}
    with pytest.raises(UpdateRejected) as e:
        validate_update(good(tensors={}), many, "full", 100)
    assert e.value.message == "missing tensors ['m0', 'm1', 'm2', 'm3', 'm4'], unexpected []"


def test_shape():
    assert code_of(with_tensor("w", np.zeros((3, 2), np.float32))) == "bad_shape"
    assert code_of(with_tensor("w", np.zeros((2, 3, 1), np.float32))) == "bad_shape"
    assert code_of(with_tensor("n", np.array([5], np.int64))) == "bad_shape"  # (1,) is not ()
    with pytest.raises(UpdateRejected, match=r"^w: shape \(6,\), expected \(2, 3\)$"):
        validate_update(with_tensor("w", np.zeros(6, np.float32)), EXPECTED, "full", 100)


@pytest.mark.parametrize("name, value, code", [
    ("w", np.zeros((2, 3), np.float16), None),       # fp16 transfer of a float32 tensor
    ("w", np.zeros((2, 3), np.float64), "bad_dtype"),
    ("w", np.zeros((2, 3), np.int32), "bad_dtype"),
    ("h", np.ones(4, np.float32), None),             # a float16 tensor may come as float32 too
    ("h", np.ones(4, np.float64), "bad_dtype"),
    ("n", np.array(5, np.int32), "bad_dtype"),       # integers: exactly their dtype
    ("n", np.array(5, np.uint64), "bad_dtype"),
    ("n", np.array(5.0, np.float32), "bad_dtype"),
])
def test_dtype(name, value, code):
    assert code_of(with_tensor(name, value)) == code


def test_dtype_message():
    with pytest.raises(UpdateRejected, match=r"^n: dtype int32, expected int64$"):
        validate_update(with_tensor("n", np.array(5, np.int32)), EXPECTED, "full", 100)


@pytest.mark.parametrize("name, value", [
    ("w", np.array([[0, 0, 0], [0, 0, np.nan]], np.float32)),
    ("w", np.array([[0, 0, 0], [0, -np.inf, 0]], np.float32)),
    ("w", np.array([[np.nan] * 3] * 2, np.float16)),     # NaN in an fp16 transfer
    ("h", np.array([1, np.inf, 1, 1], np.float16)),
    ("h", np.array([1, 1, 1, np.nan], np.float32)),
])
def test_nonfinite_tensors(name, value):
    assert code_of(with_tensor(name, value)) == "nonfinite"


def test_largest_finite_values_pass():
    assert code_of(with_tensor("h", np.full(4, np.finfo(np.float16).max, np.float16))) is None
    assert code_of(with_tensor("w", np.full((2, 3), np.finfo(np.float32).max, np.float32))) is None
    assert code_of(with_tensor("n", np.array(np.iinfo(np.int64).max, np.int64))) is None


@pytest.mark.parametrize("value, code", [
    (float("inf"), "nonfinite"), (float("-inf"), "nonfinite"), (float("nan"), "nonfinite"),
    (1e308, None), (-0.0, None),
])
def test_metrics(value, code):
    assert code_of(good(metrics={"loss": 0.5, "acc": value})) == code


def test_checks_run_in_order():
    # a wrong label wins over everything; samples before tensors; shape before dtype before values
    bad = {"w": np.full((3, 2), np.nan, np.float64), "n": np.array(5, np.int64), "h": np.ones(4, np.float16)}
    assert code_of(good(label="x", num_samples=0, tensors=bad)) == "wrong_label"
    assert code_of(good(num_samples=0, tensors={})) == "bad_samples"
    assert code_of(good(tensors=bad)) == "bad_shape"
    assert code_of(with_tensor("w", np.full((2, 3), np.nan, np.float64))) == "bad_dtype"
    assert code_of(good(tensors={}, metrics={"loss": float("nan")})) == "bad_tensors"


def test_expected_from():
    specs = expected_from({"a": np.zeros((2, 1), np.float32), "b": np.zeros(3, np.int64)})
    assert specs == {"a": TensorSpec((2, 1), "float32"), "b": TensorSpec((3,), "int64")}
    assert TensorSpec((1,)).dtype == "float32"


def test_tensor_specs_are_immutable_values():
    spec = TensorSpec((2, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.shape = (3, 2)  # type: ignore[misc]
    assert len({spec, TensorSpec((2, 3), "float32"), TensorSpec((2, 3), "float16")}) == 2  # hashable by value

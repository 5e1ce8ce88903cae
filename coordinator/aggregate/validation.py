"""Checks an update must pass before it may touch the global model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import Update

__all__ = ["TensorSpec", "UpdateRejected", "validate_update", "expected_from"]

#: dtypes a float tensor may arrive in (fp16 transfer is allowed).
_FLOAT_WIRE = {"float32", "float16"}
#: An absolute cap on sample counts, whatever a device registered.
MAX_SAMPLES = 100_000_000


@dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype a tensor of an update must have."""

    shape: tuple[int, ...]
    dtype: str = "float32"


class UpdateRejected(ValueError):
    """An update that must not be aggregated; `code` (an `ErrorCode`) goes back to the device."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def expected_from(tensors: Mapping[str, np.ndarray]) -> dict[str, TensorSpec]:
    """The specs matching a set of reference tensors."""
    return {name: TensorSpec(tuple(a.shape), str(a.dtype)) for name, a in tensors.items()}


def validate_update(update: Update, expected: Mapping[str, TensorSpec], label: str,
                    max_samples: int) -> None:
    """Raise `UpdateRejected` unless `update` is exactly what was asked for and sane."""
    if update.label != label:
        raise UpdateRejected(ErrorCode.WRONG_LABEL, f"update is for {update.label!r}, device was assigned {label!r}")
    n = update.num_samples
    if not 1 <= n <= min(max_samples, MAX_SAMPLES):
        raise UpdateRejected(
            ErrorCode.BAD_SAMPLES, f"num_samples={n} is impossible: must be 1..{min(max_samples, MAX_SAMPLES)}")
    missing = sorted(set(expected) - set(update.tensors))
    extra = sorted(set(update.tensors) - set(expected))
    if missing or extra:
        raise UpdateRejected(ErrorCode.BAD_TENSORS, f"missing tensors {missing[:5]}, unexpected {extra[:5]}")
    for name, spec in expected.items():
        array = update.tensors[name]
        if tuple(array.shape) != spec.shape:
            raise UpdateRejected(ErrorCode.BAD_SHAPE, f"{name}: shape {tuple(array.shape)}, expected {spec.shape}")
        allowed = _FLOAT_WIRE if spec.dtype in _FLOAT_WIRE else {spec.dtype}
        if str(array.dtype) not in allowed:
            raise UpdateRejected(ErrorCode.BAD_DTYPE, f"{name}: dtype {array.dtype}, expected {spec.dtype}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise UpdateRejected(ErrorCode.NONFINITE, f"{name}: contains NaN or Inf")
    for key, value in update.metrics.items():
        if not math.isfinite(value):
            raise UpdateRejected(ErrorCode.NONFINITE, f"metric {key!r} is not finite")

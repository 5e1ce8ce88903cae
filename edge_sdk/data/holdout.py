"""The device's held-out share for federated evaluation, chosen by each sample's stable key.

A sample is held out when a hash of its key falls below the holdout fraction: a deterministic
choice per sample, so a sample never changes side as the data grows or its oldest rows are
dropped (``max_samples``), and nothing held out is ever trained on. Every class is held out at
that share in expectation (a stratified split by construction, though not to the sample);
a class with fewer than :data:`MIN_CLASS_SAMPLES` samples stays wholly in training, and a device
whose data would give fewer than :data:`MIN_HOLDOUT` held-out samples holds none out and says so.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np

from edge_sdk.methods.base import LocalData

__all__ = ["MIN_CLASS_SAMPLES", "MIN_HOLDOUT", "NO_HOLDOUT", "SOURCE_TEST_SET", "HoldoutSplit", "check_holdout",
           "sample_keys", "split_holdout"]

#: A device's holdout setting has three meanings: a fraction in (0, 0.9] of its samples, chosen by
#: key; this one, nothing (it trains on everything and answers an evaluation with no samples: the
#: Python API's and a simulation's default); or `SOURCE_TEST_SET`. A real device's TOML holds out
#: `edge_sdk.device_config.DEFAULT_HOLDOUT` unless told.
NO_HOLDOUT = 0.0
#: The held-out set its data source names (an npz's x_test/y_test), none of its training samples.
SOURCE_TEST_SET = None

#: A class with fewer samples than this on a device is not held out from (it stays in training).
MIN_CLASS_SAMPLES = 5
#: A device holding out fewer samples than this evaluates nothing (too few to mean anything).
MIN_HOLDOUT = 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class HoldoutSplit:
    """What a device trains on, what it evaluates on (None: nothing, with ``note`` saying why)."""

    train: LocalData
    holdout: LocalData | None
    note: str = ""


def check_holdout(fraction: object, where: str = "holdout") -> float:
    """``fraction`` as a float in (0, 0.9], else a one-line ValueError naming ``where``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction) \
            or not 0.0 < fraction <= 0.9:
        raise ValueError(f"{where} must be a fraction in (0, 0.9], got {str(fraction)[:40]!r}")
    return float(fraction)


def sample_keys(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One uint64 key per sample: the first 8 bytes of BLAKE2b over its bytes and label (for
    data whose source has no row key or timestamp)."""
    rows = np.ascontiguousarray(x).reshape(len(x), -1).view(np.uint8)
    keys = np.empty(len(x), dtype=np.uint64)
    for i in range(len(x)):
        digest = hashlib.blake2b(rows[i].tobytes(), digest_size=8, key=int(y[i]).to_bytes(8, "little", signed=True))
        keys[i] = int.from_bytes(digest.digest(), "little")
    return keys


def _unit(keys: np.ndarray) -> np.ndarray:
    """A uniform number in [0, 1) per key (splitmix64's finaliser), the same on every machine."""
    z = keys.astype(np.uint64) + _GOLDEN
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def split_holdout(data: LocalData, fraction: float) -> HoldoutSplit:
    """``data`` split into training and held-out samples by key (hashing the samples when
    ``data.keys`` is None); the order within each part is ``data``'s."""
    fraction = check_holdout(fraction)
    keys = data.keys if data.keys is not None else sample_keys(data.x, data.y)
    held = _unit(keys) < fraction
    classes, counts = np.unique(data.y, return_counts=True)
    small = classes[counts < MIN_CLASS_SAMPLES]
    if len(small):
        held &= ~np.isin(data.y, small)
    n_held = int(held.sum())
    if n_held < MIN_HOLDOUT or n_held == len(data):
        return HoldoutSplit(data, None, f"too little data to hold out {fraction:g} of it ({len(data)} samples, "
                                        f"{n_held} would be held out; at least {MIN_HOLDOUT} needed)")
    return HoldoutSplit(_subset(data, ~held), _subset(data, held))


def _subset(data: LocalData, mask: np.ndarray) -> LocalData:
    keys = data.keys[mask] if data.keys is not None else None
    return replace(data, x=data.x[mask], y=data.y[mask], keys=keys)

"""The device's held-out share for federated evaluation, chosen by each sample's stable key.

A sample is held out when a hash of its key falls below the holdout fraction, and by nothing
else: not the device's sample count, not its class mix. So a sample never changes side as the
data grows or its oldest rows are dropped (``max_samples``), and nothing held out is ever
trained on. Every class is held out at that share in expectation (a stratified split by
construction, though not to the sample). A device with fewer than :data:`MIN_HOLDOUT` held-out
samples evaluates none of them yet: they wait, neither trained on nor evaluated, until there
are enough, and the split says so.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # not imported: a device that only serves has no torch, and the label store splits by key too
    from edge_sdk.data.local_data import LocalData

__all__ = ["DEFAULT_HOLDOUT", "MIN_HOLDOUT", "NO_HOLDOUT", "SOURCE_TEST_SET", "HoldoutSplit", "check_holdout",
           "held_out", "sample_keys", "split_holdout"]

#: A device's holdout setting has three meanings: a fraction in (0, 0.9] of its samples, chosen by
#: key; this one, nothing (it trains on everything and answers an evaluation with no samples: the
#: Python API's and a simulation's default); or `SOURCE_TEST_SET`. A real device's TOML holds out
#: `DEFAULT_HOLDOUT` unless told.
NO_HOLDOUT = 0.0
#: The held-out set its data source names (an npz's x_test/y_test), none of its training samples.
SOURCE_TEST_SET = None

#: A real device's `[data] holdout` when its TOML gives none (and its source names no held-out set)
DEFAULT_HOLDOUT = 0.2

#: A device holding out fewer samples than this evaluates nothing yet (too few to mean anything);
#: they wait, neither trained on nor evaluated.
MIN_HOLDOUT = 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class HoldoutSplit:
    """What a device trains on, what it evaluates on (None: nothing, with ``note`` saying why).
    ``waiting`` held-out samples are too few to evaluate yet; they are not in ``train`` either."""

    train: LocalData
    holdout: LocalData | None
    note: str = ""
    waiting: int = 0


def check_holdout(fraction: object, where: str = "holdout") -> float:
    """``fraction`` as a float in (0, 0.9], else a one-line ValueError naming ``where``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction) \
            or not 0.0 < fraction <= 0.9:
        raise ValueError(f"{where} must be a fraction in (0, 0.9], got {str(fraction)[:40]!r}")
    return float(fraction)


def sample_keys(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One uint64 key per sample: the first 8 bytes of BLAKE2b over its bytes and label (for
    data whose source has no row key or timestamp)."""
    keys = np.empty(len(x), dtype=np.uint64)
    if not len(x):
        return keys
    rows = np.ascontiguousarray(x).reshape(len(x), -1).view(np.uint8)
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


def held_out(keys: np.ndarray, fraction: float, salt: int = 0) -> np.ndarray:
    """True for each key whose sample is held out at ``fraction``: decided by the key (and
    ``salt``, which makes an independent second split: pFedPara's) alone."""
    salted = keys.astype(np.uint64) ^ np.uint64(salt) if salt else keys
    return _unit(salted) < fraction


def split_holdout(data: LocalData, fraction: float, train_only: np.ndarray | None = None) -> HoldoutSplit:
    """``data`` split into training and held-out samples by key (hashing the samples when
    ``data.keys`` is None), the samples ``train_only`` marks (a person's corrections) always on the
    training side; the order within each part is ``data``'s."""
    fraction = check_holdout(fraction)
    keys = data.keys if data.keys is not None else sample_keys(data.x, data.y)
    held = held_out(keys, fraction)
    if train_only is not None:
        held &= ~train_only
    n_held = int(held.sum())
    train = _subset(data, ~held)
    if n_held < MIN_HOLDOUT:
        note = (f"{n_held} of its {len(data)} samples held out (holdout {fraction:g}): too few to evaluate "
                f"(at least {MIN_HOLDOUT}); they wait, not trained on") if n_held else \
               f"none of its {len(data)} samples held out yet (holdout {fraction:g})"
        return HoldoutSplit(train, None, note, waiting=n_held)
    return HoldoutSplit(train, _subset(data, held))


def _subset(data: LocalData, mask: np.ndarray) -> LocalData:
    keys = data.keys[mask] if data.keys is not None else None
    return replace(data, x=data.x[mask], y=data.y[mask], keys=keys)

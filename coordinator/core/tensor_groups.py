"""A method's checkpoint tensors as named groups (``group/name``), and back, checked."""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["flat_groups", "restore_groups"]


def flat_groups(groups: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Named groups of tensors as one flat map of ``group/name`` (a strategy's checkpoint tensors)."""
    return {f"{group}/{name}": value for group, tensors in groups.items() for name, value in tensors.items()}


def restore_groups(tensors: Mapping[str, np.ndarray], like: Mapping[str, Mapping[str, np.ndarray]],
                   what: str) -> dict[str, dict[str, np.ndarray]]:
    """The inverse of :func:`flat_groups`, checked against the groups ``like``: the same names and
    shapes, else ValueError naming ``what``; values keep ``like``'s dtypes."""
    reference = flat_groups(like)
    if set(tensors) != set(reference) or any(np.shape(tensors[k]) != np.shape(v) for k, v in reference.items()):
        raise ValueError(f"checkpoint tensors do not match this {what}")
    return {group: {name: np.asarray(tensors[f"{group}/{name}"], dtype=np.asarray(v).dtype)
                    for name, v in members.items()} for group, members in like.items()}

"""The `[data]` settings every source shares: shape, class names, how many samples to keep."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_sdk.data.preprocessing import MAX_CHANNELS, MAX_CLASS_NAME, Preprocessing

__all__ = ["MAX_CLASSES", "ReadOptions", "raw_preprocessing"]

#: Most classes a task may have (as `Preprocessing` allows).
MAX_CLASSES = 100_000
#: Most values one sample may hold (16 Mi floats: 64 MiB a sample).
MAX_SAMPLE_VALUES = 1 << 24


@dataclass(frozen=True)
class ReadOptions:
    """``input_shape``: one sample's shape (None: the source's own); ``classes``: the task's class
    names (string labels map to their index); ``num_classes``: the task's class count when labels
    are integers (labels at or above it are skipped); ``max_samples``: keep only the newest N;
    ``unlabelled``: read the rows whose label is empty instead (a csv or sqlite source: the rows a
    device that serves predicts, edge_sdk/serving/source_rows.py)."""

    input_shape: tuple[int, ...] | None = None
    classes: tuple[str, ...] = ()
    num_classes: int | None = None
    max_samples: int | None = None
    unlabelled: bool = False

    def __post_init__(self) -> None:
        shape = self.input_shape
        if shape is not None and (not 1 <= len(shape) <= 3 or not all(type(n) is int and 1 <= n <= 65536 for n in shape)
                                  or math.prod(shape) > MAX_SAMPLE_VALUES):
            raise ValueError(f"[data] input_shape must be 1 to 3 positive integers ([C, H, W], [C, L] or [F]) "
                             f"of at most {MAX_SAMPLE_VALUES} values, got {list(shape)!r}")
        if len(set(self.classes)) != len(self.classes) or not all(
                isinstance(c, str) and 0 < len(c) <= MAX_CLASS_NAME for c in self.classes) \
                or len(self.classes) > MAX_CLASSES:
            raise ValueError(f"[data] classes must be distinct names of 1..{MAX_CLASS_NAME} characters "
                             f"(at most {MAX_CLASSES})")
        n = self.num_classes
        if n is not None and (type(n) is not int or not 1 <= n <= MAX_CLASSES):
            raise ValueError(f"[data] num_classes must be an integer in [1, {MAX_CLASSES}], got {n!r}")
        if n is not None and self.classes and n != len(self.classes):
            raise ValueError(f"[data] num_classes = {n} but classes names {len(self.classes)}")
        m = self.max_samples
        if m is not None and (type(m) is not int or m < 1):
            raise ValueError(f"[data] max_samples must be an integer >= 1, got {m!r}")

    @property
    def class_limit(self) -> int:
        """Labels must lie in [0, class_limit)."""
        return len(self.classes) or self.num_classes or MAX_CLASSES

    def known_classes(self) -> int | None:
        """The class count the configuration fixes, else None (then: the largest label + 1)."""
        return len(self.classes) or self.num_classes


def raw_preprocessing(sample_shape: tuple[int, ...], classes: tuple[str, ...] = ()) -> Preprocessing:
    """The normalisation of raw values (mean 0, std 1 per channel: axis 1 of a batch)."""
    channels = sample_shape[0] if sample_shape else 1
    if channels > MAX_CHANNELS:
        raise ValueError(f"[data] input_shape {list(sample_shape)} has {channels} channels (its first axis); at most "
                         f"{MAX_CHANNELS}: give input_shape = [C, L] (e.g. [1, {channels}])")
    shape = sample_shape if len(sample_shape) <= 3 and all(n <= 65536 for n in sample_shape) else ()
    return Preprocessing((0.0,) * channels, (1.0,) * channels, classes, shape)

"""A log of sensor readings (one row per reading: a timestamp, one column per channel, a label)
cut into fixed windows ``(C, L)``: the samples a 1-D model trains on.

``[data] window = L`` (with ``csv`` or ``sqlite``), ``stride = S`` (default L: windows side by
side) and ``window_label`` — how a window gets its label from its readings' labels: ``last`` (the
newest reading's, the default: the state the window ends in), ``majority`` (the most frequent;
a tie goes to the newest of the tied labels) or ``uniform`` (only windows whose readings all
agree; the others are skipped and counted).

Windows are ``L`` consecutive valid readings in timestamp order, counted from the oldest reading
the source holds, so a reading appended to the log only adds windows: the old ones keep their
readings and their key (the key of their newest reading), and the federated-evaluation holdout,
chosen by key, stays put as the log grows. Gaps in the timestamps are not looked at (a reading
skipped as invalid, or one never logged, joins its neighbours into one window). ``max_samples``
keeps the newest windows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edge_sdk.data.local_data import LocalData
from edge_sdk.sources.base import DataSource, NoData, Skipped, SourceRead
from edge_sdk.sources.options import ReadOptions, raw_preprocessing

__all__ = ["WINDOW_LABELS", "MAX_WINDOW", "MAX_WINDOW_VALUES", "WindowSpec", "WindowedSource", "cut_windows"]

WINDOW_LABELS = ("last", "majority", "uniform")
#: the longest window (and stride), in readings
MAX_WINDOW = 65_536
MIXED = "window with mixed labels"
#: the most values the windows of one read may hold in all (256 Mi floats: 1 GiB)
MAX_WINDOW_VALUES = 1 << 28


@dataclass(frozen=True)
class WindowSpec:
    """``length`` readings a window, a new window every ``stride`` readings, labelled by ``label``."""

    length: int
    stride: int | None = None
    label: str = "last"

    def __post_init__(self) -> None:
        for name in ("length", "stride"):
            value = getattr(self, name)
            if value is None and name == "stride":
                continue
            if type(value) is not int or not 1 <= value <= MAX_WINDOW:
                raise ValueError(f"[data] {'window' if name == 'length' else name} must be an integer in "
                                 f"[1, {MAX_WINDOW}] (readings), got {value!r}")
        if self.label not in WINDOW_LABELS:
            raise ValueError(f"[data] window_label must be one of {', '.join(WINDOW_LABELS)}, got {self.label!r}")

    @property
    def step(self) -> int:
        return self.stride or self.length


def _majority(labels: np.ndarray) -> int:
    """The most frequent label of one window (oldest first); a tie goes to the newest tied label."""
    values, counts = np.unique(labels, return_counts=True)
    tied = set(values[counts == counts.max()].tolist())
    return int(next(v for v in labels[::-1] if int(v) in tied))


def cut_windows(readings: LocalData, spec: WindowSpec, options: ReadOptions, skipped: Skipped,
                where: str) -> LocalData:
    """The windows of ``readings`` (a source's read: one reading of F channels a sample, newest
    first): ``(F, L)`` samples, newest window first, at most ``options.max_samples``."""
    if readings.x.ndim != 2:
        raise ValueError(f"{where}: windows are cut from readings of one value per channel (columns), "
                         f"not samples of shape {list(readings.x.shape[1:])}")
    x, y = readings.x[::-1], readings.y[::-1]  # oldest first
    keys = readings.keys[::-1] if readings.keys is not None else None
    length, step = spec.length, spec.step
    channels = x.shape[1]
    if options.input_shape is not None and tuple(options.input_shape) != (channels, length):
        raise ValueError(f"[data] input_shape {list(options.input_shape)} does not match windows of {channels} "
                         f"channels and {length} readings: give [{channels}, {length}] or leave it out")
    if len(x) < length:
        raise NoData(f"{where}: {len(x)} valid readings, fewer than one window of {length}")
    ends = np.arange(length - 1, len(x), step)  # each window's newest reading
    # views, nothing copied: window i starts at reading i * step
    labels = np.lib.stride_tricks.sliding_window_view(y, length)[::step]  # (M, L), oldest reading first
    if spec.label == "last":
        chosen, ok = labels[:, -1], np.ones(len(ends), dtype=bool)
    elif spec.label == "majority":
        chosen, ok = np.array([_majority(row) for row in labels], np.int64), np.ones(len(ends), dtype=bool)
    else:
        ok = (labels == labels[:, :1]).all(axis=1)
        chosen = labels[:, -1]
        if (~ok).any():
            skipped[MIXED] += int((~ok).sum())
    index = np.flatnonzero(ok)[::-1][:options.max_samples]  # newest first
    if not len(index):
        raise NoData(f"{where}: no window of {length} readings with one label (skipped {skipped.summary()})")
    if len(index) * channels * length > MAX_WINDOW_VALUES:  # windows overlap: the log's size times L / S
        raise ValueError(f"{where}: {len(index)} windows of {channels} x {length} values exceed "
                         f"{MAX_WINDOW_VALUES:,} values in all; set [data] max_samples or a longer stride")
    # only the windows kept are copied out of the readings (they overlap when the stride is short)
    windows = np.lib.stride_tricks.sliding_window_view(x, length, axis=0)[::step][index]  # (M, F, L)
    window_keys = None if keys is None else np.ascontiguousarray(keys[ends[index]], dtype=np.uint64)
    return LocalData(np.ascontiguousarray(windows, dtype=np.float32), chosen[index].astype(np.int64),
                     readings.num_classes, raw_preprocessing((channels, length), options.classes), window_keys)


class WindowedSource:
    """A csv or sqlite source of readings, read whole (no ``max_samples``, no ``input_shape``:
    those apply to the windows), then cut into windows by ``spec``."""

    def __init__(self, readings: DataSource, spec: WindowSpec, options: ReadOptions) -> None:
        self.readings, self.spec, self.options = readings, spec, options
        labelled = {"last": "labelled by their newest reading", "majority": "labelled by their most frequent label",
                    "uniform": "one label each"}[spec.label]
        self.description = f"{readings.description}, windows of {spec.length} readings every {spec.step}, {labelled}"

    @staticmethod
    def reading_options(options: ReadOptions) -> ReadOptions:
        """What the readings' source reads with: the task's classes, every reading, one per row."""
        return replace(options, input_shape=None, max_samples=None)

    def read(self) -> SourceRead:
        read = self.readings.read()
        skipped = Skipped()
        where = self.readings.description
        data = cut_windows(read.data, self.spec, self.options, skipped, where)
        return SourceRead(data, None, {**read.skipped, **skipped.report(where, unit="windows")})

"""Smart-home sensor datasets of the UCR/UEA archive, read from the ``.ts`` files that sktime's
wheel ships (``pip install 'edgefl[sensors]'``; sktime is located, never imported):

- ``plaid``: plug-load current signatures of 11 appliance types from more than 56 households
  (537 + 537 series of 100-1,344 values, repeated or cut to windows of `PLAID_LENGTH`);
- ``acsf1``: power consumption signatures of 10 home-appliance types (100 + 100, length 1,460);
- ``basicmotions``: smartwatch accelerometer + gyroscope, 6 channels, 4 activities (40 + 40,
  length 100).

Each keeps the archive's own train/test split. Where the series differ in length (PLAID), every
series becomes a window of one length *at its own time scale*: a shorter one repeated end to end
(a PLAID series is a few cycles of an appliance's mains current, which repeat), a longer one cut
(`repeat_to`). Resampling each series to one length instead (linear interpolation, before
2026-11-29) stretched every waveform by its own factor, so the same appliance showed different
frequencies: sktime's MiniRocket + ridge scored 0.896 on the resampled series against 0.955 on
the raw variable-length ones, edgefl's MiniRocket 0.901 resampled and 0.945 repeated to 500
(`bench/minirocket_peer.py`, BENCHMARKS.md "Series model family"). A device's live readings are
windows of a stream, as these are. Padding with zeros would make the length a feature of the
recording rather than of the appliance.
Sources and licences: docs/sensor-data.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from edge_sdk.data.ts_format import TsData, read_ts

__all__ = ["SENSOR_DATASETS", "PLAID_LENGTH", "resample", "repeat_to", "sensor_files", "load_sensor_arrays"]

#: PLAID's windows: its series repeated or cut to this many values (the median training series has
#: 300; 94% of them have at most 500, so few are cut)
PLAID_LENGTH = 500

#: name -> (folder and file stem in sktime/datasets/data, class names, fixed length or None)
SENSOR_DATASETS: dict[str, tuple[str, tuple[str, ...], int | None]] = {
    "plaid": ("PLAID", ("air conditioner", "compact fluorescent lamp", "fan", "fridge", "hair dryer", "heater",
                        "incandescent light bulb", "laptop", "microwave", "vacuum", "washing machine"), PLAID_LENGTH),
    "acsf1": ("ACSF1", ("mobile phone charger", "coffee machine", "computer station", "fridge/freezer",
                        "hi-fi system", "CFL lamp", "laptop charger", "microwave oven", "printer", "television"),
              None),
    "basicmotions": ("BasicMotions", (), None),  # the file names its classes
}


def resample(series: np.ndarray, length: int) -> np.ndarray:
    """A ``(C, L)`` series resampled to ``(C, length)`` by linear interpolation over the same
    span (the first and last values kept)."""
    channels, current = series.shape
    if current == length:
        return series.astype(np.float32, copy=False)
    if current == 1:
        return np.repeat(series, length, axis=1).astype(np.float32)
    at = np.linspace(0.0, current - 1, length)
    return np.stack([np.interp(at, np.arange(current), series[c]) for c in range(channels)]).astype(np.float32)


def repeat_to(series: np.ndarray, length: int) -> np.ndarray:
    """A ``(C, L)`` series as ``(C, length)``: repeated end to end when shorter, its first ``length``
    values when longer (the published model does the same in its graph: `Preprocessing.repeat`)."""
    return np.stack([np.resize(np.asarray(c, np.float32), length) for c in series])


def sensor_files(name: str) -> tuple[Path, Path]:
    """The train and test ``.ts`` files of dataset ``name`` inside the installed sktime."""
    folder, _, _ = SENSOR_DATASETS[name]
    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"dataset {name!r} needs the sensors extra: pip install 'edgefl[sensors]' "
                         "(sktime ships its .ts files)")
    base = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / folder
    files = (base / f"{folder}_TRAIN.ts", base / f"{folder}_TEST.ts")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"dataset {name!r}: the installed sktime lacks {', '.join(missing)}")
    return files


def _stack(data: TsData, length: int) -> np.ndarray:
    return np.stack([repeat_to(s, length) for s in data.series])


def load_sensor_arrays(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """``(x_train, y_train, x_test, y_test, classes)`` of dataset ``name``, raw (not normalised),
    x as float32 N x C x L at the dataset's fixed length."""
    if name not in SENSOR_DATASETS:
        raise ValueError(f"unknown sensor dataset {name!r}; valid: {', '.join(SENSOR_DATASETS)}")
    _, names, fixed = SENSOR_DATASETS[name]
    train_file, test_file = sensor_files(name)
    train, test = read_ts(train_file), read_ts(test_file)
    if train.classes != test.classes or train.channels != test.channels:
        raise ValueError(f"dataset {name!r}: its train and test files declare different classes or channels")
    length = fixed or int(train.series[0].shape[1])
    for data, path in ((train, train_file), (test, test_file)):
        if fixed is None and set(data.lengths().tolist()) != {length}:
            raise ValueError(f"{path}: series of unequal length, and dataset {name!r} has no fixed length")
    classes = names or train.classes
    if len(classes) != len(train.classes):
        raise ValueError(f"dataset {name!r}: {len(train.classes)} classes in its files, {len(classes)} names here")
    return _stack(train, length), train.labels, _stack(test, length), test.labels, tuple(classes)

"""A device's ``[data]`` table: which source it reads (docs/data-sources.md), how much it holds
out, and — when it serves — its label store beside it. Torch-free: a device that only serves reads
its source's unlabelled rows with it (edge_sdk/serving/source_rows.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from edge_sdk.config import section, setting
from edge_sdk.data.datasets import DATASETS
from edge_sdk.data.holdout import DEFAULT_HOLDOUT, SOURCE_TEST_SET, check_holdout
from edge_sdk.sources.base import DataSource
from edge_sdk.sources.combined import CombinedSource
from edge_sdk.sources.csv_file import CsvSource
from edge_sdk.sources.dataset import DatasetSource
from edge_sdk.sources.images import ImageFolderSource
from edge_sdk.sources.label_store_source import LabelStoreSource
from edge_sdk.sources.loader import PythonSource
from edge_sdk.sources.npz import NpzSource, npz_has_test
from edge_sdk.sources.options import ReadOptions
from edge_sdk.sources.sqlite_db import SqliteSource
from edge_sdk.sources.table import Columns
from edge_sdk.sources.windows import WindowedSource, WindowSpec

__all__ = ["DATA_KEYS", "DEFAULT_HOLDOUT", "DEFAULT_STATE_DIR", "SOURCE_KEYS", "data_source_from_toml",
           "holdout_from_toml", "training_source"]

#: where a device keeps its state (installed model, label store) when its TOML names no state_dir
DEFAULT_STATE_DIR = "/var/lib/edgefl"

#: the `[data]` keys naming a source (one of them; none: dataset = "mnist-sample")
SOURCE_KEYS = ("dataset", "npz", "csv", "sqlite", "images", "python")
#: keys that only some sources take
_KEY_OWNERS = {"root": ("dataset",), "partition": ("dataset",), "shard": ("dataset",), "shards": ("dataset",),
               "query": ("sqlite",), "python_path": ("python",), "label": ("csv", "sqlite"),
               "features": ("csv", "sqlite"), "key": ("csv", "sqlite"), "window": ("csv", "sqlite"),
               "stride": ("csv", "sqlite"), "window_label": ("csv", "sqlite")}
DATA_KEYS = {*SOURCE_KEYS, *_KEY_OWNERS, "max_samples", "input_shape", "classes", "num_classes", "holdout",
             "reread_s"}


def data_source_from_toml(config: dict, unlabelled: bool = False) -> DataSource:
    """The data source the `[data]` table names (docs/data-sources.md): exactly one of
    ``npz``, ``csv``, ``sqlite`` (with ``query``), ``images``, ``python`` or ``dataset`` (a public
    dataset or ``"npz:/path"``; the default, ``mnist-sample``), with the shared ``input_shape``,
    ``classes``, ``num_classes`` and ``max_samples``. A bad key is a one-line ValueError naming it.
    ``unlabelled``: the same source reading the rows whose label is empty (csv and sqlite only: the
    rows a device that serves predicts, ``[serve] rows``)."""
    data = section(config, "data", DATA_KEYS)
    kinds = [k for k in SOURCE_KEYS if k in data]
    if len(kinds) > 1:
        raise ValueError(f"[data] names {len(kinds)} sources ({', '.join(kinds)}); give one")
    kind = kinds[0] if kinds else "dataset"
    for key, owners in _KEY_OWNERS.items():
        if key in data and kind not in owners:
            raise ValueError(f"[data] {key} applies to {' and '.join(owners)} only, not to {kind}")
    options = replace(_read_options(data), unlabelled=unlabelled)
    if unlabelled and kind not in ("csv", "sqlite"):
        raise ValueError(f"[serve] rows reads the rows of a csv or sqlite [data] source whose label is empty; "
                         f"this device's is {kind}")
    if kind == "dataset":
        return _dataset_source(config, data, options)
    path = setting(data, kind, str, None, "[data]")
    if not path:
        raise ValueError(f"[data] {kind} must not be empty")
    if kind == "npz":
        return NpzSource(path, options)
    if kind == "images":
        return ImageFolderSource(path, options)
    if kind == "python":
        folder = setting(data, "python_path", str, None, "[data]")
        if folder is not None and not Path(folder).expanduser().is_dir():
            raise ValueError(f"[data] python_path {folder} is not a folder")
        return PythonSource(path, folder, options)
    features = _names(data, "features")
    columns = Columns(label=setting(data, "label", str, "label", "[data]"), features=features,
                      key=setting(data, "key", str, None, "[data]"), first_is_key=kind == "sqlite")
    windows = _windows(data)
    reading = options if windows is None else WindowedSource.reading_options(options)
    if kind == "csv":
        source: DataSource = CsvSource(path, columns, reading)
    elif "query" not in data:
        raise ValueError('[data] sqlite needs query = "SELECT ..." (e.g. "SELECT ts, temp, humidity, label FROM '
                         'readings")')
    else:
        source = SqliteSource(path, data["query"], columns, reading)
    return source if windows is None else WindowedSource(source, windows, options)


def _windows(data: dict) -> WindowSpec | None:
    """`[data] window`, `stride`, `window_label`: readings cut into windows (sources/windows.py)."""
    if "window" not in data:
        for key in ("stride", "window_label"):
            if key in data:
                raise ValueError(f"[data] {key} needs window = L (readings per window)")
        return None
    return WindowSpec(setting(data, "window", int, None, "[data]"), setting(data, "stride", int, None, "[data]"),
                      setting(data, "window_label", str, "last", "[data]"))


def holdout_from_toml(config: dict) -> float | None:
    """`[data] holdout`: the share of its data a device holds out for federated evaluation, a
    fraction in (0, 0.9]; default DEFAULT_HOLDOUT, or `SOURCE_TEST_SET` when the source is an npz
    holding x_test and y_test and no holdout is given."""
    data = section(config, "data", DATA_KEYS)
    if "holdout" in data:
        return check_holdout(data["holdout"], "[data] holdout")
    source = data_source_from_toml(config)
    if isinstance(source, NpzSource) and npz_has_test(source.path):
        return SOURCE_TEST_SET
    return DEFAULT_HOLDOUT


def _read_options(data: dict) -> ReadOptions:
    shape = setting(data, "input_shape", list, None, "[data]")
    classes = _names(data, "classes")
    return ReadOptions(input_shape=None if shape is None else tuple(shape), classes=classes or (),
                       num_classes=setting(data, "num_classes", int, None, "[data]"),
                       max_samples=setting(data, "max_samples", int, None, "[data]"))


def _names(data: dict, key: str) -> tuple[str, ...] | None:
    """A list of non-empty strings (`features`, `classes`), or None when absent."""
    value = setting(data, key, list, None, "[data]")
    if value is not None and (not value or not all(isinstance(v, str) and v for v in value)):
        raise ValueError(f"[data] {key} must be a list of names, e.g. {key} = [\"a\", \"b\"]")
    return None if value is None else tuple(value)


def _dataset_source(config: dict, data: dict, options: ReadOptions) -> DataSource:
    """`dataset`: a public dataset's train split or one shard of it, or "npz:/path"."""
    root = setting(data, "root", str, None, "[data]")
    if root is not None and not Path(root).expanduser().is_dir():
        raise ValueError(f"[data] root {root} is not a folder")
    name = setting(data, "dataset", str, "mnist-sample", "[data]")
    if not name.startswith("npz:") and name not in DATASETS:
        raise ValueError(f"[data] dataset must be one of {', '.join(DATASETS)} or 'npz:<path>', got {name!r}")
    if "shard" not in data and name.startswith("npz:"):
        return NpzSource(name[4:], options)
    for key in ("input_shape", "classes", "num_classes"):
        if key in data:
            raise ValueError(f"[data] {key} does not apply to a public dataset ({name}): it has its own")
    if "shard" not in data:
        return DatasetSource(name, root, max_samples=options.max_samples)
    shards = setting(data, "shards", int, 1, "[data]")
    index = setting(data, "shard", int, 0, "[data]")
    if not 0 <= index < shards:
        raise ValueError(f"[data] shard must be in 0..{shards - 1}, got {index}")
    scheme = setting(data, "partition", str, "iid", "[data]")
    return DatasetSource(name, root, (index, shards, scheme), seed=setting(config, "seed", int, 0),
                         max_samples=options.max_samples)


def training_source(config: dict, serves: bool) -> DataSource:
    """What the device trains on: its ``[data]`` source and, when it ``serves``, the windows the home
    labelled and a person corrected (its label store in ``state_dir``); a device that serves and
    names no ``[data]`` source trains on its label store alone."""
    if not serves:
        return data_source_from_toml(config)
    data = section(config, "data", DATA_KEYS)
    options = _read_options(data)
    # the windows' own shape, not [data] input_shape (the [data] source's samples must match them anyway)
    store = LabelStoreSource(setting(config, "state_dir", str, DEFAULT_STATE_DIR), replace(options, input_shape=None))
    if not any(kind in data for kind in SOURCE_KEYS):
        return store
    return CombinedSource([data_source_from_toml(config), store])

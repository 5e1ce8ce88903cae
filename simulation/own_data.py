"""``edgefl simulate --dataset client:FILE.toml``: the data a device's client TOML names (its
``[data]``: CSV, SQLite, npz, image folders, windows of readings) as a simulated job's dataset — a
central and a federated baseline of one's own task before a device joins.

The source is read once, as the device reads it (columns, classes, input shape, windows). The test
set is the source's own (an npz's ``x_test``) or its held-out side by key (``[data] holdout``, the
device's default when absent): the very samples a device would hold out. The rest is the training
split, partitioned over the simulated devices like any dataset's."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from edge_sdk.config import read_toml
from edge_sdk.data.datasets import ImageDataset, dataset_from_arrays, load_dataset
from edge_sdk.data.holdout import split_holdout
from edge_sdk.device_config import data_source_from_toml, holdout_from_toml
from edge_sdk.sources import NoData

__all__ = ["CLIENT_PREFIX", "load_simulation_dataset"]

CLIENT_PREFIX = "client:"


def load_simulation_dataset(name: str, root: str | Path | None = None, seed: int = 0,
                            train_order: Callable[[np.ndarray, int], np.ndarray] | None = None,
                            keep_raw_train: bool = False) -> ImageDataset:
    """`load_dataset`, or a client TOML's ``[data]`` for ``client:FILE``."""
    if not name.startswith(CLIENT_PREFIX):
        return load_dataset(name, root=root, seed=seed, train_order=train_order, keep_raw_train=keep_raw_train)
    path = Path(name[len(CLIENT_PREFIX):]).expanduser()
    config = read_toml(path)
    try:
        source = data_source_from_toml(config)
        read = source.read()
    except NoData as exc:
        raise ValueError(f"{path}: [data] holds no samples yet: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    data, test = read.data, read.test
    if test is None:
        split = split_holdout(data, holdout_from_toml(config))
        if split.holdout is None:
            raise ValueError(f"{path}: no test set: {split.note}")
        data, test = split.train, split.holdout
    classes = data.preprocessing.classes if data.preprocessing is not None else ()
    return dataset_from_arrays(f"client:{path.name}", data.x, data.y, test.x, test.y, data.num_classes,
                               tuple(classes), train_order=train_order)

"""A public dataset's train split, or one shard of it: demos without a device's own data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.local_data import LocalData
from edge_sdk.data.partition import partition
from edge_sdk.sources.base import NoData, SourceRead

__all__ = ["DatasetSource"]


class DatasetSource:
    """``dataset = "mnist-sample"`` (with ``root``; ``partition``, ``shard``, ``shards`` for one
    share of it): the train split, normalised with its own statistics. A sample's key is its index
    in the train split. The data does not grow: it comes in the dataset's order, and
    ``max_samples`` keeps the first N. Loaded once."""

    def __init__(self, name: str, root: str | Path | None = None, shard: tuple[int, int, str] | None = None,
                 seed: int = 0, max_samples: int | None = None) -> None:
        self.name, self.root, self.shard, self.seed, self.max_samples = name, root, shard, seed, max_samples
        part = f" shard {shard[0]} of {shard[1]} ({shard[2]})" if shard else ""
        self.description = f"dataset {name}{part}"
        self._read: SourceRead | None = None

    def read(self) -> SourceRead:
        if self._read is None:
            self._read = self._load()
        return self._read

    def _load(self) -> SourceRead:
        try:
            dataset = load_dataset(self.name, root=self.root)
        except OSError as exc:  # its files are not where it looks (the message says where and how to get them)
            raise ValueError(str(exc) if exc.strerror is None else f"{exc.filename}: {exc.strerror}") from None
        index = np.arange(len(dataset.y_train))
        if self.shard is not None:
            shard, shards, scheme = self.shard
            index = partition(dataset.y_train, shards, scheme, seed=self.seed)[shard]
        index = np.asarray(index)[:self.max_samples]
        if not len(index):
            raise NoData(f"dataset {self.name}: the shard is empty")
        own = dataset.preprocessing if dataset.mean else None
        data = LocalData(np.ascontiguousarray(dataset.x_train[index]), np.ascontiguousarray(dataset.y_train[index]),
                         dataset.num_classes, own, index.astype(np.uint64))
        return SourceRead(data, None, {})

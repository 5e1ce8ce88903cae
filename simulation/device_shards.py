"""The simulated devices' private data, held once: the private images in partition order (device
0's shard, then device 1's, ...), so that every device's shard is a slice of one array — a view,
not a copy. Saved to a folder, the arrays open memory-mapped in any process of the machine (each
Ray actor), which then shares one copy in the page cache and reads only the shards of the devices
that train; a device that never trains costs none of its images' memory.

A training split too large to hold (`edge_sdk.data.spilled_arrays`) gives shards in a temporary file,
memory-mapped: the process holds only the pages of the shards it reads. The simulation loads an
image dataset's training split raw (uint8, `load_dataset`'s ``keep_raw_train``): a quarter of the
bytes to write and map (470 MB, not 1.9 GB, at 10,000 devices × 60 images), normalised by each
device when it trains.

Without it, each device copied its shard (``x[shard]``): the fleet held the dataset twice (1.9 GB
more at 10,000 devices × 60 Fashion-MNIST images), and each Ray actor loaded the dataset again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_sdk.data.datasets import ImageDataset
from edge_sdk.methods import LocalData
from edge_sdk.data.partition import partition
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.data.spilled_arrays import copy_spilled, spill_rows

if TYPE_CHECKING:
    from simulation.config import SimulationConfig

__all__ = ["DeviceShards", "DeviceOrder", "device_layout"]

#: the arrays a saved `DeviceShards` folder holds, each a ``.npy`` file
_ARRAYS = ("x", "y", "keys", "offsets", "num_classes")


def device_layout(config: "SimulationConfig", y: np.ndarray, private: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``private`` (rows of a training split with labels ``y``) in the devices' order — the
    partition among ``config.clients`` devices by ``config.partition`` — and where each device's
    rows start and end in it (``offsets``, one more than the devices)."""
    shards = partition(y[private], config.clients, config.partition, seed=config.federation.seed)
    order = np.concatenate([private[s] for s in shards]) if shards else np.empty(0, np.int64)
    offsets = np.zeros(len(shards) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in shards])
    return order, offsets


@dataclass(frozen=True)
class DeviceShards:
    """Device ``i``'s data is rows ``offsets[i]:offsets[i + 1]`` of ``x``/``y``/``keys`` (``keys``: each
    image's row in the dataset's training split, its stable key for the federated-evaluation holdout)."""

    x: np.ndarray
    y: np.ndarray
    keys: np.ndarray
    offsets: np.ndarray
    num_classes: int

    @classmethod
    def build(cls, config: "SimulationConfig", dataset: ImageDataset, private: np.ndarray) -> "DeviceShards":
        """The partition of ``private`` (rows of the training split) among ``config.clients``
        devices by ``config.partition`` — the same split in whichever process builds it."""
        order, offsets = device_layout(config, dataset.y_train, private)
        # a spilled training split gives spilled shards: gathered a chunk at a time, never held
        return cls(spill_rows(dataset.x_train, order), dataset.y_train[order], order.astype(np.uint64), offsets,
                   dataset.num_classes)

    def __len__(self) -> int:
        """The number of devices."""
        return len(self.offsets) - 1

    def local_data(self, device: int) -> LocalData:
        """Device ``device``'s private data: views of the shared arrays (nothing copied). Raw uint8
        samples say so (`Preprocessing.raw`): the device normalises them with the job's statistics
        each time it trains (`LocalData.normalised_as`), and keeps no normalised copy."""
        start, end = int(self.offsets[device]), int(self.offsets[device + 1])
        raw = Preprocessing.raw(self.x.shape[1]) if self.x.dtype == np.uint8 else None
        return LocalData(self.x[start:end], self.y[start:end], self.num_classes, raw, keys=self.keys[start:end])

    def save(self, folder: str | Path) -> Path:
        """Write the arrays to ``folder`` (created) for `open` in other processes."""
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:  # a spilled array's file is linked, not read through its mapping
            copy_spilled(getattr(self, name), path / f"{name}.npy")
        return path

    @classmethod
    def open(cls, folder: str | Path) -> "DeviceShards":
        """The shards `save`d in ``folder``, memory-mapped read-only (a device's images are read
        from the file when it trains; the page cache holds one copy for every process)."""
        path = Path(folder)
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in _ARRAYS}
        shards = cls(arrays["x"], arrays["y"], arrays["keys"], np.asarray(arrays["offsets"]),
                     int(arrays["num_classes"]))
        if shards.offsets.ndim != 1 or len(shards.offsets) < 1 or int(shards.offsets[-1]) != len(shards.y) \
                or len(shards.x) != len(shards.y) or len(shards.keys) != len(shards.y):
            raise ValueError(f"{path}: the device shards' arrays do not fit together")
        return shards


class DeviceOrder:
    """The training split in the devices' order — device 0's images, device 1's, ..., then the
    public set's (for a method that distils) —, as `load_dataset`'s ``train_order``: normalised in
    this order in one pass, the split holds every device's shard as a slice, and `split` needs no
    second copy (`DeviceShards.build` gathers one: a spilled split of 600,000 images took 3.5 s
    more). The shards are those `DeviceShards.build` cuts from the split in its published order."""

    def __init__(self, config: "SimulationConfig") -> None:
        self.config = config
        self.offsets: np.ndarray | None = None  # the devices' shards (known once the labels were seen)
        self.public: int | None = None  # how many public rows follow them (None: no public set)

    def __call__(self, y: np.ndarray, num_classes: int) -> np.ndarray:
        """The order of the training split with labels ``y``: its rows, device by device, then public."""
        from simulation.config import public_rows

        public = public_rows(self.config, y, num_classes)
        everything = np.arange(len(y))
        private = everything if public is None else np.setdiff1d(everything, public)
        order, self.offsets = device_layout(self.config, y, private)
        self.public = None if public is None else len(public)
        return order if public is None else np.concatenate([order, public])

    def split(self, dataset: ImageDataset) -> tuple[DeviceShards, np.ndarray | None]:
        """The devices' shards and the public inputs (None: no public set) of ``dataset``, which
        `load_dataset` stored in this order."""
        if self.offsets is None or dataset.train_rows is None:
            raise ValueError("the dataset was not loaded in the devices' order (load_dataset's train_order)")
        n = int(self.offsets[-1])
        x = dataset.x_train if n == len(dataset.x_train) else dataset.x_train[:n]  # the whole (spilled) array if it can
        shards = DeviceShards(x, dataset.y_train[:n], dataset.train_rows[:n].astype(np.uint64), self.offsets,
                              dataset.num_classes)
        if self.public is None:
            return shards, None
        public = dataset.x_train[n:]  # the coordinator's: normalised, whatever the devices' are
        if dataset.raw_train:
            public = dataset.preprocessing.convert_from(Preprocessing.raw(public.shape[1]), public)
        return shards, public

"""The simulated devices' data is held once: every shard is a view of one partition-ordered
array (the same images, labels and keys a per-device copy had), saved once and opened
memory-mapped by other processes (Ray actors)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.partition import partition
from simulation.config import SimulationConfig, split_public
from simulation.device_shards import DeviceShards


@pytest.fixture(scope="module")
def job():
    config = SimulationConfig(method="fedavg", dataset="mnist-sample", clients=7, partition="dirichlet:0.5")
    dataset = load_dataset(config.dataset, seed=config.federation.seed)
    private, _ = split_public(config, dataset)
    return config, dataset, private


def test_each_shard_is_a_view_holding_what_a_copy_held(job) -> None:
    config, dataset, private = job
    shards = DeviceShards.build(config, dataset, private)
    split = partition(dataset.y_train[private], config.clients, config.partition, seed=config.federation.seed)
    assert len(shards) == config.clients
    for device, rows in enumerate(split):
        data = shards.local_data(device)
        assert np.shares_memory(data.x, shards.x)  # nothing copied per device
        np.testing.assert_array_equal(data.x, dataset.x_train[private[rows]])
        np.testing.assert_array_equal(data.y, dataset.y_train[private[rows]])
        np.testing.assert_array_equal(data.keys, private[rows].astype(np.uint64))
    assert shards.x.nbytes == dataset.x_train[private].nbytes  # the private images once, in all


def test_saved_shards_open_memory_mapped_and_read_only(job, tmp_path) -> None:
    config, dataset, private = job
    shards = DeviceShards.build(config, dataset, private)
    opened = DeviceShards.open(shards.save(tmp_path / "shards"))
    assert isinstance(opened.x, np.memmap) and not opened.x.flags.writeable
    for device in range(len(shards)):
        mine, theirs = shards.local_data(device), opened.local_data(device)
        np.testing.assert_array_equal(mine.x, theirs.x)
        np.testing.assert_array_equal(mine.keys, theirs.keys)
        assert theirs.num_classes == dataset.num_classes


def test_a_folder_whose_arrays_do_not_fit_is_refused(job, tmp_path) -> None:
    config, dataset, private = job
    folder = DeviceShards.build(replace(config, clients=3), dataset, private).save(tmp_path / "shards")
    np.save(folder / "y.npy", np.zeros(5, np.int64))
    with pytest.raises(ValueError, match="do not fit together"):
        DeviceShards.open(folder)


@pytest.mark.parametrize("method, partition_name", [("fedavg", "iid"), ("fedavg", "dirichlet:0.5"), ("reft", "iid")])
def test_a_split_loaded_in_the_devices_order_gives_the_same_shards_without_a_gather(method, partition_name,
                                                                                     monkeypatch) -> None:
    from edge_sdk.data import datasets as data_module
    from edge_sdk.data.spilled_arrays import is_spilled
    from simulation.device_shards import DeviceOrder

    config = SimulationConfig(method=method, dataset="mnist-sample", clients=9, partition=partition_name)
    published = load_dataset(config.dataset, seed=config.federation.seed)
    private, public = split_public(config, published)
    gathered = DeviceShards.build(config, published, private)
    monkeypatch.setattr(data_module, "SPILL_BYTES", published.x_train.nbytes - 1)  # spilled, as a large split is
    order = DeviceOrder(config)
    ordered = load_dataset(config.dataset, seed=config.federation.seed, train_order=order)
    shards, ordered_public = order.split(ordered)
    for name in ("y", "keys", "offsets"):
        np.testing.assert_array_equal(getattr(shards, name), getattr(gathered, name))
    np.testing.assert_array_equal(shards.x, gathered.x)  # the same images, bit for bit
    assert is_spilled(shards.x) == (public is None)  # the split itself, not a copy, when no public set follows it
    if public is None:
        assert ordered_public is None
    else:
        np.testing.assert_array_equal(ordered_public, public)
    np.testing.assert_array_equal(ordered.x_test, published.x_test)
    np.testing.assert_array_equal(ordered.y_train[ordered.train_rows.argsort()], published.y_train)


@pytest.mark.parametrize("method", ["fedavg", "reft"])
def test_a_raw_split_gives_each_device_the_very_floats_of_the_normalised_one(method, monkeypatch) -> None:
    """`keep_raw_train`: the shards hold the bytes (a quarter of the floats' size, spilled as they
    would be); a device normalising its own with the job's statistics gets the same floats, bit for
    bit, and the coordinator's public set is normalised as before."""
    from edge_sdk.data import datasets as data_module
    from edge_sdk.data.spilled_arrays import is_spilled
    from simulation.device_shards import DeviceOrder

    config = SimulationConfig(method=method, dataset="mnist-sample", clients=9, partition="dirichlet:0.5")
    order = DeviceOrder(config)
    normalised, want_public = order.split(load_dataset(config.dataset, seed=config.federation.seed, train_order=order))
    monkeypatch.setattr(data_module, "SPILL_BYTES", 4000 * 784 - 1)  # the raw split is spilled too
    order = DeviceOrder(config)
    raw_dataset = load_dataset(config.dataset, seed=config.federation.seed, train_order=order, keep_raw_train=True)
    assert raw_dataset.raw_train and raw_dataset.x_train.dtype == np.uint8 and is_spilled(raw_dataset.x_train)
    raw, public = order.split(raw_dataset)
    job = raw_dataset.preprocessing
    for device in range(len(raw)):
        data = raw.local_data(device)
        assert data.x.dtype == np.uint8 and data.preprocessing.is_raw and np.shares_memory(data.x, raw.x)
        got, want = data.normalised_as(job).x, normalised.local_data(device).x
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if want_public is None:
        assert public is None
    else:
        assert public.dtype == np.float32 and np.array_equal(public.view(np.uint32), want_public.view(np.uint32))


def test_a_train_order_that_is_no_permutation_is_refused() -> None:
    with pytest.raises(ValueError, match="train_order must give a permutation of the 4000 training rows"):
        load_dataset("mnist-sample", seed=0, train_order=lambda y, _classes: np.zeros(len(y), np.int64))
    with pytest.raises(ValueError, match="not loaded in the devices. order"):
        from simulation.device_shards import DeviceOrder
        DeviceOrder(SimulationConfig(clients=3)).split(load_dataset("mnist-sample", seed=0))

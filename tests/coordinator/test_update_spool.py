"""Accepted updates beyond the fleet's memory budget wait in files (issue 61): read back as they
were, aggregated to the same bits as in memory, their files gone once they are aggregated."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from coordinator.aggregate.robust import robust_aggregate
from coordinator.core.received_update import ReceivedUpdate
from coordinator.core.spooled_tensors import SpooledTensors, pick
from coordinator.runtime.device_budgets import FleetLimits
from coordinator.runtime.update_spool import UpdateSpool
from edge_sdk.methods.settings.shared import RobustConfig
from edge_sdk.protocol.messages import Update


def _tensors(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": (rng.normal(size=(5, 7)) * scale).astype(np.float32),
            "b": (rng.normal(size=7) * scale).astype(np.float32),
            "bn.num_batches_tracked": np.array(3 + seed, dtype=np.int64)}


def _received(seed: int, scale: float = 1.0) -> ReceivedUpdate:
    return ReceivedUpdate(f"dev{seed:03d}", 0, Update("global", _tensors(seed, scale), 10 + seed, {}), 1000)


def test_spooled_tensors_read_back_as_written_and_their_file_goes_with_them(tmp_path) -> None:
    tensors = {**_tensors(1), "empty": np.zeros((0, 3), np.float32), "big_endian": np.arange(4, dtype=">f4")}
    spooled = SpooledTensors.write(tensors, tmp_path)
    assert list(spooled) == list(tensors) and len(spooled) == len(tensors)
    for name, value in tensors.items():
        assert spooled[name].shape == value.shape and np.array_equal(spooled[name], value)
    assert spooled.nbytes == sum(v.nbytes for v in tensors.values())
    with pytest.raises((ValueError, TypeError)):
        spooled["w"][0, 0] = 1.0  # read-only: nothing downstream may change a device's update
    view = pick(spooled, ["b"], prefix="")
    path = spooled.path
    del spooled
    gc.collect()
    assert os.path.exists(path) and np.array_equal(view["b"], tensors["b"])  # the view keeps the file
    del view
    gc.collect()
    assert not os.path.exists(path)


def test_pick_of_a_dict_is_a_dict_of_the_same_arrays() -> None:
    tensors = {"x.a": np.ones(2), "x.b": np.zeros(3)}
    picked = pick(tensors, ["a"], prefix="x.")
    assert isinstance(picked, dict) and picked["a"] is tensors["x.a"]


def test_updates_over_the_budget_go_to_files_and_the_budget_frees_as_updates_go(tmp_path) -> None:
    size = sum(v.nbytes for v in _tensors(0).values())
    spool = UpdateSpool(memory_bytes=2 * size, directory=tmp_path)
    kept = [spool.keep(_received(i)) for i in range(4)]
    assert [isinstance(k.update.tensors, SpooledTensors) for k in kept] == [False, False, True, True]
    assert spool.in_memory == 2 * size and spool.spilled == 2
    assert np.array_equal(kept[3].update.tensors["w"], _tensors(3)["w"])
    assert kept[3].device_id == "dev003" and kept[3].update.num_samples == 13
    del kept[0]
    gc.collect()
    assert spool.in_memory == size  # one in memory gone: room for the next
    assert not isinstance(spool.keep(_received(5)).update.tensors, SpooledTensors)
    spool_dir = kept[-1].update.tensors.path
    del kept
    gc.collect()
    assert not os.path.exists(spool_dir)
    spool.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rule", ["mean", "median", "trimmed"])
def test_spooled_updates_aggregate_to_the_same_bits_as_updates_in_memory(tmp_path, rule: str) -> None:
    current = _tensors(100)
    in_memory = [_received(i, scale=50.0 if i == 4 else 1.0) for i in range(7)]  # one is clipped
    spool = UpdateSpool(memory_bytes=0, directory=tmp_path)
    spooled = [spool.keep(r) for r in in_memory]
    assert all(isinstance(r.update.tensors, SpooledTensors) for r in spooled)
    config = RobustConfig(rule=rule)
    weights = [r.update.num_samples for r in in_memory]
    expected, metrics = robust_aggregate(current, [r.update.tensors for r in in_memory], weights, config)
    got, got_metrics = robust_aggregate(current, [r.update.tensors for r in spooled], weights, config)
    assert got_metrics == metrics and metrics.get("clipped") == 1.0
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name


def test_an_update_whose_file_cannot_be_written_stays_in_memory(tmp_path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the spool folder would go")
    spool = UpdateSpool(0, blocked)
    kept = spool.keep(_received(2))
    assert isinstance(kept.update.tensors, dict) and np.array_equal(kept.update.tensors["w"], _tensors(2)["w"])
    assert spool.write_failures == 1 and spool.spilled == 0


def test_a_killed_jobs_spool_is_removed_by_the_next_job_in_its_folder(tmp_path) -> None:
    killed = UpdateSpool(0, tmp_path)
    killed.keep(_received(1))  # its folder stays: nothing closed it
    (tmp_path / "report.json").write_text("{}")
    assert len(list(tmp_path.glob("update-spool-*"))) == 1
    assert UpdateSpool(0, tmp_path).clear_stale() == 1
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_memory_budget_is_a_checked_fleet_limit() -> None:
    assert FleetLimits().updates_in_memory_bytes == 512 << 20
    with pytest.raises(ValueError, match="updates_in_memory_bytes"):
        FleetLimits(updates_in_memory_bytes=-1)

"""Validation without side effects: checking a job's settings writes nothing, a settings object
checks a device name's syntax without asking torch for a GPU, and importing the transport
installs no logging filter (the first connection does)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from tests.support.run_python import run_python
from edge_sdk.accelerator import check_device_name
from simulation.config import SimulationConfig, sim_federation
from simulation.simulate import JOB_FILE, check_same_job, keep_job_settings


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_a_device_name_is_checked_without_asking_torch(name, monkeypatch) -> None:
    def probe(*_args):
        raise AssertionError("validation asked torch for a GPU")

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    monkeypatch.setattr(torch.cuda, "device_count", probe)
    assert check_device_name(name) == name
    assert SimulationConfig(sim_device=name).sim_device == name


@pytest.mark.parametrize("name", ["gpu", "", "CUDA", "cuda:x", "mps", None])
def test_a_bad_device_name_is_a_one_line_error_listing_the_choices(name) -> None:
    with pytest.raises(ValueError, match="auto, cpu, cuda") as err:
        check_device_name(name)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        SimulationConfig(sim_device=name)


def test_checking_a_job_writes_nothing_keeping_it_writes_once(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    config = SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder), rounds=2))
    check_same_job(config)
    assert not folder.exists()
    keep_job_settings(config)
    stored = (folder / JOB_FILE).read_text()
    assert json.loads(stored)["rounds"] == 2
    # rounds may change on resume
    check_same_job(SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder), rounds=5)))
    keep_job_settings(SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder), rounds=5)))
    assert (folder / JOB_FILE).read_text() == stored  # the first job's settings stay
    with pytest.raises(ValueError, match="another job"):
        check_same_job(SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder), seed=1)))


def test_a_job_kept_before_a_setting_existed_resumes_with_it_at_its_default(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    config = SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder), rounds=2))
    keep_job_settings(config)
    stored = json.loads((folder / JOB_FILE).read_text())
    for newer in ("asynchronous", "buffer_size", "offline"):  # settings an older edgefl did not keep
        del stored[newer]
    (folder / JOB_FILE).write_text(json.dumps(stored))
    check_same_job(config)
    with pytest.raises(ValueError, match="another job .asynchronous was None, now True"):
        check_same_job(SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder), rounds=2,
                                                                  asynchronous=True)))


def test_the_job_settings_of_an_older_edgefl_are_refused_in_one_line(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    old = SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder))).to_plain()
    old = {**old, **old.pop("federation")}  # 0.2 kept a flat SimulationConfig and no format
    old.pop("format", None)
    (folder / JOB_FILE).write_text(json.dumps(old))
    with pytest.raises(ValueError, match="written by an older edgefl") as err:
        check_same_job(SimulationConfig(federation=sim_federation(checkpoint_dir=str(folder))))
    assert "\n" not in str(err.value) and "another --checkpoint-dir" in str(err.value)


def test_importing_the_transport_installs_no_logging_filter() -> None:
    run_python("import logging, edge_sdk.networking.transport as t",
               "assert not logging.getLogger('edge_sdk.networking.transport.paho').filters",
               "assert t._paho_logger().filters == [t._BENIGN_PAHO_NOISE]",
               "assert t._paho_logger().filters == [t._BENIGN_PAHO_NOISE]  # installed once")


def test_paho_noise_after_a_clean_disconnect_goes_to_debug(caplog) -> None:
    from edge_sdk.networking.transport import _paho_logger

    logger = _paho_logger()
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.error("Client is not connected")
        logger.error("failed to receive on socket")
    assert [r.getMessage() for r in caplog.records] == ["failed to receive on socket"]


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "flanc", "heterofl", "fedpara", "pfedpara", "lowrank",
                                    "fdnnc", "static-prune"])
def test_building_a_method_leaves_torchs_global_generator_alone(method) -> None:
    options = {"gamma": "0.5"} if "para" in method or method == "lowrank" else {}  # built now, not at setup
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies import create_strategy
    from coordinator.strategies.base import StrategyContext

    def build(seed: int):
        return create_strategy(method, StrategyContext(FederationConfig(seed=seed), "mlp", (1, 8, 8), 4,
                                                       options=options))

    torch.manual_seed(1234)
    before = torch.get_rng_state()
    first = build(7)
    assert torch.equal(torch.get_rng_state(), before)  # not reseeded, not advanced
    torch.manual_seed(99)  # whatever the caller's state, the same seed builds the same model
    again = build(7)
    assert all(np.array_equal(a, again.state_tensors()[k]) for k, a in first.state_tensors().items())

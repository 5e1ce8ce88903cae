"""A seeded simulation repeats itself (issue 36): the same seed and the same torch thread count
give the same accuracy and loss in every round, bit for bit; the job's thread count is set for
the run only."""

from __future__ import annotations

import os

import pytest
import torch

from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from edge_sdk.device_config import schedule_from_toml
from edge_sdk.training import TrainConfig, default_threads


def _rounds(tmp_path, broker, name: str, threads: int) -> list[tuple[dict, float]]:
    config = SimulationConfig(method="fedavg", clients=3, dataset="digits", partition="shards:4",
                              out=str(tmp_path / name), broker_url=broker.url, job=name, plots=False,
                              threads=threads,
                              federation=sim_federation(rounds=2, seed=3, train=TrainConfig(epochs=1, batch_size=16)))
    report = run_simulation(config)
    assert all(r.aggregated for r in report.rounds)
    return [(r.accuracy, r.loss) for r in report.rounds]


@pytest.mark.slow
def test_same_seed_and_threads_give_the_same_rounds(tmp_path, broker):
    before = torch.get_num_threads()
    first = _rounds(tmp_path, broker, "det-a", threads=1)
    assert torch.get_num_threads() == before  # the job's threads are set for the run only
    assert _rounds(tmp_path, broker, "det-b", threads=1) == first


def test_default_threads_are_half_the_cpus_and_flags_override_them():
    from edge_sdk.cli import build_parser

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert default_threads() == max(1, cpus // 2)
    assert SimulationConfig().threads == default_threads()
    parser = build_parser()
    assert parser.parse_args(["simulate"]).threads is None  # then default_threads()
    assert parser.parse_args(["simulate", "--threads", "2"]).threads == 2
    assert schedule_from_toml({}).threads == default_threads()
    assert schedule_from_toml({"schedule": {"threads": 3}}).threads == 3

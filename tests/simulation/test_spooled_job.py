"""A job whose updates wait in files (the fleet's memory budget exceeded: issue 61) gives the same
rounds, to the bit, as one that holds them in memory — synchronous and asynchronous — and leaves
no spool behind."""

from __future__ import annotations

import pytest

from coordinator.runtime import fleet as fleet_module
from coordinator.runtime.update_spool import UpdateSpool
from edge_sdk.training import TrainConfig
from simulation.simulate import SimulationConfig, run_simulation, sim_federation

spools: list[UpdateSpool] = []


def _rounds(tmp_path, broker, name: str, method: str, **federation) -> list[tuple]:
    config = SimulationConfig(method=method, clients=4, dataset="digits", model="mlp", partition="shards:4",
                              out=str(tmp_path / name), broker_url=broker.url, job=name, plots=False, threads=1,
                              profiles=("raspberry-pi-3b", "laptop"),
                              federation=sim_federation(seed=5, train=TrainConfig(epochs=1, batch_size=16),
                                                        **federation))
    report = run_simulation(config)
    assert all(r.aggregated for r in report.rounds)
    return [(r.accuracy, r.loss, r.metrics.get("staleness_mean")) for r in report.rounds]


@pytest.mark.parametrize(("method", "federation"), [
    ("fedavg", {"rounds": 2}),
    ("heterofl", {"rounds": 2}),
    ("fedavg", {"rounds": 3, "asynchronous": True, "buffer_size": 2}),
])
def test_a_job_with_its_updates_in_files_repeats_the_job_in_memory(tmp_path, broker, monkeypatch, method,
                                                                    federation) -> None:
    in_memory = _rounds(tmp_path, broker, "memory", method, **federation)

    def no_memory(_budget: int, directory) -> UpdateSpool:
        spools.append(UpdateSpool(0, directory))
        return spools[-1]
    monkeypatch.setattr(fleet_module, "UpdateSpool", no_memory)
    assert _rounds(tmp_path, broker, "files", method, **federation) == in_memory
    assert spools[-1].spilled >= 4 and spools[-1].in_memory == 0
    assert not [p.name for p in (tmp_path / "files").iterdir() if p.name.startswith("update-spool")]

"""The papers' protocol in simulation: K of N devices per round and evaluation every N rounds
(the last round always), so that a long job's time goes to training."""

from __future__ import annotations

import pytest

from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.core.federation import FederationConfig
from edge_sdk.training import TrainConfig


def test_k_devices_per_round_and_evaluation_every_second_round(tmp_path, broker) -> None:
    config = SimulationConfig(method="fedavg", clients=5, dataset="digits", model="mlp", out=str(tmp_path),
                              broker_url=broker.url, job="sampling", plots=True,
                              federation=sim_federation(rounds=3, devices_per_round=2, eval_every=2,
                                                        train=TrainConfig(epochs=1, batch_size=32, lr=0.05)))
    report = run_simulation(config)
    assert [len(r.participants) for r in report.rounds] == [2, 2, 2]
    assert len({tuple(r.participants) for r in report.rounds}) > 1  # sampled anew each round
    assert [bool(r.accuracy) for r in report.rounds] == [False, True, True]  # round 2, and the last
    assert report.rounds[0].loss is None and report.rounds[2].loss is not None
    final = report.to_dict()["final"]
    # the round counted from 1; the accuracy 0.744 measured 2026-11-25
    assert final["evaluated_round"] == 3 and final["accuracy"]["global"] > 0.71
    csv_rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert csv_rows[1].split(",")[:4] == ["1", "0", "", ""]  # round 1 (index 0): no accuracy, no loss
    assert (tmp_path / "accuracy.png").stat().st_size > 0


@pytest.mark.parametrize("kw, message", [
    ({"devices_per_round": 5}, "devices_per_round must be an integer in 1..clients (4)"),
    ({"devices_per_round": 0}, "devices_per_round"),
    ({"eval_every": 0}, "eval_every must be an integer >= 1"),
])
def test_impossible_sampling_settings_are_rejected(kw, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SimulationConfig(clients=4, federation=sim_federation(**kw))


def test_the_coordinator_config_takes_eval_every() -> None:
    assert FederationConfig(eval_every=5).eval_every == 5
    with pytest.raises(ValueError, match="eval_every"):
        FederationConfig(eval_every=1.5)


def test_a_fleet_too_big_for_one_process_is_sent_to_the_ray_backend() -> None:
    with pytest.raises(ValueError, match="at most 10000 simulated devices with connections of their own; "
                                         ".* use --connections shared .* or --backend ray"):
        SimulationConfig(clients=10_001, connections="own")
    assert SimulationConfig(clients=10_001, backend="ray", connections="own").clients == 10_001
    assert SimulationConfig(clients=10_001).shared_connections  # one process holds them on a shared connection
    assert SimulationConfig(clients=1000).clients == 1000  # one process holds a thousand now


def test_a_fleet_too_big_for_the_open_file_limit_is_one_line(monkeypatch) -> None:
    import resource

    from simulation.open_files import ensure_open_files

    monkeypatch.setattr(resource, "getrlimit", lambda _kind: (1024, 4096))
    raised = []
    monkeypatch.setattr(resource, "setrlimit", lambda _kind, limits: raised.append(limits))
    assert ensure_open_files(3000) == 3512 and raised == [(3512, 4096)]
    with pytest.raises(ValueError, match=r"5000 simulated devices need about 5512 open files .* allows 4096 "
                                         r"\(ulimit -Hn\)"):
        ensure_open_files(5000)


def test_a_simulation_publishes_to_at_most_its_publish_devices_last_round_first() -> None:
    from types import SimpleNamespace

    from coordinator.runtime.report import RoundRecord, RunReport
    from coordinator.runtime.round_loop import RoundLoop
    from simulation.config import SIM_PUBLISH_DEVICES

    assert sim_federation().publish_devices == SIM_PUBLISH_DEVICES and FederationConfig().publish_devices is None
    fleet = SimpleNamespace(devices={f"d{i}": None for i in range(6)})
    report = RunReport("fedavg", {})
    report.add_round(RoundRecord(0, {}, None, 0, 0, 0.0, 0.0, ["d4", "d5"], True))
    loop = RoundLoop(SimpleNamespace(config=FederationConfig(publish_devices=3)), fleet, report)  # type: ignore[arg-type]
    assert loop._publish_to() == ["d4", "d5", "d0"]
    loop.config = FederationConfig(publish_devices=6)
    assert loop._publish_to() is None  # every device
    with pytest.raises(ValueError, match="publish_devices must be an integer >= 1"):
        FederationConfig(publish_devices=0)

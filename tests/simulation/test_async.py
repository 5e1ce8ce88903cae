"""Buffered asynchronous aggregation (FedBuff) on a simulated fleet, over a real broker, and the
synchronous loop on the same simulated clock (availability, a simulated deadline)."""

from __future__ import annotations

import pytest

from coordinator.core.federation import FederationConfig
from coordinator.runtime.sim_clock import SimClock
from edge_sdk.training import TrainConfig
from simulation.simulate import SimulationConfig, run_simulation, sim_federation

#: a 150x speed spread: the laptops' updates arrive long before the Pis'
PROFILES = ("raspberry-pi-3b", "laptop")
TRAIN = TrainConfig(epochs=1, batch_size=32, lr=0.05)


def _job(tmp_path, broker, name: str, method: str = "fedavg", clients: int = 6, offline: str | None = None,
         sim_deadline_s: float | None = None, options: dict[str, str] | None = None,
         profiles: tuple[str, ...] = PROFILES, **federation):
    config = SimulationConfig(
        method=method, clients=clients, dataset="digits", model="mlp", partition="iid", holdout=0.0,
        out=str(tmp_path / name), broker_url=broker.url, job=f"async-{name}", profiles=profiles, plots=False,
        federation=sim_federation(train=TRAIN, **federation), offline=offline, sim_deadline_s=sim_deadline_s,
        options=options or {},
    )
    return run_simulation(config)


def test_an_asynchronous_job_steps_every_buffer_of_distinct_devices(tmp_path, broker) -> None:
    report = _job(tmp_path, broker, "fedbuff", rounds=5, asynchronous=True, buffer_size=3)
    rounds = report.rounds
    assert [r.version for r in rounds] == [1, 2, 3, 4, 5]
    for r in rounds:
        assert r.aggregated and len(r.participants) == 3 == len(set(r.participants))
        assert r.metrics["staleness_max"] <= 100 and r.metrics["staleness_mean"] >= 0
    times = [r.metrics["sim_time_s"] for r in rounds]
    assert times == sorted(times) and times[0] > 0
    assert sum(r.seconds for r in rounds) == pytest.approx(times[-1])
    assert rounds[-1].accuracy["global"] > 0.5  # digits: chance is 0.1


def test_asynchronous_versions_come_at_the_fast_devices_pace(tmp_path, broker) -> None:
    sync = _job(tmp_path, broker, "sync", rounds=3)
    fedbuff = _job(tmp_path, broker, "async", rounds=3, asynchronous=True, buffer_size=3)
    # a round waits for the Pis; a buffer of three fills with the laptops' updates
    assert fedbuff.rounds[-1].metrics["sim_time_s"] < sync.rounds[-1].metrics["sim_time_s"] / 10
    assert all(set(r.participants) <= {"dev001", "dev003", "dev005"} for r in fedbuff.rounds)


def test_updates_staler_than_max_staleness_are_refused_and_counted(tmp_path, broker) -> None:
    report = _job(tmp_path, broker, "stale", rounds=4, asynchronous=True, buffer_size=2, max_staleness=0)
    assert all(r.metrics["staleness_max"] == 0 for r in report.rounds)
    assert sum(r.metrics["stale_refused"] for r in report.rounds) > 0


def test_a_resumed_asynchronous_job_continues_its_versions_and_clock(tmp_path, broker) -> None:
    settings = dict(asynchronous=True, buffer_size=3, checkpoint_dir=str(tmp_path / "ckpt"))
    first = _job(tmp_path, broker, "resume", rounds=2, **settings)
    again = _job(tmp_path, broker, "resume", rounds=4, **settings)
    assert [r.version for r in again.rounds] == [1, 2, 3, 4]
    assert [r.metrics["sim_time_s"] for r in again.rounds[:2]] == [r.metrics["sim_time_s"] for r in first.rounds]
    assert again.rounds[2].metrics["sim_time_s"] > first.rounds[-1].metrics["sim_time_s"]
    assert again.rounds[2].metrics["dispatches"] > first.rounds[-1].metrics["dispatches"]


@pytest.mark.parametrize("method", ["flanc", "heterofl"])
def test_more_methods_fold_stale_updates_asynchronously(tmp_path, broker, method) -> None:
    report = _job(tmp_path, broker, method, method=method, rounds=4, asynchronous=True, buffer_size=3)
    assert [r.version for r in report.rounds] == [1, 2, 3, 4]
    pis = [r for r in report.rounds if set(r.participants) == {"dev000", "dev002", "dev004"}]
    assert pis and pis[0].metrics["staleness_max"] >= 1  # the slow devices' updates, stale, folded
    assert max(report.rounds[-1].accuracy.values()) > 0.5


def test_fedpara_folds_asynchronously(tmp_path, broker) -> None:
    report = _job(tmp_path, broker, "fedpara", method="fedpara", rounds=3, asynchronous=True, buffer_size=3)
    assert [r.version for r in report.rounds] == [1, 2, 3]
    assert report.rounds[-1].accuracy["global"] > 0.5


def test_reft_has_no_asynchronous_form(tmp_path) -> None:
    with pytest.raises(ValueError, match="asynchronous aggregation is for .*reft distils once"):
        SimulationConfig(method="reft", federation=sim_federation(asynchronous=True), out=str(tmp_path))


def test_asynchronous_settings_are_checked() -> None:
    for bad in ({"buffer_size": 0}, {"max_staleness": -1}, {"concurrency": 0}, {"asynchronous": "yes"},
                {"staleness": "square"}):
        with pytest.raises(ValueError):
            FederationConfig(**bad)


def _unconnected_loop(cls, **federation):
    """An asynchronous loop of a small FedAvg job on a fleet never connected (its settings are
    checked, its bookkeeping runs, nothing is sent)."""
    from coordinator.runtime.fleet import Fleet
    from coordinator.runtime.report import RunReport
    from coordinator.strategies.fedavg import FedAvg
    from edge_sdk.models.zoo import mlp
    from edge_sdk.networking.link import MessageLink
    from edge_sdk.networking.transport import MqttTransport, TransportConfig
    from edge_sdk.protocol.topics import Topics

    strategy = FedAvg(FederationConfig(seed=0, asynchronous=True, **federation),
                      mlp(in_features=16, num_classes=3, hidden=(8,)))
    fleet = Fleet(MessageLink(MqttTransport(TransportConfig(url="mqtt://127.0.0.1:1"))), Topics(job="unconnected"))
    return cls(strategy, fleet, RunReport("fedavg", {}))


def test_only_a_real_fleets_asynchronous_loop_is_paced_by_new_data() -> None:
    """A simulated device's data does not grow: `AsyncLoop` refuses ``min_new_samples`` in one line,
    `FleetAsyncLoop` (a real fleet's) takes it."""
    from coordinator.runtime.async_loop import AsyncLoop
    from coordinator.runtime.fleet_async_loop import FleetAsyncLoop

    with pytest.raises(ValueError, match="a simulated asynchronous job is not paced by new data"):
        _unconnected_loop(AsyncLoop, min_new_samples=10)
    assert _unconnected_loop(FleetAsyncLoop, min_new_samples=10).serving is not None


def test_a_device_that_keeps_declining_is_asked_less_and_less_often() -> None:
    """A real fleet's device that declines (outside its training window) rests `RETRY_AFTER_S`,
    twice that after its second decline in a row, ... at most `MAX_REST_S`."""
    import time

    from coordinator.runtime.fleet_async_loop import MAX_REST_S, RETRY_AFTER_S, FleetAsyncLoop

    loop = _unconnected_loop(FleetAsyncLoop)
    rests = []
    for declines in (1, 2, 3, 10):
        loop._declines["phone"] = declines
        loop._drop("phone", rest=True)
        rests.append(loop._resting["phone"] - time.monotonic())
    expected = [RETRY_AFTER_S, 2 * RETRY_AFTER_S, 4 * RETRY_AFTER_S, MAX_REST_S]
    assert all(e - 1 < r <= e for r, e in zip(rests, expected, strict=True)), rests
    loop._drop("quiet", rest=True)  # a plan closed at its deadline, no decline: the plain rest
    assert RETRY_AFTER_S - 1 < loop._resting["quiet"] - time.monotonic() <= RETRY_AFTER_S


def test_a_synchronous_round_drops_what_arrives_after_its_simulated_deadline(tmp_path, broker) -> None:
    free = _job(tmp_path, broker, "free", clients=4, rounds=1)
    laptop = max(free.rounds[0].seconds / 100, 0.001)  # far under a Pi's time, above a laptop's
    report = _job(tmp_path, broker, "deadline", clients=4, rounds=2, sim_deadline_s=laptop * 10)
    for r in report.rounds:
        assert r.participants == ["dev001", "dev003"] and r.metrics["late"] == 2
        assert r.seconds == pytest.approx(laptop * 10)


def test_a_synchronous_round_asks_only_the_devices_online_then(tmp_path, broker) -> None:
    report = _job(tmp_path, broker, "away", clients=6, rounds=4, offline="1:0.5:20")
    clock = SimClock.from_text(0, "1:0.5:20")
    start = 0.0
    for r in report.rounds:
        assert r.participants and all(clock.online(d, start) for d in r.participants)
        start = r.metrics["sim_time_s"]


def test_a_claimed_sample_count_grows_per_version_not_per_plan_sent(tmp_path, broker) -> None:
    """A device that claims 1,000x its samples weighs what the fleet lets a count grow to — by
    `FleetLimits.sample_growth` per version, as per round in a synchronous job (were it per plan
    sent, the bound would loosen with every plan the fleet sends anyone)."""
    import csv
    from dataclasses import replace
    from unittest import mock

    from coordinator.runtime.device_budgets import FleetLimits, grown_sample_limit
    from edge_sdk.methods import DEVICE_METHODS

    honest = DEVICE_METHODS["fedavg"]

    def inflating(plan, data, ctx):
        update = honest(plan, data, ctx)
        return replace(update, num_samples=update.num_samples * 1000) if ctx.device_id == "dev001" else update
    with mock.patch.dict(DEVICE_METHODS, {"fedavg": inflating}):
        report = _job(tmp_path, broker, "inflate", clients=6, rounds=8, asynchronous=True, buffer_size=2)
    with open(tmp_path / "inflate" / "devices.csv") as rows:
        trained = [(int(r["round"]), r["device"], int(r["trained"])) for r in csv.DictReader(rows) if r["trained"]]
    honest_count = max(n for _, device, n in trained if device == "dev003")  # a laptop, as dev001 is
    theirs = [(version, n) for version, device, n in trained if device == "dev001"]
    assert theirs and report.rounds[-1].metrics["dispatches"] > 2 * len(report.rounds)  # many plans a version
    for version, n in theirs:
        assert honest_count < n <= grown_sample_limit(honest_count + 1, version, FleetLimits())


def test_with_offline_profiles_a_phone_away_is_not_asked(tmp_path, broker) -> None:
    config = SimulationConfig(clients=8, offline="profiles", profiles=("laptop", "android-midrange"))
    clock = config.sim_clock()
    away = sorted(d for d in clock.by_device if not clock.online(d, 0.0))
    assert away  # seed 0: some phones are away at the start of the day
    report = _job(tmp_path, broker, "phones", clients=8, rounds=2, offline="profiles",
                  profiles=("laptop", "android-midrange"))
    for r in report.rounds:
        assert r.participants and not set(r.participants) & set(away)

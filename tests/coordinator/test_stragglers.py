"""A participant that takes its plan and never answers stops holding every round to its deadline
(issue 56): once it missed `straggler_after` of its last 4 rounds the round waits for it only as
long again as the others took, once it has its quorum; it is waited for in full again once its
misses age out, and a late update of the latest round takes that miss back."""

from __future__ import annotations

import threading
import time

from edge_sdk.protocol.messages import Update
from tests.support.raw_devices import registered_fleet, send_as

JOB = "stragglers"
DEADLINE_S = 5.0
QUICK_S = 3.0  # a round that did not wait for its deadline (0.2 s + the others + a 0.5 s grace)


def _round(fleet, strategy, topics, peers, rnd: int, answering: list[str], straggler_after: int = 1):
    """One collection of round ``rnd`` from every peer; ``answering`` send their update at once.
    Returns what was collected and how long the collection took."""
    result: dict = {}
    names = sorted(peers)
    collector = threading.Thread(target=lambda: result.update(collected=fleet.collect(
        rnd, names, DEADLINE_S, strategy.check_update, quorum=2, straggler_after=straggler_after)))
    started = time.monotonic()
    collector.start()
    time.sleep(0.2)
    for d in answering:
        send_as(peers[d], topics, d, Update("global", dict(strategy.weights), 10, {}), rnd)
    collector.join(timeout=DEADLINE_S + 5)
    return result["collected"], time.monotonic() - started


def test_a_silent_participant_is_not_waited_for_once_it_is_a_straggler(broker):
    with registered_fleet(broker.url, JOB, ["a", "b", "silent"]) as (fleet, strategy, topics, peers):
        fleet.straggler_grace_min_s = 0.5
        for rnd in (0, 1):  # its first two misses: waited for until the deadline
            collected, took = _round(fleet, strategy, topics, peers, rnd, ["a", "b"], straggler_after=2)
            assert took >= DEADLINE_S and sorted(collected.updates) == ["a", "b"] and collected.not_waited_for == []
        assert fleet.devices["silent"].missed_rounds == 2 and fleet.devices["a"].missed_rounds == 0
        collected, took = _round(fleet, strategy, topics, peers, 2, ["a", "b"], straggler_after=2)
        assert took < QUICK_S, took  # the quorum, then 0.5 s more for the straggler
        assert sorted(collected.updates) == ["a", "b"] and collected.not_waited_for == ["silent"]
        assert fleet.devices["silent"].missed_rounds == 3
        # its late update of round 3 (rejected: wrong round) takes that miss back: slow, not silent
        send_as(peers["silent"], topics, "silent", Update("global", dict(strategy.weights), 10, {}), 2)
        fleet.pump(0.5)
        assert fleet.devices["silent"].missed_rounds == 2
        send_as(peers["silent"], topics, "silent", Update("global", dict(strategy.weights), 10, {}), 1)
        fleet.pump(0.5)  # an update of an older round takes nothing back
        assert fleet.devices["silent"].missed_rounds == 2
        record = fleet.devices["silent"]
        record.miss_bits, record.last_asked = record.miss_bits | 1, 3  # as if it missed a 4th round
        send_as(peers["silent"], topics, "silent", Update("global", dict(strategy.weights), 10, {}), 3)
        fleet.pump(0.5)  # a second late update within 4 rounds takes nothing back
        assert record.missed_rounds == 3
        fleet.devices["silent"].miss_bits = 0b0010  # 1 of its last 4: waited for in full again
        collected, took = _round(fleet, strategy, topics, peers, 4, ["a", "b"], straggler_after=2)
        assert took >= DEADLINE_S and collected.not_waited_for == []


def test_stragglers_are_waited_for_without_a_quorum_or_when_off(broker):
    with registered_fleet(broker.url, JOB + "-q", ["a", "b", "silent"]) as (fleet, strategy, topics, peers):
        fleet.straggler_grace_min_s = 0.5
        fleet.devices["silent"].miss_bits = 0b1111
        collected, took = _round(fleet, strategy, topics, peers, 0, ["a"])  # 1 update: below the quorum of 2
        assert took >= DEADLINE_S and collected.not_waited_for == []
        collected, took = _round(fleet, strategy, topics, peers, 1, ["a", "b"], straggler_after=0)  # off
        assert took >= DEADLINE_S and collected.not_waited_for == []
        collected, took = _round(fleet, strategy, topics, peers, 2, ["a", "b", "silent"])  # it answers
        assert took < QUICK_S and sorted(collected.updates) == ["a", "b", "silent"]  # at the others' pace
        assert fleet.devices["silent"].missed_rounds == 3  # of its last 4 rounds


def test_a_device_that_drops_out_half_the_time_costs_no_deadline_once_known(broker):
    """Missing every other round, it is a straggler once it missed twice (2 of its last 4): its
    rounds in between, when it answers with the others, cost nothing, and so do its misses from
    the third on (the quorum's time and a grace, not the deadline)."""
    with registered_fleet(broker.url, JOB + "-f", ["a", "b", "flaky"]) as (fleet, strategy, topics, peers):
        fleet.straggler_grace_min_s = 0.5
        took = [_round(fleet, strategy, topics, peers, rnd, ["a", "b"] + (["flaky"] if rnd % 2 else []),
                       straggler_after=2)[1] for rnd in range(5)]
        assert took[0] >= DEADLINE_S and took[2] >= DEADLINE_S, took  # its first two misses: not known yet
        assert max(took[1], took[3], took[4]) < QUICK_S, took  # answered, answered, its third miss
        assert fleet.devices["flaky"].missed_rounds == 2


def test_the_round_loop_reports_the_stragglers_it_did_not_wait_for(broker):
    """A whole FedAvg job (two real device clients, one registered peer that never answers): its
    first two rounds wait for the silent one until the deadline, the next ones do not, and their
    records say so (`not_waited_for`) beside the aggregation's own metrics."""
    from coordinator.core.federation import FederationConfig
    from coordinator.runtime.fleet import Fleet
    from coordinator.strategies.fedavg import FedAvg
    from edge_sdk.client import ClientConfig, DeviceClient
    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.networking.link import MessageLink
    from edge_sdk.methods import LocalData
    from edge_sdk.models.zoo import model_for_dataset
    from edge_sdk.profiling import load_profile
    from edge_sdk.protocol.messages import Register
    from edge_sdk.protocol.topics import Topics
    from edge_sdk.training import TrainConfig
    from edge_sdk.networking.transport import MqttTransport, TransportConfig
    from tests.support.fleet_job import run_job
    from tests.support.raw_devices import raw_device

    job, digits = JOB + "-loop", load_dataset("digits")
    strategy = FedAvg(FederationConfig(rounds=4, min_devices=3, round_deadline_s=DEADLINE_S, seed=0, publish=False,
                                       train=TrainConfig(epochs=1, max_steps=3)),
                      model_for_dataset("mlp", digits.input_shape, digits.num_classes))
    coordinator = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-coordinator"))
    coordinator.connect()
    fleet = Fleet(MessageLink(coordinator), Topics(job=job))
    fleet.straggler_grace_min_s = 0.5
    fleet.start()
    silent = raw_device(broker.url, Topics(job=job), "silent")
    try:
        time.sleep(0.2)
        send_as(silent, Topics(job=job), "silent", Register(profile=load_profile("raspberry-pi-4b").to_dict(),
                                                            num_samples=50), -1)
        clients = [DeviceClient(ClientConfig(device_id=f"d{i}", job=job, seed=i,
                                             transport=TransportConfig(url=broker.url, client_id=f"{job}-d{i}")),
                                LocalData(digits.x_train[i::2], digits.y_train[i::2], 10),
                                load_profile("raspberry-pi-4b")) for i in range(2)]
        report = run_job(strategy, fleet, clients, coordinator)
    finally:
        silent.close()
    waited = [r.metrics.get("not_waited_for") for r in report.rounds]
    assert waited == [None, None, 1.0, 1.0], waited
    assert all(r.aggregated and r.participants == ["d0", "d1"] for r in report.rounds)
    assert all(r.host_seconds < QUICK_S + 2 for r in report.rounds[2:]), [r.host_seconds for r in report.rounds]
    assert "train_loss" in report.rounds[3].metrics  # the aggregation's metrics are kept beside it


def test_a_bad_straggler_or_resend_setting_is_a_one_line_error():
    import pytest

    from coordinator.core.federation import federation_from_toml
    from edge_sdk.client import ClientConfig

    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"^\[federation\] straggler_after must be an integer >= 0"):
            federation_from_toml({"federation": {"straggler_after": bad}})
    assert federation_from_toml({"federation": {"straggler_after": 0}}).straggler_after == 0
    for bad in (-1.0, float("nan"), float("inf"), "15"):
        with pytest.raises(ValueError, match="update_resend_s"):
            ClientConfig(device_id="d", update_resend_s=bad)
    for bad in (-1, 101, 1.5):
        with pytest.raises(ValueError, match="update_resends"):
            ClientConfig(device_id="d", update_resends=bad)

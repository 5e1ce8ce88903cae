"""A job that keeps serving, over a real broker: rounds start when the devices' sources have grown
by `min_new_samples` (their `data_count`s, not a timer), the job waits in between, every round is
a model version, and a version is published when it is not worse than the one devices serve."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from coordinator.core.device_record import DeviceRecord
from coordinator.core.federation import FederationConfig, federation_from_toml, NO_ROUND_CAP
from coordinator.runtime.data_pacer import DataPacer
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.fleet_async_loop import FleetAsyncLoop
from coordinator.runtime.report import RunReport
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.task import Task
from coordinator.strategies.base import StrategyContext
from coordinator.strategies.fedavg import FedAvg
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.networking.link import MessageLink
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.topics import Topics
from edge_sdk.training import TrainConfig
from tests.coordinator.test_growing_data import NAMES, _client, _digits, _write

JOB = "continuous"


def _wait(what, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("asynchronous", [False, True], ids=["rounds", "asynchronous"])
def test_rounds_start_when_new_rows_arrive_and_not_before(tmp_path, broker, asynchronous) -> None:
    """Synchronous rounds, and asynchronous versions of 2 updates (`FleetAsyncLoop`): the same pacing;
    asynchronously a device is sent a plan only while it holds rows it has not trained on."""
    x, y = _digits()
    order = np.random.default_rng(1).permutation(len(x))
    parts = {"d0": order[:500], "d1": order[500:1000]}
    written = {"d0": 200, "d1": 200}
    for name in parts:
        _write(tmp_path / f"{name}.csv", x[parts[name][:200]], y[parts[name][:200]], start=0)

    def grow(rows: int) -> None:
        for name, part in parts.items():
            take = part[written[name]:written[name] + rows]
            _write(tmp_path / f"{name}.csv", x[take], y[take], start=written[name], append=True)
            written[name] += rows

    clients = [_client(tmp_path, broker.url, name, i, job=JOB, top="heartbeat_s = 1", data="reread_s = 0.3")
               for i, name in enumerate(parts)]
    federation = FederationConfig(rounds=3, min_devices=2, round_deadline_s=60, seed=0, min_new_samples=60,
                                  min_eval_samples=10, train=TrainConfig(epochs=1, lr=0.05, batch_size=16, threads=1),
                                  asynchronous=asynchronous, buffer_size=2)
    strategy = FedAvg.create(StrategyContext(federation, "mlp", (1, 8, 8), 10))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{JOB}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=JOB), task=Task((1, 8, 8), 10))
    fleet.start()
    report = RunReport("fedavg", {})
    loop = (FleetAsyncLoop if asynchronous else RoundLoop)(
        strategy, fleet, report, preprocessing=Preprocessing((4.88,), (6.02,), tuple(NAMES), (1, 8, 8)))
    waits: list[str] = []
    assert loop.serving is not None
    loop.serving.on_waiting = lambda pace: waits.append(pace.why)
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    runner = threading.Thread(target=loop.run, daemon=True)
    for thread in [*threads, runner]:
        thread.start()
    try:
        # round 1 at once: each device's registration counts as new (each at most 30 of the 60)
        assert _wait(lambda: len(report.rounds) == 1, 60), "round 1 did not run"
        time.sleep(3.0)  # nothing new: no round, however long it waits
        assert len(report.rounds) == 1 and waits and "0 of 60 new samples" in waits[-1], waits[-3:]
        grow(20)  # ~15 of each 20 rows on the training side (a quarter held out): ~30 < 60, no round
        assert _wait(lambda: waits and _counted(waits[-1]) >= 20, 20), waits[-3:]
        time.sleep(1.0)
        assert len(report.rounds) == 1 and 20 <= _counted(waits[-1]) < 60 and "from 2 devices" in waits[-1]
        grow(30)  # each now holds ~37 new, of which 30 count: 60, a round
        assert _wait(lambda: len(report.rounds) == 2, 60), waits[-3:]
        grow(40)
        runner.join(timeout=90)
        assert not runner.is_alive()
    finally:
        for c in clients:
            c.stop()
        for thread in threads:
            thread.join(timeout=20)
        transport.close()
    rounds = report.rounds
    assert [r.version for r in rounds] == [1, 2, 3]
    # each round trained on the rows that had arrived: the devices' counts grew with their files
    trained = [sum(1 for _ in r.participants) for r in rounds]
    assert trained == [2, 2, 2] and fleet.devices["d0"].num_samples == len(clients[0].data) > 150
    published = [r.published_version for r in rounds]
    assert published[0] == 1 and published == sorted(published), published  # never goes back
    assert all(r.evaluation.get("devices") == 2 for r in rounds)
    # from round 2 each device also counted the published version on the same held-out samples
    assert "against_published" not in rounds[0].evaluation
    for before, r in zip(rounds, rounds[1:]):
        (label, pair), = r.evaluation["against_published"].items()
        assert pair["devices"] == 2 and pair["published_version"] == before.published_version
        assert pair["samples"] == r.evaluation["samples"] and pair["accuracy"] == r.federated_accuracy[label]
    assert clients[0].rounds.data_watch.sent, "the device never said its counts"
    assert [len(c.rounds_trained) for c in clients] == [3, 3]  # once per version: never again on the same rows


def _counted(why: str) -> int:
    """The new samples counted in a pacer's "N of M new samples ..." line."""
    return int(why.split(" of ")[0])


def _record(name: str, new: int) -> DeviceRecord:
    return DeviceRecord(name, load_profile("raspberry-pi-4b"), 1000, new_samples=new)


def test_one_device_alone_cannot_start_rounds_and_the_interval_and_windows_hold() -> None:
    import datetime as dt

    clock = [100.0]
    config = FederationConfig(min_new_samples=100, new_samples_share=0.5, min_interval_s=60, windows=("22:00-06:00",))
    night = dt.datetime(2026, 11, 28, 23, 0)
    pacer = DataPacer(config, clock=lambda: clock[0], local_time=lambda: night)
    assert not pacer.decide([_record("chatty", 10_000)]).ready  # counts 50 at most
    assert pacer.decide([_record("a", 60), _record("b", 60)]).ready
    pacer.round_ended([])
    pace = pacer.decide([_record("a", 60), _record("b", 60)])
    assert not pace.ready and "min_interval_s: 60 s to go" in pace.why
    clock[0] += 61
    assert pacer.decide([_record("a", 60), _record("b", 60)]).ready
    noon = DataPacer(config, clock=lambda: clock[0], local_time=lambda: night.replace(hour=12))
    assert "outside the windows 22:00-06:00" in noon.decide([_record("a", 60), _record("b", 60)]).why
    trained = [_record("a", 60)]
    pacer.round_ended(trained)
    assert trained[0].new_samples == 0


def test_a_paced_job_without_rounds_in_its_toml_has_no_cap() -> None:
    assert federation_from_toml({"federation": {"min_new_samples": 50}}).rounds == NO_ROUND_CAP
    assert federation_from_toml({"federation": {"min_new_samples": 50, "rounds": 7}}).rounds == 7
    assert federation_from_toml({"federation": {}}).rounds == 5  # a fixed job as before

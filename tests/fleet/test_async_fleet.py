"""Buffered asynchronous aggregation on a real fleet (issue 61): `edgefl coordinator` with
``[federation] asynchronous = true`` keeps every device training on a plan of its own over a real
broker, folds each update as it arrives and steps the model every ``buffer_size`` updates; a plan
that is not answered in time is closed and its late update refused, counted, never folded; the
device is then sent the current version; a resumed job continues the same versions."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from pathlib import Path

import pytest

import coordinator.runtime.fleet as fleet_module
import coordinator.runtime.fleet_async_loop as fleet_async_loop
from coordinator.runtime.coordinator_command import coordinator_config_from_toml, run_coordinator
from coordinator.runtime.fleet_async_loop import FleetAsyncLoop
from edge_sdk.data.datasets import load_dataset
from edge_sdk.data.partition import partition
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.chunking import DEFAULT_CHUNK_SIZE
from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import (
    Ack, Envelope, Model, Plan, Register, Status, Update, decode_envelope, encode_envelope,
)
from edge_sdk.protocol.topics import Topics
from tests.fleet.test_faults import WAIT, Device, coordinator_toml
from tests.support.raw_devices import raw_device, send_as

pytestmark = pytest.mark.slow  # small federations on a real broker: ~10 s


def _toml(tmp, url: str, job: str, rounds: int, deadline_s: float = WAIT) -> Path:
    """An asynchronous job of 3 devices, a version every 2 updates, updates in one message each."""
    return coordinator_toml(tmp, url, job, rounds, min_devices=3, deadline_s=deadline_s,
                            chunk_size=DEFAULT_CHUNK_SIZE, federation="asynchronous = true\nbuffer_size = 2")


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist-sample", seed=0)


@pytest.fixture(scope="module")
def shards(mnist):
    return partition(mnist.y_train, 3, "iid", seed=0)


@pytest.fixture
def cleanup():
    with contextlib.ExitStack() as stack:
        yield stack


def _devices(url: str, job: str, mnist, shards, cleanup, names=("d0", "d1", "d2")) -> list[Device]:
    """Real devices (a fifth of each one's data held out for federated evaluation), in threads."""
    devices = [Device(url, job, name, mnist, shards[i], chunk_size=DEFAULT_CHUNK_SIZE, holdout=0.2)
               for i, name in enumerate(names)]
    for device in devices:
        cleanup.callback(device.close)
    return devices


def _record_asks(monkeypatch) -> list[tuple[str, int]]:
    """(device, the version it was sent) for every plan `FleetAsyncLoop` sends from now on."""
    asked: list[tuple[str, int]] = []
    original = FleetAsyncLoop._ask

    def recording_ask(loop, device):
        asked.append((device, loop.version))
        return original(loop, device)
    monkeypatch.setattr(FleetAsyncLoop, "_ask", recording_ask)
    return asked


def _two_devices_and_a_raw_one(broker, mnist, shards, cleanup, monkeypatch, name: str):
    """A new job's two real devices (d0, d1) and a connection of ``name``'s played by the test:
    (job, its topics, that connection, the plans `FleetAsyncLoop` sends as `_record_asks` lists them)."""
    job = f"async-{name}-{uuid.uuid4().hex[:6]}"
    topics = Topics(job=job)
    peer = raw_device(broker.url, topics, name)
    cleanup.callback(peer.close)
    _devices(broker.url, job, mnist, shards, cleanup, names=("d0", "d1"))
    return job, topics, peer, _record_asks(monkeypatch)


def _coordinator(config) -> tuple[threading.Thread, dict]:
    """`run_coordinator` in a thread; its report lands in the dict under "report"."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(report=run_coordinator(config)), daemon=True)
    thread.start()
    return thread, result


def _ack_models_until_done(peer, topics: Topics, device: str, coordinator: threading.Thread) -> None:
    """Until the job ends, acknowledge its published model as a device does (the job waits for that)."""
    while coordinator.is_alive():
        message = peer.receive(0.2)
        if message is not None and isinstance((env := decode_envelope(message.payload)).body, Model):
            peer.publish(topics.uplink(device), encode_envelope(Envelope.of(Ack("installed"), device,
                                                                              reply_to=env.msg_id)))


def _kept_at_a_stop_of_another_version(directory: Path) -> Path:
    """What a stop at version 99 would have kept (a plan of d0's under tag 7): no job resuming from
    another version takes it up."""
    import numpy as np

    from coordinator.runtime.in_flight import InFlightState, OpenPlanState, save_in_flight
    tensors = {"w": np.zeros(3, np.float32)}
    plan = Plan("fedavg", "0.25", {}, tensors, {})
    return save_in_flight(directory, InFlightState(99, 98, {(99, "0.25"): tensors},
                                                   [OpenPlanState("d0", 7, (99, "0.25"), plan, 1.0, 0)], []))


def test_an_asynchronous_coordinator_folds_as_updates_arrive_and_resumes_its_versions(
        broker, mnist, shards, tmp_path, cleanup):
    job = f"async{uuid.uuid4().hex[:6]}"
    devices = _devices(broker.url, job, mnist, shards, cleanup)
    progress = []
    run_coordinator(coordinator_config_from_toml(_toml(tmp_path, broker.url, job, rounds=3)),
                    on_progress=progress.append)
    # a live display is told each version's buffer as it fills (of buffer_size = 2)
    buffers = [p for p in progress if p.round >= 0 and p.collecting == "update"]
    assert {p.round for p in progress if p.collecting == "evaluation"} == {0, 1, 2}  # versions, not plan tags
    assert {p.round for p in buffers} == {0, 1, 2} and all(p.total == 2 and p.done <= 2 for p in buffers), progress
    first = json.loads((tmp_path / "report" / "report.json").read_text())
    rounds = first["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3] and [r["version"] for r in rounds] == [1, 2, 3]
    assert all(len(r["participants"]) == 2 for r in rounds)  # a version every 2 updates
    # three devices trained version 0 at once: the third update arrived after version 1 stepped
    assert rounds[1]["metrics"]["staleness_max"] >= 1
    assert max(r["metrics"]["in_flight"] for r in rounds) >= 1  # plans were out while the model stepped
    assert all(r["accuracy"] for r in rounds)
    # every version evaluated by the devices too, on their held-out data, while they held plans
    assert all(r["evaluation"]["devices"] == 3 and r["evaluation"]["samples"] > 0 for r in rounds), rounds
    assert all(abs(r["federated_accuracy"]["0.25"] - r["accuracy"]["0.25"]) < 0.15 for r in rounds), rounds
    tags = [set(d.client.rounds_trained) for d in devices]
    assert all(tags) and not set.intersection(*tags)  # each plan under a tag of its own
    for device in devices:
        assert device.join() == "training finished"

    devices = _devices(broker.url, job, mnist, shards, cleanup)  # the job goes on to version 5
    stray = _kept_at_a_stop_of_another_version(tmp_path / "checkpoint")
    run_coordinator(coordinator_config_from_toml(_toml(tmp_path, broker.url, job, rounds=5)))
    assert not stray.exists() and not any(7 in d.client.rounds_trained for d in devices)  # not this version's
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [r["version"] for r in report["rounds"]] == [1, 2, 3, 4, 5]
    assert report["rounds"][:3] == rounds  # resumed, not redone
    assert report["rounds"][3]["metrics"]["dispatches"] > fleet_async_loop.RESUME_TAG_GAP
    assert all(min(d.client.rounds_trained) >= fleet_async_loop.RESUME_TAG_GAP for d in devices)


def test_a_plan_unanswered_in_time_is_closed_its_late_update_refused_and_its_device_sent_the_current_version(
        broker, mnist, shards, tmp_path, cleanup, monkeypatch):
    """Two real devices and a silent one: the silent device's plan closes at its deadline, its
    update sent afterwards is refused (``wrong_round``, counted) and never folded, and it is
    asked again — with the version current then."""
    monkeypatch.setattr(fleet_async_loop, "RETRY_AFTER_S", 0.1)
    job, topics, silent, asked = _two_devices_and_a_raw_one(broker, mnist, shards, cleanup, monkeypatch, "silent")
    config = coordinator_config_from_toml(_toml(tmp_path, broker.url, job, rounds=80, deadline_s=1.0))
    coordinator, result = _coordinator(config)
    register = Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50)
    plans, registered = [], False
    while len(plans) < 2:  # its first plan, and the one it is sent after the first closed
        if not registered:  # until the coordinator, subscribing meanwhile, has it
            send_as(silent, topics, "silent", register, -1)
        message = silent.receive(1.0 if not registered else WAIT)
        if message is None and not registered:
            continue
        assert message is not None, "the silent device was not asked twice"
        env = decode_envelope(message.payload)
        registered = registered or isinstance(env.body, Ack)
        if isinstance(env.body, Plan):
            plans.append(env)
            if len(plans) == 1:
                first_plan = env
    # its update of the closed first plan, sent late: refused, counted
    send_as(silent, topics, "silent", Update(first_plan.body.label, dict(first_plan.body.tensors), 50, {}),
            first_plan.round)
    _ack_models_until_done(silent, topics, "silent", coordinator)
    assert "report" in result, "the job failed"
    report = result["report"]
    assert sum(r.metrics["plans_expired"] for r in report.rounds) >= 1
    assert all("silent" not in r.participants for r in report.rounds)
    versions = [v for d, v in asked if d == "silent"]
    assert len(versions) >= 2 and versions[1] > versions[0]  # the current version, not its old one
    assert plans[1].round > plans[0].round
    # refused, naming its closed plan's round (what is open then: its second plan, a later one, or none)
    late = f"update for round {first_plan.round + 1}; collecting: "
    assert any(r["device"] == "silent" and r["code"] == ErrorCode.WRONG_ROUND and r["message"].startswith(late)
               for r in report.rejections), report.rejections


def test_a_device_that_leaves_mid_plan_is_sent_the_current_version_when_it_comes_back(
        broker, mnist, shards, tmp_path, cleanup, monkeypatch):
    """A phone holding a plan goes offline (its last will): past the rejoin grace its plan is closed
    and counted, and the job goes on with the others; when it comes back online it is sent the
    version current then, not the one it left with."""
    monkeypatch.setattr(fleet_module, "REJOIN_GRACE_S", 0.5)
    job, topics, phone, asked = _two_devices_and_a_raw_one(broker, mnist, shards, cleanup, monkeypatch, "phone")
    closed: list[str] = []
    close_plan = fleet_module.Fleet.close_plan

    def recording_close(fleet, device):
        closed.append(device)
        return close_plan(fleet, device)
    monkeypatch.setattr(fleet_module.Fleet, "close_plan", recording_close)
    config = coordinator_config_from_toml(_toml(tmp_path, broker.url, job, rounds=80))
    coordinator, result = _coordinator(config)

    def status(state: str, stamp: int) -> None:
        phone.publish(topics.status("phone"), encode_envelope(Envelope.of(Status(state, "", {}, stamp), "phone")))
    register = Register(profile=load_profile("android-midrange").to_dict(), num_samples=50)
    plans = 0
    message = None
    while plans < 2:
        # registered again only after a second of silence (the coordinator was still subscribing): one
        # sent at every message it got (an ack, a round start) could be handled after its last will — on
        # another topic, behind the uplink's rate limit — and bring it back online before its plan closed
        if plans == 0 and message is None:
            send_as(phone, topics, "phone", register, -1)
        message = phone.receive(1.0 if plans == 0 else WAIT)
        assert message is not None or plans == 0, "the phone was not asked again after it came back"
        if message is None or not isinstance(decode_envelope(message.payload).body, Plan):
            continue
        plans += 1
        if plans == 1:  # it leaves with its plan, and comes back once the job has moved on
            status("offline", 1)
            left_at = len(asked)
            while "phone" not in closed or len([d for d, _ in asked[left_at:] if d != "phone"]) < 10:
                assert coordinator.is_alive(), "the job ended before the phone's plan was closed"
                time.sleep(0.1)
            status("online", 2)
    _ack_models_until_done(phone, topics, "phone", coordinator)
    assert "report" in result, "the job failed"
    report = result["report"]
    versions = [v for d, v in asked if d == "phone"]
    assert len(versions) >= 2 and versions[1] > versions[0], asked  # the current version, not its old one
    assert sum(r.metrics["plans_expired"] for r in report.rounds) >= 1
    assert all("phone" not in r.participants for r in report.rounds)


@pytest.mark.parametrize("when", ["filling or evaluating", "evaluating"])
def test_a_stop_mid_version_loses_no_plan_and_no_update_the_resumed_job_takes_them_up(
        broker, mnist, shards, tmp_path, cleanup, monkeypatch, when):
    """``systemctl stop`` (SIGTERM) as a plan goes out while a version fills or is evaluated (the
    fleet training on, the model already stepped): the updates already taken
    and the plans out are kept beside the checkpoint; resumed, the updates fill that version first
    and each plan is sent again under its tag, its device answering with the update it kept —
    trained once, folded once."""
    from dataclasses import replace

    from coordinator.core.received_update import ReceivedUpdate
    from coordinator.runtime.in_flight import IN_FLIGHT_FILE, TakenUpdate, load_in_flight, save_in_flight
    from edge_sdk.stop_request import StopRequested

    job = f"async-stop{uuid.uuid4().hex[:6]}"
    devices = _devices(broker.url, job, mnist, shards, cleanup)
    config = coordinator_config_from_toml(_toml(tmp_path, broker.url, job, rounds=3))
    ask = FleetAsyncLoop._ask

    def stop_after_a_plan_beside_a_taken_update(loop, device):
        sent = ask(loop, device)
        if loop._filling and loop._filling[0] and (loop._stepped or when != "evaluating"):
            raise StopRequested()  # what SIGTERM raises in the main thread
        return sent
    monkeypatch.setattr(FleetAsyncLoop, "_ask", stop_after_a_plan_beside_a_taken_update)
    with pytest.raises(StopRequested):
        run_coordinator(config)
    monkeypatch.setattr(FleetAsyncLoop, "_ask", ask)
    kept = load_in_flight(tmp_path / "checkpoint")
    assert kept is not None and kept.version == kept.round
    taken_by = {t.received.device_id for t in kept.taken if t.stale is not None}  # in that version's buffer
    assert taken_by and all(t.stale in (0, 1) for t in kept.taken if t.stale is not None), kept.taken
    assert kept.plans and all(p.base[0] <= kept.version + 1 and p.plan.tensors for p in kept.plans)
    # and an update waiting for a buffer from a device that never comes back: it waits, the job goes on
    base = next(iter(kept.bases))
    ghost = TakenUpdate(ReceivedUpdate("ghost", 0, kept.taken[0].received.update, 1), base, None)
    save_in_flight(tmp_path / "checkpoint", replace(kept, taken=[*kept.taken, ghost]))

    run_coordinator(config)  # resumed with the devices never restarted
    assert not (tmp_path / "checkpoint" / IN_FLIGHT_FILE).exists()
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["status"] == "finished" and [r["version"] for r in report["rounds"]] == [1, 2, 3]
    assert taken_by <= set(report["rounds"][kept.round]["participants"])  # it stepped with the updates taken
    assert all("ghost" not in r["participants"] for r in report["rounds"])
    by_name = {d.client.config.device_id: d.client for d in devices}
    for plan in kept.plans:  # each trained once: before the stop, or (the plan just sent) after it
        trained = by_name[plan.device].rounds_trained
        assert trained.count(plan.tag) == 1, (plan.device, plan.tag, trained)
    # a plan trained before the stop was answered with the update its device kept, not trained again
    assert any(plan.tag in by_name[plan.device].resent_updates for plan in kept.plans), kept.plans
    # new plans' tags start past every tag the stopped session sent (a second stop reuses none)
    new_tags = {t for c in by_name.values() for t in c.rounds_trained if t >= fleet_async_loop.RESUME_TAG_GAP}
    assert new_tags and min(new_tags) >= kept.dispatches + fleet_async_loop.RESUME_TAG_GAP > kept.dispatches > 0
    assert not [e for d in devices for e in d.client.errors if e.code == ErrorCode.WRONG_ROUND]
    assert not sum(r["metrics"]["stale_refused"] for r in report["rounds"])  # those of the version evaluated too
    for device in devices:
        assert device.join() == "training finished"


def test_a_buffer_the_aggregation_fails_on_is_not_kept_for_the_restart(broker, mnist, shards, tmp_path, cleanup,
                                                                        monkeypatch):
    """An error inside a version's aggregation stops the job; what is kept for the restart leaves out
    that version's updates (the restarted job would fail on them again, at every restart), not the
    plans out: resumed, the job finishes its versions."""
    from coordinator.runtime.async_loop import AsyncLoop
    from coordinator.runtime.in_flight import IN_FLIGHT_FILE, load_in_flight

    job = f"async-fail{uuid.uuid4().hex[:6]}"
    devices = _devices(broker.url, job, mnist, shards, cleanup)
    config = coordinator_config_from_toml(_toml(tmp_path, broker.url, job, rounds=3))
    aggregate = AsyncLoop._aggregate

    def failing_on_version_2(loop, rnd, updates):
        if rnd == 1:
            raise RuntimeError("a buffer this strategy cannot take")
        return aggregate(loop, rnd, updates)
    monkeypatch.setattr(AsyncLoop, "_aggregate", failing_on_version_2)
    with pytest.raises(RuntimeError, match="cannot take"):
        run_coordinator(config)
    monkeypatch.setattr(AsyncLoop, "_aggregate", aggregate)
    kept = load_in_flight(tmp_path / "checkpoint")
    if kept is not None:  # the plans out at the error, when there were any; never the failing buffer
        assert kept.version == 1 and all(t.stale is None for t in kept.taken), kept.taken

    run_coordinator(config)
    assert not (tmp_path / "checkpoint" / IN_FLIGHT_FILE).exists()
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["status"] == "finished" and [r["version"] for r in report["rounds"]] == [1, 2, 3]
    for device in devices:
        assert device.join() == "training finished"


def test_the_fleet_keeps_training_while_a_version_is_evaluated(broker, mnist, shards, tmp_path, cleanup,
                                                                monkeypatch):
    """A device that never answers makes every federated evaluation wait out ``eval_deadline_s``
    (2 s); meanwhile the two real devices' updates arrive and wait for the next version, and their
    devices are sent new plans at once (while less than a buffer waits) — the next version counts
    them; none while the last version is evaluated."""
    from edge_sdk.protocol.capabilities import EVALUATE

    job, topics, mute, _ = _two_devices_and_a_raw_one(broker, mnist, shards, cleanup, monkeypatch, "mute")
    asks: list[tuple[str, float]] = []
    evaluations: list[tuple[float, float]] = []
    ask, evaluate = FleetAsyncLoop._ask, FleetAsyncLoop._federated_evaluation

    def timed_ask(loop, device):
        asks.append((device, time.monotonic()))
        return ask(loop, device)

    def timed_evaluation(loop, rnd, record):
        started = time.monotonic()
        try:
            return evaluate(loop, rnd, record)
        finally:
            evaluations.append((started, time.monotonic()))
    monkeypatch.setattr(FleetAsyncLoop, "_ask", timed_ask)
    monkeypatch.setattr(FleetAsyncLoop, "_federated_evaluation", timed_evaluation)
    toml = _toml(tmp_path, broker.url, job, rounds=3, deadline_s=60.0)
    toml.write_text(toml.read_text().replace("buffer_size = 2", "buffer_size = 2\neval_deadline_s = 2.0"))
    coordinator, result = _coordinator(coordinator_config_from_toml(toml))
    register = Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50,
                        capabilities=("fedavg", EVALUATE))
    while not any(isinstance(decode_envelope(m.payload).body, Ack)
                  for m in [mute.receive(1.0)] if m is not None):  # until the coordinator has it
        send_as(mute, topics, "mute", register, -1)
    _ack_models_until_done(mute, topics, "mute", coordinator)  # it answers no plan and no evaluation
    assert "report" in result, "the job failed"
    report = result["report"]
    assert len(evaluations) == 3 and all(end - start >= 1.9 for start, end in evaluations)  # waited for mute
    during = [[d for d, at in asks if start < at < end] for start, end in evaluations]
    assert all(set(sent) <= {"d0", "d1"} and sent for sent in during[:2]), (asks, evaluations)  # plans meanwhile
    assert not during[2]  # none while the last version is evaluated: no version would take their updates
    for evaluated, after in zip(during[:2], report.rounds[1:], strict=True):  # the next version counts them
        assert after.metrics["dispatched"] >= len(evaluated)
    assert all(r.evaluation["devices"] == 2 and r.evaluation["asked"] == 3 for r in report.rounds)

"""A device answers a re-sent plan it already trained with the same update instead of training again.

The coordinator re-sends a participant its plan when the device says "online" again (it
reconnected, and its update may have been lost with the connection); retraining would only
waste the device's time, since the coordinator counts one update per round.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from edge_sdk.client import ClientConfig, DeviceClient, plan_digest
from edge_sdk.data.datasets import load_dataset
from edge_sdk.networking.link import MessageLink, Received
from edge_sdk.methods import LocalData
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Plan, Register, RoundStart, Update
from edge_sdk.protocol.topics import Topics
from edge_sdk.tensors import state_to_numpy
from edge_sdk.training import TrainConfig
from edge_sdk.networking.transport import MqttTransport, TransportConfig


def _next(link: MessageLink, kind: type, timeout: float = 20.0) -> Envelope:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = link.poll(0.5)
        if isinstance(got, Received) and isinstance(got.envelope.body, kind):
            return got.envelope
    raise AssertionError(f"no {kind.__name__} arrived")


def _next_update(link: MessageLink) -> Envelope:
    return _next(link, Update)


@contextmanager
def _device_and_coordinator(broker, job: str, device: str, **config) -> Iterator[tuple]:
    """A real device client (``config``: more `ClientConfig` settings) running on 100 digits, and a
    bare coordinator connection reading its uplink; yields the topics, the model spec, its initial
    weights, the coordinator's link and the client, once the device has registered."""
    topics = Topics(job=job)
    data = load_dataset("digits")
    spec = model_for_dataset("mlp", data.input_shape, data.num_classes)
    torch.manual_seed(0)
    weights = state_to_numpy(build_model(spec), copy=True)
    coordinator = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-coordinator"))
    coordinator.subscribe(topics.uplink(device))
    coordinator.connect()
    link = MessageLink(coordinator)
    client = DeviceClient(ClientConfig(device_id=device, job=job, register_retry_s=30.0,
                                       transport=TransportConfig(url=broker.url, client_id=f"{job}-d"), **config),
                          LocalData(data.x_train[:100], data.y_train[:100], data.num_classes),
                          load_profile("raspberry-pi-4b"))
    thread = threading.Thread(target=client.run, kwargs={"timeout_s": 60}, daemon=True)
    thread.start()
    try:
        _next(link, Register)  # the device is listening now
        yield topics, spec, weights, link, client
    finally:
        client.stop()
        thread.join(timeout=10)
        coordinator.close()


def test_a_re_sent_plan_gets_the_same_update_and_a_changed_plan_is_trained(broker, tmp_path) -> None:
    device = "dev-r"
    train = TrainConfig(epochs=1, max_steps=5).to_dict()
    with _device_and_coordinator(broker, "resend", device) as (topics, spec, weights, link, client):
        plan = Plan("fedavg", "global", spec, weights, train)
        link.send(topics.downlink(device), Envelope.of(plan, "coordinator", round=0))
        first = _next_update(link)
        link.send(topics.downlink(device), Envelope.of(plan, "coordinator", round=0))  # after a reconnect
        again = _next_update(link)
        assert client.rounds_trained == [0] and client.resent_updates == [0]
        assert again.round == 0 and again.msg_id != first.msg_id
        assert all(np.array_equal(first.body.tensors[k], again.body.tensors[k]) for k in weights)

        changed = Plan("fedavg", "global", spec, {k: v + 0.01 for k, v in weights.items()}, train)
        assert plan_digest(changed) != plan_digest(plan)
        link.send(topics.downlink(device), Envelope.of(changed, "coordinator", round=0))
        _next_update(link)
        link.send(topics.downlink(device), Envelope.of(plan, "coordinator", round=1))
        _next_update(link)
        assert client.rounds_trained == [0, 0, 1] and client.resent_updates == [0]


def test_an_update_the_coordinator_never_answered_is_sent_again_until_answered(broker) -> None:
    """Its first copy lost on the way (no `ack`, no `error`): the device sends the same update again
    after `update_resend_s`, then twice as long later; an answer to any copy (an ack, or an error
    such as `duplicate`) ends it, and so does a later round's announcement. Issue 56."""
    device = "dev-u"
    train = TrainConfig(epochs=1, max_steps=3).to_dict()
    with _device_and_coordinator(broker, "unanswered", device, update_resend_s=0.5) as (
            topics, spec, weights, link, client):
        plan = Plan("fedavg", "global", spec, weights, train)
        link.send(topics.downlink(device), Envelope.of(plan, "coordinator", round=0))
        first = _next_update(link)  # "lost": not answered
        started = time.monotonic()
        second = _next_update(link)
        after_first = time.monotonic() - started
        third = _next_update(link)
        after_second = time.monotonic() - started - after_first
        # due 0.5 s after the first copy, then 1 s after the second (upper bounds: a loaded machine)
        assert 0.4 < after_first < 5.0 and 0.9 < after_second < 6.0, (after_first, after_second)
        assert len({first.msg_id, second.msg_id, third.msg_id}) == 3 and first.round == second.round == 0
        assert all(np.array_equal(first.body.tensors[k], third.body.tensors[k]) for k in weights)
        assert client.rounds_trained == [0] and client.unanswered_resends == [0, 0]
        link.send(topics.downlink(device), Envelope.of(Ack("update for round 1 accepted"), "coordinator",
                                                      round=0, reply_to=second.msg_id))
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # no fourth copy (it would be due 2 s after the third)
            got = link.poll(0.2)
            assert not (isinstance(got, Received) and isinstance(got.envelope.body, Update)), "sent again after its ack"
        assert client.unanswered_resends == [0, 0]

        link.send(topics.downlink(device), Envelope.of(plan, "coordinator", round=1))
        _next_update(link)
        link.send(topics.downlink(device), Envelope.of(RoundStart(60.0, (device,)), "coordinator", round=2))
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # round 2 began: round 1's update is not sent again
            got = link.poll(0.2)
            assert not (isinstance(got, Received) and isinstance(got.envelope.body, Update)), "sent after round 2 began"
        assert client.unanswered_resends == [0, 0]


def test_a_plan_is_the_same_whether_it_carries_its_fixed_tensors_or_leaves_them_out() -> None:
    from edge_sdk.protocol.fixed_tensors import tensor_digest
    biases = np.linspace(-1, 1, 12, dtype=np.float32)
    head = np.ones((2, 12), np.float32)
    fixed = {"biases": tensor_digest(biases)}
    whole = Plan("fedavg", "global", {}, {"head": head, "biases": biases}, {}, None, fixed)
    left_out = Plan("fedavg", "global", {}, {"head": head}, {}, None, fixed)
    assert plan_digest(whole) == plan_digest(left_out)  # sent again whole after a coordinator's restart
    other = Plan("fedavg", "global", {}, {"head": head}, {}, None, {"biases": tensor_digest(biases + 1)})
    assert plan_digest(other) != plan_digest(left_out)
    assert plan_digest(Plan("fedavg", "global", {}, {"head": head, "biases": biases}, {})) == plan_digest(whole)

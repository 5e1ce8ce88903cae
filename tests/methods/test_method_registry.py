"""Every registered method has a device part, runs a round end to end, and a device without
its part is turned away at registration with a clear error."""

from __future__ import annotations

import importlib.util
import time

import pytest

from coordinator.runtime.fleet import Fleet
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.strategies import STRATEGIES
from edge_sdk.networking.link import MessageLink
from edge_sdk.methods import DEVICE_METHODS
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Ack, Envelope, Error, Register, decode_envelope, encode_envelope
from edge_sdk.protocol.topics import Topics
from edge_sdk.training import TrainConfig
from edge_sdk.networking.transport import MqttTransport, TransportConfig

#: The smallest job of each method that still exercises its own path (digits, mlp, one round).
OPTIONS = {"fdnnc": {"pattern": "both"}, "reft": {"f_lambda": "50"}, "static-prune": {"f_lambda": "50"}}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_method_has_a_device_part(name) -> None:
    assert STRATEGIES[name].device_part() in DEVICE_METHODS


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_method_runs_a_round_end_to_end(name, tmp_path, broker) -> None:
    config = SimulationConfig(method=name, clients=3, dataset="digits", model="mlp", out=str(tmp_path),
                              broker_url=broker.url, job=f"registry-{name}", plots=False,
                              options=OPTIONS.get(name, {}),
                              federation=sim_federation(rounds=1, train=TrainConfig(epochs=1, batch_size=32, lr=0.05)))
    report = run_simulation(config)
    assert report.rounds[0].aggregated and report.rounds[0].participants
    assert not report.to_dict()["rejections"]
    assert report.rounds[0].accuracy and all(0 <= a <= 1 for a in report.rounds[0].accuracy.values())


@pytest.mark.skipif(importlib.util.find_spec("sktime") is None, reason="the sensors extra (sktime) is not installed")
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_method_runs_a_round_on_a_1d_model(name, tmp_path, broker) -> None:
    """BasicMotions (6-channel series of 100) on cnn1d: conv1d, series_norm, batch norm, 1-D pools."""
    config = SimulationConfig(method=name, clients=3, dataset="basicmotions", model="cnn1d", out=str(tmp_path),
                              broker_url=broker.url, job=f"registry-1d-{name}", plots=False,
                              options=OPTIONS.get(name, {}),
                              federation=sim_federation(rounds=1, train=TrainConfig(epochs=1, batch_size=8, lr=0.05)))
    report = run_simulation(config)
    assert report.rounds[0].aggregated and report.rounds[0].participants
    assert not report.to_dict()["rejections"]
    assert report.rounds[0].accuracy and all(0 <= a <= 1 for a in report.rounds[0].accuracy.values())


def test_a_device_without_the_jobs_method_is_turned_away_at_registration(broker) -> None:
    topics = Topics(job="registry-capabilities")
    coordinator = MqttTransport(TransportConfig(url=broker.url, client_id="registry-coordinator"))
    coordinator.connect()
    fleet = Fleet(MessageLink(coordinator), topics, method="flanc")
    fleet.start()
    peers = {}
    try:
        for device, capabilities in (("old-sdk", ("fedavg", "heterofl")), ("new-sdk", ("fedavg", "flanc")),
                                     ("silent-sdk", ())):
            peer = MqttTransport(TransportConfig(url=broker.url, client_id=f"registry-{device}"))
            peer.connect()
            peer.subscribe(topics.downlink(device))
            peers[device] = peer
        time.sleep(0.2)
        for device, capabilities in (("old-sdk", ("fedavg", "heterofl")), ("new-sdk", ("fedavg", "flanc")),
                                     ("silent-sdk", ())):
            register = Register(profile=load_profile("raspberry-pi-4b").to_dict(), num_samples=50,
                                capabilities=capabilities)
            peers[device].publish(topics.uplink(device), encode_envelope(Envelope.of(register, device, round=-1)))
        assert sorted(fleet.wait_for_devices(2, 5.0)) == ["new-sdk", "silent-sdk"]  # the fleet reads its inbox
        fleet.wait_for_devices(3, 1.0)  # and has surely read the rejected one by now
        replies = {}
        for device, peer in peers.items():
            incoming = peer.receive(5.0)
            assert incoming is not None, f"no reply to {device}"
            replies[device] = decode_envelope(incoming.payload).body
        assert isinstance(replies["old-sdk"], Error) and replies["old-sdk"].code == "unsupported_method"
        assert "runs method 'flanc', which this device's edgefl SDK does not support" in replies["old-sdk"].message
        assert isinstance(replies["new-sdk"], Ack) and isinstance(replies["silent-sdk"], Ack)
        assert sorted(fleet.devices) == ["new-sdk", "silent-sdk"]
        assert Fleet(MessageLink(coordinator), Topics(job="nobody"), method="flanc").why_not_registered() == (
            "no device was turned away (are they on this broker, in job 'nobody', allowed by its ACL?)")
    finally:
        for peer in peers.values():
            peer.close()
        coordinator.close()


@pytest.mark.slow
def test_a_device_client_turned_away_stops_with_the_reason(broker, monkeypatch) -> None:
    import threading

    import numpy as np

    import edge_sdk.client as client_module
    from edge_sdk.client import ClientConfig, DeviceClient
    from edge_sdk.methods import LocalData

    monkeypatch.setattr(client_module, "DEVICE_METHODS", {"fedavg": DEVICE_METHODS["fedavg"]})  # an older SDK
    topics = Topics(job="registry-client")
    coordinator = MqttTransport(TransportConfig(url=broker.url, client_id="registry-client-coordinator"))
    coordinator.connect()
    fleet = Fleet(MessageLink(coordinator), topics, method="flanc")
    fleet.start()
    data = LocalData(np.zeros((4, 8), np.float32), np.zeros(4, np.int64), 2)
    device = DeviceClient(ClientConfig(device_id="old", transport=TransportConfig(url=broker.url),
                                       job="registry-client"), data, load_profile("laptop"))
    ended: list[str] = []
    thread = threading.Thread(target=lambda: ended.append(device.run(timeout_s=20.0)), daemon=True)
    try:
        thread.start()
        fleet.wait_for_devices(1, 5.0)
        thread.join(timeout=20)
    finally:
        coordinator.close()
    assert ended and ended[0].startswith("the coordinator turned this device away: this job runs method 'flanc'")
    assert device.turned_away == ended[0]  # `edgefl client` exits 3 on it: a restart cannot help
    assert not fleet.devices
    assert fleet.why_not_registered().startswith("turned away: old (unsupported_method: this job runs method 'flanc'")


#: Options that make a fresh strategy's state complete without a fleet (a fixed γ, a fixed level).
STANDALONE = {"fedpara": {"gamma": "0.5"}, "pfedpara": {"gamma": "0.5"}, "lowrank": {"gamma": "0.5"},
              "static-prune": {"ratio": "0.5"}, "fdnnc": {}, "reft": {}}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_methods_checkpoint_state_round_trips_and_rejects_a_stranger(name) -> None:
    import numpy as np

    from coordinator.strategies import create_strategy
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies.base import StrategyContext

    def fresh(seed: int):
        public = np.random.default_rng(0).normal(size=(20, 1, 8, 8)).astype(np.float32)  # for REFT
        ctx = StrategyContext(FederationConfig(seed=seed), "mlp", (1, 8, 8), 10, options=STANDALONE.get(name, {}),
                              public_data=public)
        return create_strategy(name, ctx)

    saved = fresh(1).state_tensors()
    assert saved
    other = fresh(2)
    assert any(not np.array_equal(v, other.state_tensors()[k]) for k, v in saved.items())
    other.load_state_tensors(saved)
    assert set(other.state_tensors()) == set(saved)
    assert all(np.array_equal(other.state_tensors()[k], v) for k, v in saved.items())
    key = next(k for k, v in saved.items() if v.ndim == 2)
    with pytest.raises(ValueError):
        other.load_state_tensors({**saved, key: np.zeros((3, 3), np.float32)})

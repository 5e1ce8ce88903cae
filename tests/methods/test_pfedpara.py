"""pFedPara: W2 stays on the device (persisted, never on the wire), local accuracy on 2-class shards."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from coordinator.core.device_record import DeviceRecord
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.strategies.pfedpara import PFedPara
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from coordinator.aggregate.validation import UpdateRejected
from edge_sdk.data.datasets import load_dataset
from edge_sdk.networking.link import MessageLink, Received
from edge_sdk.methods import LocalData
from edge_sdk.methods.base import DeviceContext
from edge_sdk.models.fedpara import personal_names
from edge_sdk.methods.pfedpara import (PERSONAL_FILE, load_personal, personal_split, save_personal, spec_fingerprint,
                                       train_pfedpara)
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Plan, Update
from edge_sdk.training import TrainConfig
from edge_sdk.networking.transport import IncomingMessage, MqttTransport, TransportConfig

PERSONAL = (".x2", ".y2", ".t2")


@pytest.fixture(scope="module")
def two_digits() -> LocalData:
    data = load_dataset("digits")
    keep = np.flatnonzero(np.isin(data.y_train, [3, 8]))[:240]
    return LocalData(data.x_train[keep], data.y_train[keep], 10)


def _strategy(**options: str) -> PFedPara:
    return PFedPara.create(StrategyContext(
        federation=FederationConfig(train=TrainConfig(epochs=8, batch_size=32, threads=1)), model_family="cnn4",
        input_shape=(1, 8, 8), num_classes=10, options={"gamma": "0.3", **options}))


def _plan(strategy: PFedPara, device: DeviceRecord) -> Plan:
    device.label = strategy.assign(device)
    return strategy.configure_train(0, device)


def test_device_keeps_w2_in_its_state_dir_and_uploads_only_w1(tmp_path, two_digits) -> None:
    strategy = _strategy(holdout="0.25")
    device = DeviceRecord("d1", load_profile("raspberry-pi-4b"), len(two_digits))
    plan = _plan(strategy, device)
    assert plan.tensors and not any(k.endswith(PERSONAL) for k in plan.tensors)
    ctx = DeviceContext("d1", 0, seed=3, state_dir=tmp_path)
    update = train_pfedpara(plan, two_digits, ctx)
    assert set(update.tensors) == set(plan.tensors)  # W1, biases: nothing personal goes up
    # the held-out share by key: 68 of 240 here (0.25 in expectation); local_acc 0.9 measured 2026-11-25
    _, held = personal_split(two_digits, 0.25)
    assert update.metrics["local_n"] == held.sum() and update.num_samples == 240 - held.sum()
    assert 40 < held.sum() < 80 and update.metrics["local_acc"] > 0.87
    strategy.check_update(device, update)
    stored = load_personal(tmp_path / PERSONAL_FILE, spec_fingerprint(plan.model_spec), _personal_shapes(strategy))
    assert stored is not None and len(stored) == 14 and all(k.endswith(PERSONAL) for k in stored)
    assert any(np.abs(v).max() > 0 for k, v in stored.items() if k.endswith(".x2"))  # W2 was trained
    # The next round starts from the stored W2 (made recognisable here), not from a fresh one.
    marked = {k: np.full_like(v, 0.01) for k, v in stored.items()}
    save_personal(tmp_path / PERSONAL_FILE, spec_fingerprint(plan.model_spec), marked)
    slow = Plan(plan.method, plan.label, plan.model_spec, plan.tensors, {**plan.train, "lr": 1e-7})
    train_pfedpara(slow, two_digits, DeviceContext("d1", 1, seed=3, state_dir=tmp_path))
    after = load_personal(tmp_path / PERSONAL_FILE, spec_fingerprint(plan.model_spec), _personal_shapes(strategy))
    assert after is not None and all(np.allclose(after[k], 0.01, atol=1e-4) for k in after)
    # Another model (another γ) never picks up this W2.
    assert load_personal(tmp_path / PERSONAL_FILE, spec_fingerprint(_strategy(gamma="0.1").specs["global"]),
                         _personal_shapes(strategy)) is None


def _personal_shapes(strategy: PFedPara) -> dict[str, tuple[int, ...]]:
    model = strategy.models["global"]
    state = model.state_dict()
    return {k: tuple(state[k].shape) for k in personal_names(model)}


def test_w2_is_refused_both_ways(tmp_path, two_digits) -> None:
    strategy = _strategy()
    device = DeviceRecord("d2", load_profile("laptop"), len(two_digits))
    plan = _plan(strategy, device)
    leaked = dict(plan.tensors, **{"layers.0.x2": np.zeros((32, 2), np.float32)})
    with pytest.raises(UpdateRejected) as err:
        strategy.check_update(device, Update("global", leaked, 100, {"loss": 1.0}))
    assert err.value.code == "bad_tensors"
    bad_plan = Plan(plan.method, plan.label, plan.model_spec, leaked, plan.train)
    with pytest.raises(ValueError, match="extra"):
        train_pfedpara(bad_plan, two_digits, DeviceContext("d2", 0, state_dir=tmp_path))
    with pytest.raises(ValueError, match="holdout"):
        train_pfedpara(Plan(plan.method, plan.label, plan.model_spec, plan.tensors, {**plan.train, "holdout": 0.95}),
                       two_digits, DeviceContext("d2", 0, state_dir=tmp_path))


class _Replay:
    """Feeds recorded MQTT payloads to a real MessageLink, to decode and reassemble them."""

    max_packet_size = None

    def __init__(self, messages: list[IncomingMessage]) -> None:
        self.messages = list(messages)

    def receive(self, timeout: float | None = None) -> IncomingMessage | None:
        return self.messages.pop(0) if self.messages else None


@pytest.mark.slow
def test_w2_never_crosses_the_wire(tmp_path, broker) -> None:
    job = f"pfedpara-spy-{uuid.uuid4().hex[:6]}"
    spy = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-spy"))
    spy.connect()
    try:
        spy.subscribe(f"edgefl/{job}/#")
        probe = f"edgefl/{job}/probe"
        spy.publish(probe, b"probe")
        first = spy.receive(timeout=10)
        assert first is not None and first.topic == probe  # the subscription is live
        report = run_simulation(SimulationConfig(method="pfedpara", clients=4, partition="shards:2",
                                                 dataset="digits", out=str(tmp_path), broker_url=broker.url, job=job,
                                                 plots=False, throttle="off", options={"gamma": "0.3"},
                                                 federation=sim_federation(rounds=2, round_deadline_s=120,
                                                                           train=TrainConfig(epochs=5, threads=1))))
        time.sleep(0.5)
        recorded = []
        while (message := spy.receive(timeout=0.5)) is not None:
            recorded.append(message)
    finally:
        spy.close()
    link = MessageLink(_Replay(recorded))  # type: ignore[arg-type]
    bodies = []
    while (item := link.poll(0)) is not None:
        assert isinstance(item, Received), item
        bodies.append(item.envelope.body)
    plans = [b for b in bodies if isinstance(b, Plan)]
    updates = [b for b in bodies if isinstance(b, Update)]
    assert len(plans) == 8 and len(updates) == 8  # 4 devices x 2 rounds, all seen by the spy
    shared = set(plans[0].tensors)
    assert shared and all(set(m.tensors) == shared for m in plans + updates)
    assert not any(name.endswith(PERSONAL) for name in shared)
    raw = b"".join(m.payload for m in recorded)
    w1 = updates[-1].tensors["layers.3.x1"]
    assert w1.tobytes()[:64] in raw  # the search finds tensors that do travel ...
    for device in range(4):
        with np.load(tmp_path / "devices" / f"dev{device:03d}" / PERSONAL_FILE, allow_pickle=False) as stored:
            w2 = {k: stored[k] for k in stored.files if k.endswith(PERSONAL)}
        assert len(w2) == 14
        for name, value in w2.items():
            assert value.tobytes()[:64] not in raw, f"{name} of dev{device:03d} was on the wire"  # ... W2 never
    data = report.to_dict()
    assert data["rejections"] == []
    # 2 classes per device; 0.941 measured 2026-11-25
    assert data["rounds"][-1]["accuracy"]["local"] >= 0.91, data["rounds"]
    assert data["models"]["global"]["payload_bytes"] < 0.6 * 4 * data["models"]["global"]["params"]


def test_a_device_evaluates_its_personalised_model(two_digits) -> None:
    """Federated evaluation serves a pFedPara device its own W2 with the shared W1: after local
    training on 3s and 8s, its personalised model scores well above the shared half with a fresh W2."""
    from edge_sdk.evaluation import evaluate_holdout, served_model
    from edge_sdk.protocol.messages import Evaluate

    strategy = _strategy(holdout="0.0")
    device = DeviceRecord("d9", load_profile("raspberry-pi-4b"), len(two_digits))
    plan = _plan(strategy, device)
    memory: dict = {}
    ctx = DeviceContext("d9", 0, seed=5, memory=memory)
    fresh = evaluate_holdout(Evaluate.of(plan), two_digits, DeviceContext("d9", 0, seed=5, memory={}))
    train_pfedpara(plan, two_digits, ctx)
    assert memory, "W2 kept in the device's memory"
    # the shared half as the coordinator has it (not aggregated yet) with this device's own W2
    personal = evaluate_holdout(Evaluate.of(plan), two_digits, DeviceContext("d9", 1, seed=5, memory=memory))
    assert personal.num_samples == fresh.num_samples == len(two_digits)
    assert personal.correct / personal.num_samples > fresh.correct / fresh.num_samples + 0.2
    model = served_model(plan, DeviceContext("d9", 1, seed=5, memory=memory))
    w2 = {k: v for k, v in model.state_dict().items() if k.endswith(PERSONAL)}
    assert all(np.allclose(w2[k].numpy(), memory[next(iter(memory))][k]) for k in w2)


def test_a_device_with_nothing_held_out_says_why() -> None:
    from edge_sdk.evaluation import evaluate_holdout
    from edge_sdk.protocol.messages import Evaluate

    plan = Plan("fedavg", "global", {"layers": []}, {}, {})
    answer = evaluate_holdout(Evaluate.of(plan), None, DeviceContext("d0", 0), "too little data to hold out 0.2")
    assert answer.num_samples == 0 and answer.reason == "too little data to hold out 0.2"

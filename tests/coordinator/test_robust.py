"""Robust aggregation: clipping, median and trimmed mean against a poisoning device."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from coordinator.runtime.fleet import Fleet
from coordinator.aggregate.robust import robust_aggregate
from edge_sdk.methods.settings.options import parse
from edge_sdk.methods.settings.shared import RobustConfig
from coordinator.strategies.fedavg import FedAvg
from coordinator.core.federation import EvalData, FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.client import ClientConfig, DeviceClient
from edge_sdk.data.datasets import load_dataset
from edge_sdk.networking.link import MessageLink
from edge_sdk.methods import LocalData
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.data.partition import partition
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Update
from edge_sdk.protocol.topics import Topics
from edge_sdk.tensors import load_numpy_state, state_to_numpy
from edge_sdk.training import TrainConfig, train_local
from edge_sdk.networking.transport import MqttTransport, TransportConfig
from tests.support.fleet_job import run_job

DEVICES = 7
PLAIN = RobustConfig(clip=None, max_share=1.0)  # FedAvg's plain sample-weighted mean


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="module")
def honest_round(digits):
    """The global weights and 7 honest device models after one real local epoch each."""
    spec = model_for_dataset("mlp", digits.input_shape, digits.num_classes)
    torch.manual_seed(0)
    start = state_to_numpy(build_model(spec), copy=True)
    shards = partition(digits.y_train, DEVICES, "iid", seed=0)
    sets, counts = [], []
    for i, shard in enumerate(shards):
        model = build_model(spec)
        load_numpy_state(model, start)
        train_local(model, digits.x_train[shard], digits.y_train[shard], TrainConfig(epochs=1, lr=0.05), seed=i)
        sets.append(state_to_numpy(model, copy=True))
        counts.append(len(shard))
    return start, sets, counts


def _distance(a: dict, b: dict) -> float:
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


def _poison(start: dict, honest: dict, scale: float) -> dict:
    return {k: (start[k] + scale * (honest[k] - start[k])).astype(np.float32) for k in start}


@pytest.mark.parametrize("scale", [-10.0, 50.0])  # sign-flipped and boosted; scaled up
def test_one_poisoner_moves_the_mean_but_not_the_robust_rules(honest_round, scale):
    start, sets, counts = honest_round
    honest, _ = robust_aggregate(start, sets, counts, PLAIN)
    step = _distance(honest, start)  # how far an honest round moves the model
    poisoned = [*sets[:-1], _poison(start, sets[-1], scale)]
    results = {
        "mean": robust_aggregate(start, poisoned, counts, PLAIN)[0],
        "median": robust_aggregate(start, poisoned, counts, RobustConfig(rule="median"))[0],
        "trimmed": robust_aggregate(start, poisoned, counts, RobustConfig(rule="trimmed", trim=0.2))[0],
        "clip": robust_aggregate(start, poisoned, counts, RobustConfig(clip="auto"))[0],
        "default": robust_aggregate(start, poisoned, counts, RobustConfig())[0],  # mean, clip 3x
    }
    off = {rule: _distance(agg, honest) / step for rule, agg in results.items()}
    # one of 7 devices with |scale| >= 10 drags the mean by about |scale - 1| / 7 >= 1.5 honest steps
    assert off["mean"] > 1.0, off
    # the robust rules drop or bound that device: each stays within half an honest step; the default
    # screen (3x the median norm) lets it move the mean by at most about 3/7 + 1/7 of a step
    for rule in ("median", "trimmed", "clip"):
        assert off[rule] < 0.5, (rule, off)
    assert off["default"] < 0.7, off


def test_without_an_attacker_the_robust_rules_agree_with_the_mean(honest_round):
    start, sets, counts = honest_round
    honest, _ = robust_aggregate(start, sets, counts, PLAIN)
    step = _distance(honest, start)
    for config in (RobustConfig(rule="median"), RobustConfig(rule="trimmed"), RobustConfig(clip="auto")):
        agg, metrics = robust_aggregate(start, sets, counts, config)
        assert set(agg) == set(start) and all(agg[k].shape == start[k].shape for k in start)
        assert all(np.isfinite(agg[k]).all() for k in agg)
        assert _distance(agg, honest) < 0.5 * step, config
        assert metrics["update_norm_median"] > 0


def test_clip_with_a_fixed_bound_limits_every_update(honest_round):
    start, sets, counts = honest_round
    agg, metrics = robust_aggregate(start, sets, counts, RobustConfig(clip=1e-3))
    assert metrics["clipped"] == DEVICES and metrics["clip_bound"] == 1e-3
    assert _distance(agg, start) <= 1e-3 * 1.0001


def test_options_parse_and_bad_ones_are_refused():
    config = parse(RobustConfig, "fedavg", {"aggregate": "trimmed", "trim": "0.25", "clip": "auto"})
    assert (config.rule, config.trim, config.clip) == ("trimmed", 0.25, "auto")
    assert parse(RobustConfig, "fedavg", {"clip": "2.5"}).clip == 2.5
    assert parse(RobustConfig, "fedavg", {}).clip == "3x" == RobustConfig().clip
    assert parse(RobustConfig, "fedavg", {"clip": "none"}).clip is None
    assert parse(RobustConfig, "fedavg", {"clip": "1.5x", "max_share": "1"}).clip_factor == 1.5
    assert parse(RobustConfig, "fedavg", {"clip": "none", "max_share": "1"}).plain
    for bad in ({"aggregate": "mode"}, {"trim": "0.5"}, {"trim": "x"}, {"clip": "-1"}, {"clip": "nan"},
                {"clip": "0.5x"}, {"clip": "x"}, {"clip": "3xx"}, {"max_share": "0"}, {"max_share": "1.5"}):
        with pytest.raises(ValueError):
            parse(RobustConfig, "fedavg", bad)


class PoisoningClient(DeviceClient):
    """A device that trains honestly, then uploads its update sign-flipped and scaled."""

    scale = -20.0

    def _send_update(self, update: Update, rnd: int) -> None:
        if self.plan_tensors is not None:
            update = Update(update.label, _poison(self.plan_tensors, update.tensors, self.scale), update.num_samples,
                            update.metrics)
        super()._send_update(update, rnd)

    def _train(self, rnd, plan) -> Update | None:
        self.plan_tensors = {k: np.array(v) for k, v in plan.tensors.items()}
        return super()._train(rnd, plan)

    plan_tensors: dict | None = None


def _federated_accuracy(broker_url: str, digits, options: dict[str, str], job: str) -> float:
    ctx = StrategyContext(FederationConfig(rounds=4, min_devices=DEVICES, round_deadline_s=60, seed=0,
                                           train=TrainConfig(epochs=1, lr=0.05)),
                          "mlp", digits.input_shape, digits.num_classes, options=options)
    strategy = FedAvg.create(ctx)
    transport = MqttTransport(TransportConfig(url=broker_url, client_id=f"{job}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=job))
    fleet.start()
    shards = partition(digits.y_train, DEVICES, "iid", seed=0)
    clients = [(PoisoningClient if i == DEVICES - 1 else DeviceClient)(
        ClientConfig(device_id=f"d{i}", transport=TransportConfig(url=broker_url, client_id=f"{job}-d{i}"), job=job, seed=i),
        LocalData(digits.x_train[shard], digits.y_train[shard], digits.num_classes), load_profile("raspberry-pi-4b"))
        for i, shard in enumerate(shards)]
    report = run_job(strategy, fleet, clients, transport, eval_data=EvalData(digits.x_test, digits.y_test))
    assert all(len(r.participants) == DEVICES for r in report.rounds)
    return report.rounds[-1].accuracy["global"]


@pytest.mark.slow
def test_a_poisoning_device_over_a_real_broker(broker, digits):
    plain = _federated_accuracy(broker.url, digits, {"clip": "none"}, "robust-mean")
    median = _federated_accuracy(broker.url, digits, {"aggregate": "median"}, "robust-median")
    clipped = _federated_accuracy(broker.url, digits, {"clip": "auto"}, "robust-clip")
    assert median > 0.8 and clipped > 0.8, (median, clipped)
    assert plain < median - 0.2, (plain, median)

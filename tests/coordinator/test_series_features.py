"""A MiniRocket model's biases from the fleet: the request and the answer on the wire, what a
device computes, and a job whose devices' statistics fit them before its first round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from coordinator.runtime.series_features import rocket_layers
from coordinator.runtime.state import load_checkpoint
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.device.fleet_statistics import fleet_statistics
from edge_sdk.methods.base import LocalData
from edge_sdk.model_names import MINIROCKET_METHODS
from edge_sdk.models.fedpara import rank_from_gamma
from edge_sdk.models.minirocket import MiniRocketPlan
from edge_sdk.models.minirocket_biases import series_statistics
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.protocol.errors import ProtocolError
from edge_sdk.protocol.messages import Envelope, FleetStats, StatsRequest, decode_envelope, encode_envelope
from edge_sdk.train_config import TrainConfig

PARAMS = {"features": 840, "max_dilations": 32, "seed": 0}


def _waves(n: int, seed: int, length: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Two classes: a slow and a fast sine, of any amplitude and phase, with noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    t = np.arange(length)
    freq = np.where(y == 0, 0.03, 0.2)[:, None]
    x = rng.uniform(1, 20, (n, 1)) * np.sin(2 * np.pi * freq * t + rng.uniform(0, 6, (n, 1)))
    return (x + rng.normal(0, 0.2, x.shape))[:, None, :].astype(np.float32), y


def run_waves_job(broker, job: str, kinds: Sequence[type], rounds: int,
                  options: dict[str, str] | None = None) -> tuple[Any, Any, Any, list]:
    """A FedAvg minirocket job over ``broker`` on the waves: one device of each of ``kinds`` (`DeviceClient`
    or a subclass), a share of the data each, federated evaluation every round; returns its report, the
    round loop, the fleet and the devices."""
    from coordinator.core.federation import EvalData, FederationConfig
    from coordinator.runtime.fleet import Fleet
    from coordinator.runtime.report import RunReport
    from coordinator.runtime.round_loop import RoundLoop
    from coordinator.strategies.base import StrategyContext
    from coordinator.strategies.fedavg import FedAvg
    from edge_sdk.client import ClientConfig
    from edge_sdk.networking.link import MessageLink
    from edge_sdk.networking.transport import MqttTransport, TransportConfig
    from edge_sdk.profiling import load_profile
    from edge_sdk.protocol.topics import Topics
    from tests.support.fleet_job import clients_beside

    x_train, y_train = _waves(90, 8)
    x_test, y_test = _waves(60, 9)
    n = len(kinds)
    strategy = FedAvg.create(StrategyContext(FederationConfig(rounds=rounds, min_devices=n, round_deadline_s=60, seed=0,
                                                              train=TrainConfig(epochs=3, batch_size=8, lr=0.004,
                                                                                loss="squared", momentum=0.9)),
                                             "minirocket", (1, 64), 2, options=dict(options or {})))
    transport = MqttTransport(TransportConfig(url=broker.url, client_id=f"{job}-coordinator"))
    transport.connect()
    fleet = Fleet(MessageLink(transport), Topics(job=job))
    fleet.start()
    clients = [kind(ClientConfig(device_id=f"d{i}", transport=TransportConfig(url=broker.url, client_id=f"{job}-d{i}"),
                                 job=job, seed=i),
                    LocalData(x_train[i::n], y_train[i::n], 2), load_profile("raspberry-pi-4b"))
               for i, kind in enumerate(kinds)]
    loop = RoundLoop(strategy, fleet, RunReport(method="fedavg", config={}), eval_data=EvalData(x_test, y_test),
                     preprocessing=Preprocessing((0.0,), (1.0,), ("slow", "fast"), (1, 64)))
    try:
        with clients_beside(clients)(fleet):
            report = loop.run()
    finally:
        transport.close()
    return report, loop, fleet, clients


def test_the_request_and_the_answer_travel_and_bad_ones_are_refused() -> None:
    request = StatsRequest("series_histograms", PARAMS)
    assert decode_envelope(encode_envelope(Envelope.of(request, "coordinator", round=0))).body == request
    x, _ = _waves(10, 0)
    stats = FleetStats("series_histograms", 10, (), (), series_statistics(MiniRocketPlan(1, 64, 840), x))
    got = decode_envelope(encode_envelope(Envelope.of(stats, "dev", round=0))).body
    assert got.count == 10 and all(np.array_equal(got.tensors[k], stats.tensors[k]) for k in ("shares", "scales"))
    for bad in ({}, {**PARAMS, "seed": -1}, {**PARAMS, "more": 1}):
        with pytest.raises(ProtocolError, match="takes params"):
            StatsRequest("series_histograms", bad)
    with pytest.raises(ProtocolError, match="takes params"):
        StatsRequest("channel_moments", PARAMS)
    negative = {**stats.tensors, "shares": -stats.tensors["shares"]}
    with pytest.raises(ProtocolError, match="finite shares"):
        FleetStats("series_histograms", 10, (), (), negative)
    with pytest.raises(ProtocolError, match="carries tensors"):
        FleetStats("series_histograms", 10, (), (), {"shares": stats.tensors["shares"]})


def test_a_device_answers_in_the_raw_scale_whatever_its_own_normalisation() -> None:
    x, y = _waves(30, 1)
    request = StatsRequest("series_histograms", PARAMS)
    raw = fleet_statistics(request, LocalData(x, y, 2))
    own = Preprocessing((5.0,), (3.0,), ("slow", "fast"), (1, 64))
    normalised = fleet_statistics(request, LocalData((x - 5.0) / 3.0, y, 2, preprocessing=own))
    for key in ("shares", "scales"):
        np.testing.assert_allclose(normalised.tensors[key], raw.tensors[key], atol=2e-3)
    assert raw.count == 30 and raw.tensors["shares"].shape == (MiniRocketPlan(1, 64, 840).combinations, 256)
    with pytest.raises(ValueError, match="fewer than the 3"):
        fleet_statistics(request, LocalData(x[:2], y[:2], 2))
    with pytest.raises(ValueError, match="need \\(C, L\\) series"):
        fleet_statistics(request, LocalData(np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64), 2))


@pytest.mark.parametrize("method", MINIROCKET_METHODS)
def test_a_job_fits_the_biases_from_its_devices_before_the_first_round(tmp_path, method) -> None:
    """Every method that trains minirocket: FedPara and pFedPara trained on features of zero biases
    (their state had no spec to find the layer in) and scored 0.846 on PLAID instead of 0.901, unnoticed."""
    from simulation.config import SimulationConfig, sim_federation
    from simulation.simulate import run_simulation

    x_train, y_train = _waves(90, 2)
    x_test, y_test = _waves(60, 3)
    data = tmp_path / "waves.npz"
    np.savez(data, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, layout="series",
             classes=np.array(["slow", "fast"]))
    checkpoints = tmp_path / "ckpt"
    # pfedpara: γ = auto, chosen in setup; reft: F_λ = 20 gives the default profiles (Pi 3B, 4B, 5) three levels
    options = {"gamma": "0.1"} if method == "fedpara" else {"f_lambda": "20"} if method == "reft" else {}
    config = SimulationConfig(method=method, clients=3, dataset=f"npz:{data}", model="minirocket", plots=False,
                              out=str(tmp_path / "out"), options=options, holdout=0.0,
                              federation=sim_federation(rounds=3, seed=0, checkpoint_dir=str(checkpoints),
                                                        train=TrainConfig(epochs=5, batch_size=8)))
    report = run_simulation(config)
    spec = model_for_dataset("minirocket", (1, 64), 2)
    ((key, _),) = rocket_layers(spec)
    checkpoint = load_checkpoint(checkpoints)
    assert checkpoint is not None
    biases = checkpoint.tensors[key]
    assert biases.shape == (MiniRocketPlan(1, 64).features,) and np.isfinite(biases).all()
    assert np.count_nonzero(biases) > 0.9 * biases.size  # fitted (a zero bias is a tie with a flat stretch)
    if method != "pfedpara":  # its devices' models hold their own W2: the coordinator has no global model
        # a slow from a fast sine, learned by the head in 3 rounds of 5 epochs
        assert max(report.rounds[-1].accuracy.values()) >= 0.95, report.rounds[-1].accuracy  # heterofl: by width
    if method == "reft":  # one round; each device gets the global model cut to its level, distilled: raw series in
        from edge_sdk.inference import OnnxClassifier
        from edge_sdk.model_store import read_model_info

        labels = {d["id"]: d["assignment"] for d in report.devices}
        assert len(set(labels.values())) == 3 and len(list((tmp_path / "out" / "devices").iterdir())) == 3, labels
        for device_dir in sorted((tmp_path / "out" / "devices").iterdir()):
            info = read_model_info(device_dir)
            assert info is not None and info["label"] == labels[device_dir.name], device_dir.name
            predicted = OnnxClassifier(device_dir / "model.onnx").predict(x_test).classes
            assert np.mean(predicted == y_test) >= 0.9, (info["label"], np.mean(predicted == y_test))


@pytest.mark.parametrize("method", ["fedpara", "pfedpara"])
def test_fedpara_trains_minirockets_head_folded_by_kernel_and_sends_its_factors(tmp_path, method) -> None:
    from simulation.config import SimulationConfig, sim_federation
    from simulation.simulate import run_simulation

    x_train, y_train = _waves(90, 2)
    x_test, y_test = _waves(60, 3)
    data = tmp_path / "waves.npz"
    np.savez(data, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, layout="series")
    runs = {}
    for name in ("fedavg", method):
        config = SimulationConfig(method=name, clients=3, dataset=f"npz:{data}", plots=False, holdout=0.0,
                                  out=str(tmp_path / name),
                                  # no server momentum: this toy is learned in one round, and FedAvgM's
                                  # η = 1, β = 0.9 then carries the model 0.9 of that round's step further
                                  options={"server_opt": "none", **({"gamma": "0"} if name != "fedavg" else {})},
                                  federation=sim_federation(rounds=3, seed=0,
                                                            train=TrainConfig(epochs=5, batch_size=8)))
        runs[name] = run_simulation(config).to_dict()
    assert runs[method]["config"]["model"] == "minirocket"  # the series default, with FedPara too
    head = runs[method]["config"]["method_config"]["ranks"]["global"]
    assert head == [rank_from_gamma(84 * 2, MiniRocketPlan(1, 64).per_kernel, 0.0)]  # one folded head
    sent = {name: sum(r["bytes_down"] + r["bytes_up"] for r in run["rounds"]) for name, run in runs.items()}
    # the fixed biases travel once, in each device's first plan (`Plan.fixed`), with either model
    features = MiniRocketPlan(1, 64).features
    dense, factors = (runs[name]["models"]["global"]["params"] for name in ("fedavg", method))
    if method == "pfedpara":  # W2 (x2, y2) stays on the device
        factors //= 2
    shared = factors + 2 * 2 + 2  # x1, y1, tail, bias
    expected = (2 * 3 * dense + features) / (2 * 3 * shared + features)  # 3 rounds, down and up
    assert sent["fedavg"] / sent[method] == pytest.approx(expected, rel=0.05)
    losses = [r["metrics"]["train_loss"] for r in runs[method]["rounds"]]
    assert losses[-1] < 0.5 * losses[0], losses  # it trains
    if method == "fedpara":  # pFedPara's global model is half of each device's: the coordinator holds no whole one
        assert runs[method]["rounds"][-1]["accuracy"]["global"] >= 0.95


@pytest.mark.parametrize("nested", ["false", "true", "too many"])
def test_heterofl_gives_each_device_a_share_of_minirockets_kernels_from_the_same_fitted_biases(tmp_path, nested,
                                                                                               monkeypatch,
                                                                                               caplog) -> None:
    from simulation.config import SimulationConfig, sim_federation
    from simulation.simulate import DEFAULT_FLEET, run_simulation

    x_train, y_train = _waves(160, 6)
    x_test, y_test = _waves(60, 7)
    data = tmp_path / "waves.npz"
    np.savez(data, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, layout="series")
    checkpoints = tmp_path / "ckpt"
    config = SimulationConfig(method="heterofl", clients=7, dataset=f"npz:{data}", plots=False, holdout=0.0,
                              out=str(tmp_path / "out"), profiles=DEFAULT_FLEET,
                              options={"nested": "false" if nested == "false" else "true"},
                              federation=sim_federation(rounds=3, seed=0, checkpoint_dir=str(checkpoints),
                                                        train=TrainConfig(epochs=5, batch_size=8)))
    if nested == "too many":  # a device whose stacked features would outgrow the bound trains its own width alone
        monkeypatch.setattr("edge_sdk.methods.heterofl.MAX_FIXED_FEATURES", 1000)
    report = run_simulation(config)
    too_many = sum("too many to train every smaller width" in r.getMessage() for r in caplog.records)
    assert (too_many > 0) == (nested == "too many")
    assert report.config["model"] == "minirocket"  # `--model auto` on series, with heterofl too
    widths = {d["assignment"] for d in report.to_dict()["devices"]}
    assert len(widths) >= 3  # the default fleet's FLOPS spread the devices over the widths
    biases = load_checkpoint(checkpoints).tensors["layers.0.biases"]
    assert np.all(np.isfinite(biases)) and np.count_nonzero(biases) > 0.9 * biases.size  # fitted, once, for all
    per_kernel = MiniRocketPlan(1, 64).per_kernel  # a width-p head reads ceil(84 p) kernels' features
    params = {label: model["params"] for label, model in report.to_dict()["models"].items()}
    assert params == {label: 2 * kernels * per_kernel + 2 for label, kernels in
                      (("0.25", 21), ("0.5", 42), ("0.75", 63), ("1.0", 84))}
    assert min(report.rounds[-1].accuracy.values()) >= 0.9  # every width tells a slow from a fast sine


def test_devices_with_too_few_series_decline_and_the_job_does_not_wait_for_them(tmp_path) -> None:
    import time

    from simulation.config import SimulationConfig, sim_federation
    from simulation.simulate import run_simulation

    x_train, y_train = _waves(7, 4)  # 3 devices: 3, 2 and 2 series; the two with 2 decline
    x_test, y_test = _waves(20, 5)
    data = tmp_path / "few.npz"
    np.savez(data, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, layout="series")
    config = SimulationConfig(method="fedavg", clients=3, dataset=f"npz:{data}", plots=False, out=str(tmp_path / "out"),
                              holdout=0.0, federation=sim_federation(rounds=1, seed=0, register_timeout_s=60.0))
    started = time.monotonic()
    report = run_simulation(config)
    assert time.monotonic() - started < 30  # not the 60 s a silent device would have cost
    assert report.config["model"] == "minirocket"  # `--model auto` on series
    # ...with its family's training (edge_sdk/family_recipe.py): nothing of it was set here
    assert report.config["family_recipe"] == {"loss": "squared", "lr": 0.004, "momentum": 0.9,
                                              "server_opt": "fedavgm", "server_lr": "1"}
    assert report.config["federation"]["train"]["loss"] == "squared" and report.config["options"]["server_opt"] == "fedavgm"
    assert report.rounds and report.rounds[-1].aggregated


class _Answered:
    """The fleet's side of the exchange as `Fleet.gather_stats` hands it over (by device)."""

    def __init__(self, answers: dict[str, FleetStats]) -> None:
        self.answers, self.asked = answers, []

    def online(self) -> list[str]:
        return ["a", "b"]

    def gather_stats(self, kind: str, devices: list[str], timeout_s: float, params: dict[str, int]) -> dict:
        self.asked.append((kind, params))
        return self.answers


def test_statistics_of_another_shape_are_left_out_and_none_usable_is_one_line(caplog) -> None:
    from coordinator.runtime.series_features import fit_rocket_biases
    from edge_sdk.models.minirocket import layer_plan

    layer = model_for_dataset("minirocket", (1, 64), 2, features=840)["layers"][0]
    plan = layer_plan(layer)
    x, _ = _waves(10, 6)
    good = FleetStats("series_histograms", 10, (), (), series_statistics(plan, x))
    other = FleetStats("series_histograms", 10, (), (), series_statistics(MiniRocketPlan(1, 64, 168), x))
    job = Preprocessing((0.0,), (1.0,))
    both = _Answered({"a": good, "b": other})
    biases = fit_rocket_biases(both, layer, job, seed=0, timeout_s=1.0)  # type: ignore[arg-type]
    assert both.asked == [("series_histograms", {"features": 840, "max_dilations": 32, "seed": 0})]
    alone = fit_rocket_biases(_Answered({"a": good}), layer, job, 0, 1.0)  # type: ignore[arg-type]
    np.testing.assert_array_equal(biases, alone)
    assert "b: series statistics of shapes" in caplog.text
    with pytest.raises(ValueError, match="none of the 2 online devices sent statistics"):
        fit_rocket_biases(_Answered({"b": other}), layer, job, 0, 1.0)  # type: ignore[arg-type]


def test_an_update_that_moves_the_fixed_biases_does_not_move_the_fleets_features(broker, caplog) -> None:
    """A device that keeps no fixed tensors (an SDK before `Plan.fixed`: here a cache of no entries)
    sends the biases back in every update (the model's state); one that sends others back — a
    hostile one here, with clipping off — is undone after the aggregate, and logged."""
    import logging

    from edge_sdk.client import DeviceClient
    from edge_sdk.device.fixed_cache import FixedCache
    from edge_sdk.protocol.messages import Update

    class BiasShifter(DeviceClient):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.rounds.fixed_cache = FixedCache(max_entries=0)

        def _send_update(self, update: Update, rnd: int) -> None:
            tensors = {k: (v + 5.0 if k == "layers.0.biases" else v) for k, v in update.tensors.items()}
            super()._send_update(Update(update.label, tensors, update.num_samples, update.metrics), rnd)

    with caplog.at_level(logging.WARNING, "coordinator.runtime.round_loop"):
        report, loop, _, _ = run_waves_job(broker, "rocket-hold", (DeviceClient, DeviceClient, BiasShifter), rounds=2,
                                           options={"clip": "none", "max_share": "1"})
    fitted = loop._rocket_biases["layers.0.biases"]
    assert np.any(fitted) and np.array_equal(loop.strategy.state_tensors()["layers.0.biases"], fitted)
    assert sum("moved the fixed minirocket biases" in r.getMessage() for r in caplog.records) == 2  # each round
    assert report.rounds[-1].accuracy["global"] >= 0.9


def test_fedparas_link_budget_counts_the_biases_once_not_every_round() -> None:
    """γ = auto fits a round's plan and update into ``comm_s``: a MiniRocket layer's biases travel in a
    device's first plan only (`Plan.fixed`), so a round's bytes are the factors' alone."""
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies.base import StrategyContext
    from coordinator.strategies.fedpara import FedPara
    from edge_sdk.models.spec import count_params

    strategy = FedPara.create(StrategyContext(FederationConfig(), "minirocket", (1, 64), 2, options={"gamma": "0.1"}))
    spec = strategy.spec_for(0.1, 1.0)
    assert strategy.sent_bytes("global", 0.1) == 4 * count_params(spec)
    assert count_params(spec) < MiniRocketPlan(1, 64).features  # the biases would have been most of it


@pytest.mark.parametrize("method", ["flanc", "lowrank", "static-prune"])
def test_the_methods_that_cannot_train_minirocket_say_so_in_one_line(method) -> None:
    """minirocket's one trainable layer has a row per class: FLANC and static pruning find nothing to compose or
    prune (REFT's levels keep kernel subsets), and the naive low-rank baseline is not folded by kernel as FedPara's
    and FDNNC's are."""
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies import create_strategy
    from coordinator.strategies.base import StrategyContext

    with pytest.raises(ValueError, match=f"^{method} cannot train minirocket .*fedavg, fedprox, heterofl, fedpara, "
                                         "pfedpara, fdnnc, reft") as error:
        create_strategy(method, StrategyContext(FederationConfig(), "minirocket", (1, 64), 2))
    assert "\n" not in str(error.value)


def test_a_minirocket_method_without_a_state_spec_is_refused_rather_than_trained_on_zero_biases(monkeypatch) -> None:
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies import create_strategy, strategy_class
    from coordinator.strategies.base import Strategy, StrategyContext

    ctx = StrategyContext(FederationConfig(), "minirocket", (1, 64), 2, options={"gamma": "0.1"})
    assert create_strategy("fedpara", ctx).state_spec() is not None
    monkeypatch.setattr(strategy_class("fedpara"), "state_spec", Strategy.state_spec)  # as FedPara's was
    with pytest.raises(ValueError, match="^fedpara cannot train minirocket: it names no network"):
        create_strategy("fedpara", ctx)


def test_nested_asks_each_device_for_the_classifiers_of_the_smaller_widths_and_only_of_minirocket() -> None:
    import torch

    from coordinator.core.federation import FederationConfig
    from coordinator.strategies import create_strategy
    from coordinator.strategies.base import StrategyContext
    from edge_sdk.methods.heterofl import nested_masks
    from edge_sdk.models.spec import build_model

    strategy = create_strategy("heterofl", StrategyContext(FederationConfig(), "minirocket", (2, 64), 3,
                                                           options={"nested": "true"}))
    assert [strategy.train_settings(label, 0).get("nested_kernels") for label in strategy.labels] == \
        [None, (21,), (21, 42), (21, 42, 63)]
    with pytest.raises(ValueError, match="nested trains minirocket's classifier"):
        create_strategy("heterofl", StrategyContext(FederationConfig(), "cnn1d", (2, 64), 3, options={"nested": "true"}))
    layer = build_model(model_for_dataset("minirocket", (2, 64), 3, width=0.5, series_norm=True)).layers[0]
    width = layer.plan.features + 2  # the two channels' log scales come last
    masks = nested_masks(layer, [21], width)
    assert masks.shape == (2, width) and bool(masks[0].all())
    assert masks[1].sum() == 21 * layer.plan.per_kernel + 2 and bool(masks[1, -2:].all())
    assert torch.equal(masks[1, :21 * layer.plan.per_kernel], torch.ones(21 * layer.plan.per_kernel))
    for bad in ([42], [0], [21.0], list(range(1, 20)), "21"):
        with pytest.raises(ValueError, match="nested_kernels must be"):
            nested_masks(layer, bad, width)

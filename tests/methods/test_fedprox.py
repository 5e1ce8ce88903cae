"""FedProx: the proximal term on the device, μ carried by the plan (as ``prox_mu``: one road to the
term for FedProx's ``mu`` and any method's ``prox_mu``), and what it does to training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.core.device_record import DeviceRecord
from coordinator.strategies import create_strategy
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.methods import device_method
from edge_sdk.methods.base import DeviceContext, LocalData
from edge_sdk.training import proximal_term
from edge_sdk.profiling import load_profile
from edge_sdk.training import TrainConfig


def _strategy(**options: str):
    config = FederationConfig(seed=0, train=TrainConfig(epochs=3, batch_size=16, lr=0.1))
    return create_strategy("fedprox", StrategyContext(config, "mlp", (1, 8, 8), 4, options=options))


def _data(seed: int = 1) -> LocalData:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 96)  # a non-IID device: 2 of the 4 classes
    x = rng.normal(size=(96, 1, 8, 8)).astype(np.float32) + y[:, None, None, None].astype(np.float32)
    return LocalData(x, y, 4)


def _record() -> DeviceRecord:
    return DeviceRecord("dev0", load_profile("raspberry-pi-4b"), 96)


def test_the_term_is_half_mu_times_the_squared_distance() -> None:
    model = torch.nn.Linear(3, 2)
    term = proximal_term(list(model.parameters()), mu=0.5)
    with torch.no_grad():
        assert term().item() == 0.0
        model.weight += 2.0  # 6 weights moved by 2: ‖d‖² = 24
        assert term().item() == pytest.approx(0.5 * 0.5 * 24)


def test_the_plan_carries_mu_and_the_option_is_checked() -> None:
    strategy = _strategy(mu="0.3")
    plan = strategy.configure_train(1, _record())
    assert plan.method == "fedprox" and plan.train["prox_mu"] == 0.3 and "mu" not in plan.train
    assert _strategy().configure_train(1, _record()).train["prox_mu"] == 0.01
    assert _strategy(mu="0.05", prox_mu="0.2").configure_train(1, _record()).train["prox_mu"] == 0.2  # the larger
    assert _strategy(mu="0.3", prox_mu="0.2").configure_train(1, _record()).train["prox_mu"] == 0.3
    for bad in ("-1", "nan", "inf", "x"):
        with pytest.raises(ValueError, match=r"^fedprox: option mu: "):
            _strategy(mu=bad)


def _distance(plan, update) -> float:
    return float(sum(np.sum((update.tensors[k] - plan.tensors[k]) ** 2) for k in plan.tensors))


def test_a_larger_mu_keeps_the_local_model_nearer_the_global_one() -> None:
    train = device_method("fedprox")
    ctx = DeviceContext("dev0", round=1, seed=0)
    distances = {}
    for mu in ("0", "1", "10"):
        plan = _strategy(mu=mu).configure_train(1, _record())
        update = train(plan, _data(), ctx)
        assert np.isfinite(update.metrics["loss"])
        distances[mu] = _distance(plan, update)
    assert distances["0"] > distances["1"] > distances["10"] > 0, distances


def test_mu_zero_trains_exactly_as_fedavg() -> None:
    ctx = DeviceContext("dev0", round=1, seed=0)
    prox = _strategy(mu="0").configure_train(1, _record())
    config = FederationConfig(seed=0, train=TrainConfig(epochs=3, batch_size=16, lr=0.1))
    fedavg = create_strategy("fedavg", StrategyContext(config, "mlp", (1, 8, 8), 4)).configure_train(1, _record())
    a = device_method("fedprox")(prox, _data(), ctx)
    b = device_method("fedavg")(fedavg, _data(), ctx)
    for key in a.tensors:
        np.testing.assert_array_equal(a.tensors[key], b.tensors[key])


def test_a_device_refuses_a_negative_mu_from_a_peer() -> None:
    plan = _strategy().configure_train(1, _record())
    bad = type(plan)(method=plan.method, label=plan.label, model_spec=plan.model_spec, tensors=plan.tensors,
                     train={**plan.train, "prox_mu": -0.5})
    with pytest.raises(ValueError, match=r"TrainConfig\.prox_mu must be a finite number in \[0\.0, 10000\.0\]"):
        device_method("fedprox")(bad, _data(), DeviceContext("dev0", round=1))


@pytest.mark.parametrize("name", ["fedavg", "flanc", "heterofl", "fedpara", "pfedpara", "lowrank", "fdnnc",
                                  "static-prune", "reft"])
def test_every_method_sends_prox_mu_with_its_plans(name) -> None:
    config = FederationConfig(seed=0, train=TrainConfig(epochs=1, batch_size=16, lr=0.1))
    options = {"prox_mu": "0.2", **({"f_lambda": "50"} if name in ("reft", "static-prune") else {})}
    strategy = create_strategy(name, StrategyContext(config, "mlp", (1, 8, 8), 4, options=options,
                                                     public_data=np.zeros((8, 1, 8, 8), np.float32)))
    assert strategy.config.train.prox_mu == 0.2
    with pytest.raises(ValueError, match=rf"^{name}: option prox_mu: must be in \[0, 10000\], got '-1'$"):
        create_strategy(name, StrategyContext(config, "mlp", (1, 8, 8), 4, options={"prox_mu": "-1"}))


def test_prox_mu_keeps_any_methods_local_model_nearer_the_global_one() -> None:
    """The term sits in train_local, so a FedAvg plan with prox_mu behaves as FedProx's."""
    ctx = DeviceContext("dev0", round=1, seed=0)
    distances = {}
    for mu in ("0", "5"):
        config = FederationConfig(seed=0, train=TrainConfig(epochs=3, batch_size=16, lr=0.1))
        strategy = create_strategy("fedavg", StrategyContext(config, "mlp", (1, 8, 8), 4, options={"prox_mu": mu}))
        plan = strategy.configure_train(1, _record())
        assert plan.train["prox_mu"] == float(mu)
        distances[mu] = _distance(plan, device_method("fedavg")(plan, _data(), ctx))
    assert distances["0"] > 1.5 * distances["5"] > 0, distances

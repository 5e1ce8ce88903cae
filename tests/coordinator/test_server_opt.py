"""Server optimizers: FedAvgM, FedAdam and FedYogi on the aggregate, for every weight-averaging
method, after the robust rule, checkpointed; bad options rejected in one line."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from coordinator.runtime.report import RunReport
from coordinator.aggregate.server_opt import ServerOptimizer
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.runtime.round_loop import RoundLoop
from coordinator.runtime.state import load_checkpoint
from coordinator.strategies import STRATEGIES, create_strategy
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.methods.settings.shared import RobustConfig, ServerOptConfig
from edge_sdk.training import TrainConfig

B1, B2, TAU = 0.9, 0.99, 1e-3


def _step(opt: ServerOptimizer, config: ServerOptConfig, current: np.ndarray, target: np.ndarray) -> np.ndarray:
    return opt.step(config, "g", {"w": current}, {"w": target})["w"]


def test_none_and_momentless_fedavgm_take_the_aggregate() -> None:
    current, target = np.zeros(3, np.float32), np.array([1.0, -2.0, 0.5], np.float32)
    assert np.array_equal(_step(ServerOptimizer(), ServerOptConfig(), current, target), target)
    plain = ServerOptConfig("fedavgm", lr=1.0, momentum=0.0)
    assert np.allclose(_step(ServerOptimizer(), plain, current, target), target)


def test_fedavgm_accumulates_momentum() -> None:
    opt, config = ServerOptimizer(), ServerOptConfig("fedavgm", lr=0.5, momentum=0.9)
    w0 = np.zeros(2)
    w1 = _step(opt, config, w0, w0 + 1.0)  # m = 1
    w2 = _step(opt, config, w1, w1 + 1.0)  # m = 0.9 + 1
    assert np.allclose(w1, 0.5) and np.allclose(w2, 0.5 + 0.5 * 1.9)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
def test_adaptive_steps_follow_the_paper(name) -> None:
    opt, config = ServerOptimizer(), ServerOptConfig(name, lr=0.1, beta1=B1, beta2=B2, tau=TAU)
    w, m, v = np.zeros(4), np.zeros(4), np.full(4, TAU ** 2)
    for delta in (np.array([0.02, -0.01, 0.0, 0.5]), np.array([0.01, 0.01, -0.03, 0.0])):
        new = _step(opt, config, w, w + delta)
        m = B1 * m + (1 - B1) * delta
        v = (B2 * v + (1 - B2) * delta ** 2 if name == "fedadam"
             else v - (1 - B2) * delta ** 2 * np.sign(v - delta ** 2))
        w = w + 0.1 * m / (np.sqrt(v) + TAU)
        assert np.allclose(new, w)
    assert not np.allclose(opt.v["g/w"], B2 * B2 * TAU ** 2)  # the moments moved


def test_norm_statistics_and_counters_take_the_aggregate() -> None:
    current = {"bn.running_mean": np.zeros(2, np.float32), "bn.num_batches_tracked": np.array(3),
               "w": np.zeros(2, np.float32)}
    target = {"bn.running_mean": np.ones(2, np.float32), "bn.num_batches_tracked": np.array(5),
              "w": np.ones(2, np.float32)}
    out = ServerOptimizer().step(ServerOptConfig("fedadam"), "g", current, target)
    assert np.array_equal(out["bn.running_mean"], target["bn.running_mean"])
    assert out["bn.num_batches_tracked"] == 5
    assert out["w"].dtype == np.float32 and np.allclose(out["w"], 0.01 * 0.1 / (np.sqrt(0.01 + 0.99e-6) + 1e-3))


def _ctx(method: str = "fedavg", **options: str) -> StrategyContext:
    return StrategyContext(FederationConfig(seed=0), "mlp", (1, 8, 8), 10, options=options)


@pytest.mark.parametrize("options, message", [
    ({"server_opt": "adam"}, r"^fedavg: option server_opt: must be one of none\|fedavgm\|fedadam\|fedyogi, got 'adam'$"),
    ({"server_opt": "fedadam", "server_lr": "-1"}, r"^fedavg: option server_lr: must be in \[1e-09, 1000\], got '-1'$"),
    ({"server_opt": "fedavgm", "server_momentum": "nan"}, r"^fedavg: option server_momentum: must be in"),
    ({"server_opt": "fedyogi", "beta2": "1"}, r"^fedavg: option beta2: must be in \[0, 0.9999\]"),
    ({"server_opt": "fedyogi", "tau": "inf"}, r"^fedavg: option tau: must be in"),
])
def test_bad_options_are_one_line_errors(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        create_strategy("fedavg", _ctx(**options))


def test_a_method_that_does_not_average_weights_refuses_a_server_optimizer() -> None:
    with pytest.raises(ValueError, match=r"^reft: \['server_opt'\] need a method that averages weights"):
        STRATEGIES["reft"].parse_options({"server_opt": "fedavgm"})


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "flanc", "heterofl", "fedpara", "pfedpara", "lowrank",
                                  "fdnnc", "static-prune"])
def test_every_weight_averaging_method_takes_the_options(name) -> None:
    strategy = create_strategy(name, _ctx(server_opt="fedyogi", server_lr="0.02", aggregate="median"))
    config = strategy.parse_options({"server_opt": "fedyogi", "server_lr": "0.02", "aggregate": "median"})
    assert config.robust == RobustConfig(rule="median")  # two groups, each parsed once into its own config
    assert config.server == ServerOptConfig("fedyogi", lr=0.02)


def test_the_rule_runs_first_then_the_optimizer() -> None:
    strategy = create_strategy("fedavg", _ctx())
    current = {"w": np.zeros(3, np.float32)}
    sets = [{"w": np.full(3, v, np.float32)} for v in (1.0, 1.0, 100.0)]  # an outlier
    server = ServerOptConfig("fedavgm", lr=0.5, momentum=0.0)
    out, _ = strategy.fold("g", current, sets, [1, 1, 1], RobustConfig(rule="median"), server)
    assert np.allclose(out["w"], 0.5)  # half of the median's step, untouched by the outlier


def test_moments_are_checkpointed_and_resumed(tmp_path) -> None:
    federation = FederationConfig(seed=0, checkpoint_dir=str(tmp_path))
    ctx = StrategyContext(federation, "mlp", (1, 8, 8), 10, options={"server_opt": "fedadam"})
    first, resumed = create_strategy("fedavg", ctx), create_strategy("fedavg", ctx)
    rule, server = first.robust, first.server
    rng = np.random.default_rng(0)
    for _ in range(2):
        sets = [{k: v + rng.normal(scale=0.01, size=v.shape).astype(v.dtype) for k, v in first.weights.items()}]
        first.weights, _ = first.fold("global", first.weights, sets, [1], rule, server)
    RoundLoop(first, SimpleNamespace(), RunReport("fedavg", {}))._checkpoint(1)
    saved = load_checkpoint(tmp_path).tensors
    assert any(k.startswith("server_opt:m/global/") for k in saved) and any(k.startswith("server_opt:v/") for k in saved)
    assert RoundLoop(resumed, SimpleNamespace(), RunReport("fedavg", {}))._resume() == 2
    for key in first.server_opt.m:
        assert np.array_equal(first.server_opt.m[key], resumed.server_opt.m[key])
        assert np.array_equal(first.server_opt.v[key], resumed.server_opt.v[key])
    sets = [{k: v + 0.01 for k, v in first.weights.items()}]
    a, _ = first.fold("global", first.weights, sets, [1], rule, server)
    b, _ = resumed.fold("global", resumed.weights, sets, [1], rule, server)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_flanc_steps_its_basis_and_each_width_as_groups(tmp_path, broker) -> None:
    config = SimulationConfig(method="flanc", clients=4, dataset="digits", model="mlp", out=str(tmp_path),
                              broker_url=broker.url, job="server-opt-flanc", plots=False,
                              options={"server_opt": "fedavgm", "sample": "every"},
                              federation=sim_federation(rounds=2, checkpoint_dir=str(tmp_path / "ckpt"),
                                                        train=TrainConfig(epochs=1, batch_size=32, lr=0.05)))
    report = run_simulation(config)
    assert all(r.aggregated for r in report.rounds)
    assert all(0.0 <= a <= 1.0 for a in report.rounds[-1].accuracy.values())
    groups = {k.split("/")[1] for k in load_checkpoint(tmp_path / "ckpt").tensors if k.startswith("server_opt:m/")}
    assert groups == {"basis", "0.25", "0.5", "0.75", "1.0"}


def test_the_coordinator_toml_takes_the_same_names(tmp_path) -> None:
    from coordinator.runtime.coordinator_command import coordinator_config_from_toml

    path = tmp_path / "coordinator.toml"
    path.write_text('method = "heterofl"\ndataset = "digits"\n[options]\nserver_opt = "fedyogi"\nserver_lr = 0.003\nprox_mu = 0.01\n')
    config = coordinator_config_from_toml(path)
    strategy = create_strategy(config.method, StrategyContext(FederationConfig(), "mlp", (1, 8, 8), 10,
                                                              options=config.options))
    assert strategy.settings.server == ServerOptConfig("fedyogi", lr=0.003)
    assert strategy.config.train.prox_mu == 0.01


def test_fdnnc_steps_its_composed_dense_model_once_per_round(tmp_path, broker) -> None:
    config = SimulationConfig(method="fdnnc", clients=4, dataset="digits", model="mlp", out=str(tmp_path),
                              broker_url=broker.url, job="server-opt-fdnnc", plots=False,
                              options={"server_opt": "fedavgm", "pattern": "both", "big_fraction": "0.5"},
                              federation=sim_federation(rounds=2, checkpoint_dir=str(tmp_path / "ckpt"),
                                                        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, momentum=0.9)))  # > 0.3 in 2 rounds
    report = run_simulation(config)
    assert all(r.aggregated for r in report.rounds)
    # big 0.524, small 0.337 measured 2026-11-25
    assert report.rounds[-1].accuracy["big"] > 0.49 and report.rounds[-1].accuracy["small"] > 0.3
    groups = {k.split("/")[1] for k in load_checkpoint(tmp_path / "ckpt").tensors if k.startswith("server_opt:m/")}
    assert groups == {"dense"}


def test_fedavgm_steps_as_far_as_fedavg_by_default() -> None:
    """η = 1 − β by default: a constant pseudo-gradient Δ moves the model by Δ per round once the
    momentum has built up (the paper's η = 1 moves it 10×, and diverged in BENCHMARKS.md)."""
    assert ServerOptConfig("fedavgm").step_size == pytest.approx(0.1)
    assert ServerOptConfig("fedavgm", momentum=0.5).step_size == pytest.approx(0.5)
    assert ServerOptConfig("fedavgm", lr=1.0).step_size == 1.0
    assert ServerOptConfig("fedadam").step_size == ServerOptConfig("fedyogi").step_size == 0.01
    opt, config, w = ServerOptimizer(), ServerOptConfig("fedavgm"), np.zeros(1)
    for _ in range(200):
        step = _step(opt, config, w, w + 1.0) - w
        w = w + step
    assert step == pytest.approx(1.0, rel=1e-6)


def test_a_coordinator_toml_leaves_minirocket_its_recipe_for_the_keys_it_does_not_set(tmp_path) -> None:
    from coordinator.runtime.coordinator_command import coordinator_config_from_toml
    from coordinator.runtime.family_training import with_family_training

    path = tmp_path / "coordinator.toml"
    path.write_text('model = "minirocket"\ndataset = "basicmotions"\n[train]\nepochs = 5\nlr = 0.01\n')
    config, filled = with_family_training(coordinator_config_from_toml(path))
    assert filled == {"loss": "squared", "momentum": 0.9, "server_opt": "fedavgm", "server_lr": "1"}
    assert config.chosen == ("epochs", "lr")
    assert (config.federation.train.lr, config.federation.train.loss, config.federation.train.momentum) == (0.01, "squared", 0.9)
    assert config.options == {"server_opt": "fedavgm", "server_lr": "1"}
    path.write_text('model = "minirocket"\ndataset = "basicmotions"\n[options]\nserver_opt = "none"\n')
    assert with_family_training(coordinator_config_from_toml(path))[0].options == {"server_opt": "none"}

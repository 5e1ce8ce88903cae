"""One road for a method's settings: every device setting a user gives reaches the device in every
plan, and the job's lr schedule is applied once, to the method's own lr where it has one
(issue 57: FedAvg's and FedProx's ``static_bn=false`` was accepted, documented and reported, but
never sent, so devices re-measured BatchNorm statistics whatever the user said)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.core.federation import FederationConfig
from coordinator.core.device_record import DeviceRecord
from coordinator.strategies import STRATEGIES, create_strategy
from coordinator.strategies.base import StrategyContext
from edge_sdk.methods import LocalData
from edge_sdk.methods.base import DeviceContext
from edge_sdk.methods.fedavg import train_fedavg
from edge_sdk.methods.settings.options import schema
from edge_sdk.profiling import load_profile
from edge_sdk.training import TrainConfig

#: a value other than the default for every device setting (option key -> (text, value on the wire))
NOT_DEFAULT = {"static_bn": ("false", False), "orth_lambda": ("0.05", 0.05), "holdout": ("0.3", 0.3),
               "logits_dtype": ("int8", "int8"), "device_eval": ("true", True)}
#: options that let a method plan without a fleet decision of its own
STANDALONE = {"fedpara": {"gamma": "0.5"}, "pfedpara": {"gamma": "0.5"}, "lowrank": {"gamma": "0.5"},
              "static-prune": {"ratio": "0.5"}, "fdnnc": {"pattern": "both"}}


def _device_settings(name: str) -> list[tuple[str, str]]:
    """(option key, plan.train key) of every setting of ``name`` that its devices read."""
    return [(row.key, row.wire) for row in schema(STRATEGIES[name].settings_type) if row.wire]


def _plan(name: str, options: dict[str, str], family: str = "mlp", shape: tuple[int, ...] = (1, 8, 8),
          rnd: int = 0, lr_decay: str = "", lr: float = 0.05):
    public = np.random.default_rng(0).normal(size=(20, *shape)).astype(np.float32)  # REFT's public set
    federation = FederationConfig(seed=0, lr_decay=lr_decay, train=TrainConfig(epochs=1, batch_size=8, lr=lr))
    strategy = create_strategy(name, StrategyContext(federation, family, shape, 3, public_data=public,
                                                     options={**STANDALONE.get(name, {}), **options}))
    profile = load_profile("raspberry-pi-4b")
    records = {d: DeviceRecord(d, profile, 40) for d in ("d0", "d1", "d2")}
    for record in records.values():
        record.label = strategy.assign(record)
    for device_id, label in (strategy.setup(records, list(records)) or {}).items():  # as the round loop does
        records[device_id].label = label
    for stage in strategy.round_stages(rnd, list(records.values())):
        strategy.begin_stage(rnd, stage)
    strategy.begin_round_plans(rnd, list(records))
    return strategy.configure_train(rnd, records["d0"])


def test_every_device_setting_has_a_value_to_try() -> None:
    device_keys = {key for name in STRATEGIES for key, _ in _device_settings(name)}
    assert device_keys and device_keys <= set(NOT_DEFAULT), f"add a non-default value for {device_keys - set(NOT_DEFAULT)}"


@pytest.mark.parametrize(("name", "key", "wire"), [(n, k, w) for n in sorted(STRATEGIES) for k, w in _device_settings(n)])
def test_a_device_setting_given_by_the_user_travels_in_the_plan(name, key, wire) -> None:
    text, value = NOT_DEFAULT[key]
    default_plan, plan = _plan(name, {}), _plan(name, {key: text})
    assert plan.train[wire] == value and default_plan.train[wire] != value


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "static-prune"])
def test_static_bn_false_changes_what_a_fedavg_device_uploads(name) -> None:
    """The methods whose devices run FedAvg's part, on a BatchNorm network (cnn1d): the plan of
    ``static_bn=false`` keeps the momentum statistics, the default's re-measures them."""
    rng = np.random.default_rng(1)
    data = LocalData(rng.standard_normal((40, 2, 32)).astype(np.float32) * 3 + 1, rng.integers(0, 3, 40), 3)
    uploads = {}
    for static_bn in ("true", "false"):
        plan = _plan(name, {"static_bn": static_bn}, family="cnn1d", shape=(2, 32))
        torch.manual_seed(0)
        uploads[static_bn] = train_fedavg(plan, data, DeviceContext("d0", 0)).tensors
    means = [n for n in uploads["true"] if n.endswith(".running_mean")]
    assert means and all(not np.allclose(uploads["true"][n], uploads["false"][n], atol=1e-3) for n in means)


@pytest.mark.parametrize(("name", "own_lr"), [("fedavg", 0.05), ("reft", 0.003), ("static-prune", 0.003),
                                              ("fedpara", 0.005), ("flanc", 0.05), ("fdnnc", 0.05)])
def test_the_lr_schedule_is_applied_once_to_the_lr_the_devices_train_with(name, own_lr) -> None:
    """``lr_decay=2:0.1``: round 0's plans carry the method's lr, round 2's a tenth of it."""
    first = _plan(name, {}, lr_decay="2:0.1", rnd=0)
    decayed = _plan(name, {}, lr_decay="2:0.1", rnd=2)
    assert first.train["lr"] == pytest.approx(own_lr)
    assert decayed.train["lr"] == pytest.approx(own_lr * 0.1)

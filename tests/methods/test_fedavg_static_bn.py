"""FedAvg's device part measures exact BatchNorm statistics after training (``static_bn``, the
default): the uploaded running mean/var are those of the device's data under its trained weights,
not momentum averages a few steps old; ``static_bn=false`` in the plan keeps the momentum ones."""

from __future__ import annotations

import copy

import numpy as np
import torch

from edge_sdk.methods import LocalData
from edge_sdk.methods.base import DeviceContext
from edge_sdk.methods.batchnorm import static_bn_stats
from edge_sdk.methods.fedavg import train_fedavg
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import cnn1d
from edge_sdk.protocol.messages import Plan
from edge_sdk.tensors import load_numpy_state, state_to_numpy


def _round(static_bn: bool | None) -> tuple[dict[str, np.ndarray], LocalData, dict]:
    torch.manual_seed(0)
    spec = cnn1d(in_channels=2, num_classes=3, length=32)
    rng = np.random.default_rng(1)
    data = LocalData(rng.standard_normal((40, 2, 32)).astype(np.float32) * 3 + 1, rng.integers(0, 3, 40), 3)
    train = {"epochs": 1, "batch_size": 8, "lr": 0.05, **({} if static_bn is None else {"static_bn": static_bn})}
    plan = Plan(method="fedavg", label="global", model_spec=spec, tensors=state_to_numpy(build_model(spec)), train=train)
    update = train_fedavg(plan, data, DeviceContext("d0", 0))
    return update.tensors, data, spec


def test_the_uploaded_statistics_are_the_exact_ones_of_the_trained_weights() -> None:
    tensors, data, spec = _round(None)
    model = build_model(spec)
    load_numpy_state(model, tensors)
    exact = copy.deepcopy(model)
    assert static_bn_stats(exact, torch.from_numpy(data.x), batch_size=8) == 4  # four BatchNorm1d, its batches
    for name, value in state_to_numpy(exact).items():
        if name.endswith((".running_mean", ".running_var")):
            np.testing.assert_allclose(tensors[name], value, rtol=1e-5, atol=1e-6)


def test_static_bn_false_keeps_the_momentum_averages() -> None:
    measured, _, _ = _round(True)
    momentum, _, _ = _round(False)
    means = [n for n in measured if n.endswith(".running_mean")]
    assert means and all(not np.allclose(measured[n], momentum[n], atol=1e-3) for n in means)
    weights = [n for n in measured if n.endswith(".weight")]
    assert all(np.array_equal(measured[n], momentum[n]) for n in weights)  # the training itself is the same

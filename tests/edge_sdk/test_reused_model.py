"""FedAvg's device part trains in the network its thread built for the same spec before
(`reused_model`): a round gives the very floats a freshly built network gives, and an update
already returned is not changed by the rounds trained after it on that thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from edge_sdk.methods import LocalData
from edge_sdk.methods.base import DeviceContext, reused_model
from edge_sdk.methods.fedavg import train_fedavg
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import cnn1d, mlp
from edge_sdk.protocol.messages import Plan
from edge_sdk.tensors import state_to_numpy

T = TypeVar("T")


def _plan(spec: dict, seed: int) -> Plan:
    torch.manual_seed(seed)
    return Plan(method="fedavg", label="global", model_spec=spec, tensors=state_to_numpy(build_model(spec), copy=True),
                train={"epochs": 1, "batch_size": 8, "lr": 0.05, "momentum": 0.9})


def _data(seed: int) -> LocalData:
    rng = np.random.default_rng(seed)
    return LocalData(rng.standard_normal((24, 2, 32)).astype(np.float32), rng.integers(0, 3, 24), 3)


def _on_a_new_thread(work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own (which has built no network yet)."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def test_rounds_in_a_reused_network_equal_rounds_in_fresh_ones_and_keep_their_updates() -> None:
    spec = cnn1d(in_channels=2, num_classes=3, length=32)  # BatchNorm: buffers are replaced too
    plans, datas = [_plan(spec, s) for s in range(3)], [_data(s) for s in range(3)]

    def three_rounds() -> list[dict[str, np.ndarray]]:
        return [train_fedavg(p, d, DeviceContext(f"d{i}", i)).tensors
                for i, (p, d) in enumerate(zip(plans, datas, strict=True))]

    updates = _on_a_new_thread(three_rounds)  # rounds 2 and 3 in round 1's network
    fresh = [_on_a_new_thread(lambda i=i: train_fedavg(plans[i], datas[i], DeviceContext(f"d{i}", i)).tensors)
             for i in range(3)]
    for update, alone in zip(updates, fresh, strict=True):
        assert update.keys() == alone.keys()
        assert all(np.array_equal(update[k], alone[k]) for k in alone)
    assert any(not np.array_equal(updates[1][k], plans[1].tensors[k]) for k in plans[1].tensors)  # it trained


def test_an_update_is_a_copy_that_later_rounds_leave_alone() -> None:
    spec = cnn1d(in_channels=2, num_classes=3, length=32)

    def two_rounds() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        first = train_fedavg(_plan(spec, 0), _data(0), DeviceContext("d0", 0)).tensors
        kept = {k: v.copy() for k, v in first.items()}
        train_fedavg(_plan(spec, 1), _data(1), DeviceContext("d1", 1))
        return first, kept

    first, kept = _on_a_new_thread(two_rounds)
    assert all(np.array_equal(first[k], kept[k]) for k in kept)


def test_a_network_is_reused_only_for_the_same_spec_on_the_same_thread() -> None:
    small, other = mlp(in_features=8, num_classes=2, hidden=(4,)), mlp(in_features=8, num_classes=2, hidden=(5,))

    def models() -> list[torch.nn.Module]:
        a, b = reused_model(_plan(small, 0)), reused_model(_plan(small, 1))
        return [a, b, reused_model(_plan(other, 0)), reused_model(_plan(other, 1))]

    a, b, c, d = _on_a_new_thread(models)
    assert a is b and c is d and c is not a
    loaded = state_to_numpy(b)
    assert all(np.array_equal(loaded[k], v) for k, v in _plan(small, 1).tensors.items())  # the last plan's values
    assert _on_a_new_thread(lambda: reused_model(_plan(other, 1))) is not d  # each thread its own

"""Robust aggregation against one poisoning device, in every method.

    python bench/bench_robust.py

One round of real local training on scikit-learn's digits by 7 devices: 4 wide (width 1.0;
FDNNC: big; REFT: dense) and 3 narrow (width 0.5; FDNNC: small; REFT: pruned to P = 0.9).
Device d0 (wide) uploads its update sign-flipped × 20 around what it was sent (REFT: its logits
× −20). Weight methods: the distance of the aggregate from the honest plain-mean aggregate, in
honest steps (how far an honest round moves the model). REFT: the distilled global model's
accuracy on the held-out digits. tests/coordinator/test_robust_methods.py asserts on the same rounds.
"""

from __future__ import annotations

import math
import sys

import numpy as np

__all__ = ["DEVICES", "WIDE", "METHODS", "RULES", "PLAIN", "poisoned_round", "float_state", "distance", "main"]

DEVICES = 7
WIDE = ("d0", "d1", "d2", "d3")  # width 1.0 / big / dense; d0 poisons
METHODS = {
    "heterofl": {"widths": "0.5,1", "norm": "none"},
    "flanc": {"widths": "0.5,1"},
    "fedpara": {"widths": "0.5,1", "gamma": "0.3"},
    "fdnnc": {"big_gflops": "20", "upload": "full", "hidden": "64", "rank": "8"},
}
#: REFT on the MLP: wide devices dense (P = 0), narrow ones P = 0.9; a short distillation
REFT = {"backend": "torch-pruning", "distill_epochs": "30", "local_lr": "0.01"}
#: the plain sample-weighted mean (no norm screen, no share cap): what the honest reference uses
PLAIN = {"clip": "none", "max_share": "1"}
RULES = {"mean": PLAIN, "median": {"aggregate": "median"}, "trimmed 0.25": {"aggregate": "trimmed", "trim": "0.25"},
         "clip auto": {"clip": "auto"}, "default (clip 3x)": {}}
PUBLIC = 300  # REFT: the first training inputs are the public set, never a device's


def _options(method: str, robust: dict[str, str]) -> dict[str, str]:
    if method == "reft":
        return {**REFT, **robust}
    options = dict(METHODS[method], **robust)
    if method != "fdnnc":
        options["override"] = ",".join(f"d{i}:{'1.0' if f'd{i}' in WIDE else '0.5'}" for i in range(DEVICES))
    return options


def _poison(plan_tensors: dict, tensors: dict, scale: float) -> dict:
    """Float tensors moved ``scale`` times as far from what was sent (from 0 if nothing was sent)."""
    out = {}
    for k, v in tensors.items():
        sent = plan_tensors.get(k)
        base = sent if sent is not None and sent.shape == v.shape else np.zeros_like(v)
        out[k] = (base + scale * (v - base)).astype(v.dtype) if v.dtype.kind == "f" else v
    return out


def poisoned_round(method: str, data, robust: dict[str, str], scale: float | None):
    """The strategy after one aggregated round; d0's upload scaled by ``scale`` (None: honest)."""
    from coordinator.core.device_record import DeviceRecord
    from coordinator.core.received_update import ReceivedUpdate
    from coordinator.strategies import create_strategy
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies.base import StrategyContext
    from edge_sdk.methods import DeviceContext, LocalData, device_method
    from edge_sdk.data.partition import partition
    from edge_sdk.profiling import DeviceProfile
    from edge_sdk.protocol.messages import Update
    from edge_sdk.training import TrainConfig

    reft = method == "reft"
    train = TrainConfig(epochs=4, batch_size=32) if reft else TrainConfig(epochs=1, max_steps=15, lr=0.05)
    ctx = StrategyContext(FederationConfig(rounds=1, seed=0, train=train), "mlp", data.input_shape,
                          data.num_classes,
                          public_data=data.x_train[:PUBLIC], options=_options(method, robust))
    strategy = create_strategy(method, ctx)
    private = np.arange(PUBLIC, len(data.y_train)) if reft else np.arange(len(data.y_train))
    shards = [private[s] for s in partition(data.y_train[private], DEVICES, "iid", seed=0)]
    records = []
    for i in range(DEVICES):
        gflops = (100.0 if reft else 50.0) if f"d{i}" in WIDE else (10.0 if reft else 5.0)
        profile = DeviceProfile(name=f"g{gflops:g}", gflops=gflops, ram_mb=4096, cpu_count=4, uplink_mbps=50,
                                downlink_mbps=50)
        record = DeviceRecord(f"d{i}", profile, len(shards[i]))
        record.label = strategy.assign(record)
        records.append(record)
    strategy.begin_stage(0, ("big", "small") if method == "fdnnc" else None)
    received = []
    for record, shard in zip(records, shards):
        plan = strategy.configure_train(0, record)
        update = device_method(plan.method)(plan, LocalData(data.x_train[shard], data.y_train[shard], 10),
                                            DeviceContext(record.device_id, 0, seed=1))
        if record.device_id == "d0" and scale is not None:
            update = Update(update.label, _poison(plan.tensors, update.tensors, scale), update.num_samples,
                            update.metrics)
        strategy.check_update(record, update)
        received.append(ReceivedUpdate(record.device_id, 0, update, 0))
    if len({r.label for r in records}) != 2:
        raise RuntimeError(f"{method}: expected two labels, got {sorted({r.label for r in records})}")
    strategy.aggregate(0, received)
    return strategy


def float_state(strategy) -> dict[str, np.ndarray]:
    """The global float tensors. FDNNC's factors are re-derived from the dense weights by SVD,
    whose signs are arbitrary: the dense weights they come from are compared instead."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in strategy.state_tensors().items()
            if np.asarray(v).dtype.kind == "f" and not k.startswith("factors/")}


def distance(a: dict, b: dict) -> float:
    return math.sqrt(sum(float(np.sum((a[k] - b[k]) ** 2)) for k in a))


def main(argv: list[str] | None = None) -> int:
    from coordinator.core.federation import EvalData
    from edge_sdk.data.datasets import load_dataset

    data = load_dataset("digits")
    print("| method | " + " / ".join(RULES) + " (distance from the honest aggregate, honest steps) |")
    print("| --- | --- |")
    for method in sorted(METHODS):
        start = float_state(poisoned_round(method, data, {"clip": "1e-12"}, None))  # (practically) no step
        honest = float_state(poisoned_round(method, data, PLAIN, None))
        step = distance(honest, start)
        off = [distance(float_state(poisoned_round(method, data, robust, -20.0)), honest) / step
               for robust in RULES.values()]
        print(f"| {method} | " + " / ".join(f"{x:.2f}" for x in off) + " |", flush=True)
    print("\n| REFT teacher | honest | d0 poisoning |\n| --- | --- | --- |")
    teachers = {"mean, no screen": {"aggregate": "mean", **PLAIN}, "mean (default: clip 3x, max_share 0.5)": {},
                "median": {"aggregate": "median"}}
    for name, robust in teachers.items():
        acc = [poisoned_round("reft", data, robust, scale).evaluate(0, EvalData(data.x_test, data.y_test))[0]["global"] for scale in (None, -20.0)]
        print(f"| {name} | {acc[0]:.3f} | {acc[1]:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

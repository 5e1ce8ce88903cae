"""MiniRocket's head trained centrally, dense against FedPara's head folded by kernel (issue 60):
whether the factorisation itself can hold the dense head's accuracy, apart from federated averaging.

    OMP_NUM_THREADS=1 python bench/minirocket_fedpara_central.py --dataset plaid --epochs 150 \\
        dense:0:sgd:0.004 fedpara:0.1:adam:0.005 fedpara:0.1:sgd:0.04

Each run: ``HEAD:GAMMA:OPTIMIZER:LR`` (``dense`` ignores γ), the biases from the training split's statistics
(as `bench/sensor_fedavg.py`'s central run), ``train_local`` on the whole training split (squared loss,
momentum 0.9, batch 32, seed 0, one thread), accuracy on the archive's test split.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.strategies.base import seeded_init  # noqa: E402
from edge_sdk.data.datasets import load_dataset  # noqa: E402
from edge_sdk.models.fedpara_zoo import fedpara_spec  # noqa: E402
from edge_sdk.models.minirocket_biases import fleet_biases, series_statistics  # noqa: E402
from edge_sdk.models.spec import build_model  # noqa: E402
from edge_sdk.models.zoo import model_for_dataset  # noqa: E402
from edge_sdk.train_config import TrainConfig  # noqa: E402
from edge_sdk.training import train_local  # noqa: E402


def run(dataset, head: str, gamma: float, optimizer: str, lr: float, epochs: int, seed: int = 0,
        restarts: int = 1) -> float:
    """The test accuracy of one head trained centrally, its optimizer new ``restarts`` times (as each round's)."""
    with seeded_init(seed):
        spec = model_for_dataset("minirocket", dataset.input_shape, dataset.num_classes) if head == "dense" else \
            fedpara_spec("minirocket", dataset.input_shape, dataset.num_classes, gamma)
        model = build_model(spec)
    layer = model.layers[0]
    stats = series_statistics(layer.plan, dataset.x_train)
    layer.biases.copy_(torch.as_tensor(fleet_biases(layer.plan, stats["shares"], stats["scales"],
                                                    np.ones(layer.plan.channels), seed)))
    for part in range(restarts):
        train_local(model, dataset.x_train, dataset.y_train,
                    TrainConfig(epochs=epochs // restarts, batch_size=32, lr=lr, momentum=0.9, threads=1,
                                loss="squared", optimizer=optimizer), seed=seed * 1000 + part)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(np.ascontiguousarray(dataset.x_test))).argmax(1).numpy()
    return float((predicted == dataset.y_test).mean())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="HEAD:GAMMA:OPTIMIZER:LR", help="e.g. fedpara:0.1:adam:0.005")
    p.add_argument("--dataset", default="plaid")
    p.add_argument("--epochs", type=int, default=150)
    p.add_argument("--restarts", type=int, default=1,
                   help="train in this many equal parts, each with a new optimizer (as a round's local training)")
    args = p.parse_args()
    runs = []
    for text in args.runs:
        parts = text.split(":")
        if len(parts) != 4 or parts[0] not in ("dense", "fedpara") or parts[2] not in ("sgd", "adam"):
            p.error(f"{text!r}: want HEAD:GAMMA:OPTIMIZER:LR, HEAD dense or fedpara, OPTIMIZER sgd or adam")
        runs.append((parts[0], float(parts[1]), parts[2], float(parts[3])))
    torch.set_num_threads(1)
    dataset = load_dataset(args.dataset)
    for head, gamma, optimizer, lr in runs:
        started = time.monotonic()
        accuracy = run(dataset, head, gamma, optimizer, lr, args.epochs, restarts=args.restarts)
        print(f"{head} γ {gamma:g} {optimizer} lr {lr:g}, {args.epochs} epochs, optimizer new {args.restarts}x: "
              f"accuracy {accuracy:.3f} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

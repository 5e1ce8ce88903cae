"""What a second torch thread costs a process: local training before and after another thread
has run a multi-threaded torch operation (why simulated devices hand their rounds to one thread,
coordinator/training_queue.py).

    python bench/bench_torch_threads.py [--threads 2] [--repeats 7]

Every thread that runs a parallel torch operation keeps an OpenMP team of its own; with more
OpenMP threads in the process than cores, libgomp no longer spins between parallel regions.
Prints the median seconds of training cnn4 on 600 images (one epoch, batch 32, SGD) in this
process' main thread: first while it is the only torch thread, then after one other thread ran
one operation with ``--threads`` threads (that thread stays alive, idle, as a simulated device
would), and the ratio. The order matters, since a team once made stays: one process, one run.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
import torch

from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.training import TrainConfig, train_local

__all__ = ["main"]


def _train_seconds(spec: dict, x: np.ndarray, y: np.ndarray, repeats: int) -> float:
    config = TrainConfig(epochs=1, batch_size=32, lr=0.05)
    times = []
    for i in range(repeats + 1):  # the first warms up
        model = build_model(spec)
        start = time.perf_counter()
        train_local(model, x, y, config, seed=i)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.random((600, 1, 28, 28), dtype=np.float32)  # the timing does not depend on the pixels
    y = rng.integers(0, 10, 600)
    spec = model_for_dataset("cnn4", (1, 28, 28), 10)
    alone = _train_seconds(spec, x, y, args.repeats)

    release = threading.Event()

    def other_torch_thread() -> None:
        torch.set_num_threads(args.threads)
        torch.ones(1000, 1000).add_(1.0)  # one parallel region: this thread now has a team
        release.wait()

    other = threading.Thread(target=other_torch_thread, daemon=True)
    other.start()
    time.sleep(0.5)
    shared = _train_seconds(spec, x, y, args.repeats)
    release.set()
    print(f"cnn4, 600 images, 1 epoch, batch 32, {args.threads} torch threads, median of {args.repeats}:")
    print(f"  the only torch thread of the process:        {alone:.3f} s")
    print(f"  after one other thread ran a torch operation: {shared:.3f} s")
    print(f"**training is {shared / alone:.2f}x slower once another thread has run torch**")


if __name__ == "__main__":
    main()

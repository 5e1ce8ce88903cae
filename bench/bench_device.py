"""What the edge SDK costs a device: installed size, import time, and peak memory of a device
process training the default model (cnn4) at each width.

    python bench/bench_device.py [--samples 1000] [--threads 2] [--out bench/results/device.md]

Installed size: the files of every distribution a lean `pip install edgefl` pulls in on this
machine (torch, numpy, paho-mqtt, msgpack and their own requirements), from their RECORDs.
Import time: fresh interpreters, median of 3. Peak memory: one fresh process per width that does
what a device does with the FedAvg plan the coordinator builds for that width (the device process
of bench_memory.py: decode the plan, one local epoch on a private MNIST shard, encode the update),
reporting its peak RSS (VmHWM) after imports and after training.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

from emit import emit  # bench/emit.py (scripts run from bench/)

__all__ = ["dependency_closure", "installed_mb", "import_seconds", "train_peak", "main"]

WIDTHS = (0.25, 0.5, 0.75, 1.0)

def dependency_closure(root: str = "edgefl") -> list[str]:
    """Names of `root` and every distribution its base requirements pull in here (no extras)."""
    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist.metadata["Name"]
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=str.lower)


def installed_mb(names: list[str]) -> dict[str, float]:
    """Installed size in MB of each distribution (sum of the files in its RECORD)."""
    sizes = {}
    for name in names:
        total = 0
        for file in metadata.distribution(name).files or []:
            path = Path(file.locate())
            if path.is_file():
                total += path.stat().st_size
        sizes[name] = total / 1e6
    return sizes


def import_seconds(module: str, runs: int = 3, block_torch: bool = False) -> float:
    """Median wall time to import `module` in a fresh interpreter."""
    code = ("import sys, time\n" + ("sys.modules['torch'] = None\n" if block_torch else "")
            + f"t = time.perf_counter(); import {module}; print(time.perf_counter() - t)")
    return statistics.median(float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                                  text=True, check=True).stdout) for _ in range(runs))


def train_peak(width: float, threads: int, npz: Path, data) -> dict:
    """Peak RSS and timing of a fresh device process training one epoch of cnn4 at `width`."""
    from bench_memory import Case, build_plan, measure

    from edge_sdk.models.spec import count_params
    from edge_sdk.protocol.messages import Envelope, encode_envelope
    from edge_sdk.training import TrainConfig

    plan = build_plan(Case("fedavg", str(width), options={"width": str(width)}), data,
                      TrainConfig(epochs=1, batch_size=32, lr=0.05, threads=threads))
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = Path(tmp) / "plan.bin"
        plan_file.write_bytes(encode_envelope(Envelope.of(plan, "coordinator", 0)))
        figures = measure(str(plan_file), npz, threads, Path(tmp) / "state")
    return {"width": width, "params": count_params(plan.model_spec), **figures}


def _package_kb(package: str) -> float:
    """Size of a package's .py files in kB."""
    import importlib

    root = Path(importlib.import_module(package).__file__).parent
    return sum(f.stat().st_size for f in root.rglob("*.py")) / 1e3


def _load_avg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="private training images per device")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the device's cap)")
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args(argv)

    from edge_sdk.data.datasets import load_dataset

    import torch

    names = dependency_closure()
    sizes = installed_mb(names)
    big = sorted(sizes.items(), key=lambda kv: -kv[1])
    lines = ["# Edge SDK on a device: size, import time, memory",
             "",
             f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads available, "
             f"Python {platform.python_version()}, torch {torch.__version__}; load average at start "
             f"{_load_avg()} (other jobs share this 2-core machine, so times are upper bounds).",
             "",
             "## Installed size (`pip install edgefl`, no extras)",
             "",
             f"{len(names)} distributions, **{sum(sizes.values()):.0f} MB** on disk: "
             + ", ".join(f"{n} {mb:.1f} MB" for n, mb in big[:6]) + ", the rest "
             f"{sum(mb for _, mb in big[6:]):.1f} MB. The `edge_sdk` package itself: "
             f"{_package_kb('edge_sdk'):.0f} kB of Python.",
             "",
             "## Import time (fresh interpreter, median of 3)",
             "",
             "| import | seconds |",
             "| --- | --- |"]
    for module, block in (("edge_sdk.client", False), ("edge_sdk.inference", True), ("torch", False)):
        note = " (torch blocked: `edgefl predict` path)" if block else ""
        lines.append(f"| `{module}`{note} | {import_seconds(module, block_torch=block):.2f} |")
    dataset = load_dataset("mnist-sample")
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "shard.npz"
        np.savez(npz, x=dataset.x_train[:args.samples], y=dataset.y_train[:args.samples])
        rows = [train_peak(w, args.threads, npz, dataset) for w in WIDTHS]
    lines += ["",
              f"## Peak memory of a device process, cnn4 on {args.samples} MNIST images "
              f"(1 epoch, batch 32, {args.threads} threads)",
              "",
              "| width | params | update on the wire MB | RSS after imports MB | peak RSS MB | training adds MB "
              "| epoch s |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['width']} | {r['params']:,} | {r['update_bytes'] / 2**20:.2f} | "
                     f"{r['after_import_mb']:.0f} | {r['peak_mb']:.0f} | {r['peak_mb'] - r['after_import_mb']:.0f} | "
                     f"{r['epoch_s']:.1f} |")
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

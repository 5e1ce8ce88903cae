"""Peak memory of a device process for every method's width/level, the way a device runs it.

    python bench/bench_memory.py [--samples 1000] [--threads 1] [--out bench/results/memory.md]
                                 [--only fedavg,flanc,...]

For each case the coordinator's real strategy builds the plan a device of that label gets in
round 0 (FLANC/HeteroFL widths pinned with ``override``, FedPara γ fixed, FDNNC big/small from
FLOPS thresholds, REFT levels from the device's GFLOPS, P = 1 − F/F_λ). The plan is encoded
exactly as it travels (msgpack frame) into a file. A *fresh* Python process then does what the
device's client does with it: decode the frame, train one local epoch on its private MNIST
shard, encode the update for upload. It reports its peak resident set (VmHWM) after the SDK
imports, after decoding the plan, and at the end. A process that only imports the SDK is the
baseline. OMP_NUM_THREADS and torch threads are capped (``--threads``), as on a device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emit import emit  # bench/emit.py (scripts run from bench/)

__all__ = ["Case", "CASES", "build_plan", "measure", "main"]

_CHILD = r"""
import json, sys, time
from pathlib import Path
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
import numpy as np, torch
from edge_sdk.methods import DeviceContext, LocalData, device_method
from edge_sdk.protocol.messages import Envelope, Update, decode_envelope, encode_envelope

after_import = hwm()
plan_file, npz, state_dir = sys.argv[1], sys.argv[2], sys.argv[3]
if plan_file == "-":
    print(json.dumps({"after_import_mb": after_import, "peak_mb": hwm()}))
    sys.exit(0)
with open(plan_file, "rb") as f:
    plan = decode_envelope(f.read()).body
after_plan = hwm()
with np.load(npz, allow_pickle=False) as f:
    data = LocalData(f["x"], f["y"], 10)
t = time.perf_counter()
update = device_method(plan.method)(plan, data, DeviceContext("bench", 0, seed=0, state_dir=Path(state_dir)))
seconds = time.perf_counter() - t
wire = encode_envelope(Envelope.of(update, "bench", 0))
print(json.dumps({"after_import_mb": after_import, "after_plan_mb": after_plan, "peak_mb": hwm(),
                  "epoch_s": seconds, "update_bytes": len(wire), "label": update.label,
                  "loss": update.metrics.get("loss", float("nan"))}))
"""


@dataclass(frozen=True)
class Case:
    """One method at one width/level: what the strategy is built with and the device it sees."""

    method: str
    label: str  # the label the device must end up with (checked)
    family: str = "cnn4"
    options: dict[str, str] = field(default_factory=dict)
    gflops: float = 50.0
    ram_mb: int = 4096
    note: str = ""


def _reft(level: float) -> Case:
    # P = 1 - F/F_λ with F_λ = 100 GFLOPS; a hair above F so that P rounds to `level`, not past it
    return Case("reft", f"p{level:g}", options={"levels": "0,0.4,0.8,0.9", "backend": "nni"},
                gflops=100.0 * (1.0 - level) + 1e-6, note="then logits on 10 % public images")


CASES: tuple[Case, ...] = (
    Case("fedavg", "global", note="dense cnn4, the baseline"),
    *(Case("flanc", w, options={"override": f"bench:{w}"}) for w in ("0.25", "0.5", "0.75", "1.0")),
    *(Case("heterofl", w, options={"override": f"bench:{w}"}) for w in ("0.25", "0.5", "0.75", "1.0")),
    *(Case("fedpara", "global", options={"gamma": g}, note=f"γ = {g}") for g in ("0.1", "0.3", "0.5")),
    Case("pfedpara", "global", options={"gamma": "0.3"}, note="γ = 0.3, half kept on the device"),
    Case("fdnnc", "big", family="mlp", options={"big_gflops": "20"}, gflops=50.0, note="dense MLP 784-512-256-10"),
    Case("fdnnc", "small", family="mlp", options={"big_gflops": "20"}, gflops=5.0,
         note="SVD rank 32, half upload (default)"),
    *(_reft(level) for level in (0.0, 0.4, 0.8, 0.9)),
)


def _context(case: Case, data, train):
    from coordinator.core.federation import FederationConfig
    from coordinator.strategies.base import StrategyContext

    return StrategyContext(FederationConfig(rounds=1, train=train, publish=False), case.family,
                           tuple(data.input_shape), data.num_classes,
                           public_data=data.x_train[-500:], options=dict(case.options))


def build_plan(case: Case, data, train):
    """The plan the coordinator's strategy sends a device of ``case``'s label in round 0."""
    from edge_sdk.profiling import load_profile

    from coordinator.core.device_record import DeviceRecord
    from coordinator.strategies import create_strategy

    strategy = create_strategy(case.method, _context(case, data, train))
    profile = dataclasses.replace(load_profile("raspberry-pi-4b"), gflops=case.gflops, ram_mb=case.ram_mb)
    record = DeviceRecord("bench", profile, 1000)
    record.label = strategy.assign(record)
    if case.method == "fdnnc":
        strategy.begin_stage(0, ("big", "small"))
    plan = strategy.configure_train(0, record)
    if plan.label != case.label:
        raise RuntimeError(f"{case.method}: expected label {case.label}, the strategy chose {plan.label}")
    return plan


def measure(plan_file: str, npz: Path, threads: int, state_dir: Path) -> dict:
    """Run one fresh device process on an encoded plan ('-': imports only)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", _CHILD, plan_file, str(npz), str(state_dir)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"device process failed on {plan_file}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="private training images per device")
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (the device's cap)")
    parser.add_argument("--only", default="", help="comma-separated methods to run (default: all)")
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args(argv)

    import torch

    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.models.spec import count_params
    from edge_sdk.protocol.messages import Envelope, encode_envelope
    from edge_sdk.training import TrainConfig

    only = {m.strip() for m in args.only.split(",") if m.strip()}
    cases = [c for c in CASES if not only or c.method in only]
    data = load_dataset("mnist-sample")
    train = TrainConfig(epochs=1, batch_size=32, threads=args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "shard.npz"
        np.savez(npz, x=data.x_train[:args.samples], y=data.y_train[:args.samples])
        baseline = measure("-", npz, args.threads, Path(tmp))
        for k, case in enumerate(cases):
            plan = build_plan(case, data, train)
            plan_file = Path(tmp) / f"plan{k}.bin"
            plan_file.write_bytes(encode_envelope(Envelope.of(plan, "coordinator", 0)))
            figures = measure(str(plan_file), npz, args.threads, Path(tmp) / f"state{k}")
            rows.append((case, count_params(plan.model_spec), plan_file.stat().st_size, figures))
            print(f"{case.method:9s} {case.label:7s} {case.note[:30]:30s} peak {figures['peak_mb']:6.0f} MB "
                  f"(+{figures['peak_mb'] - baseline['peak_mb']:.0f} over imports) {figures['epoch_s']:.1f} s",
                  flush=True)
    lines = ["# Peak memory of a device process per method and width/level",
             "",
             f"Machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}; "
             f"{args.samples} private MNIST images, 1 local epoch, batch 32, {args.threads} thread(s). "
             f"Each row is a fresh process: decode the plan the coordinator's strategy built, train, "
             f"encode the update. Baseline (imports only): **{baseline['peak_mb']:.0f} MB**.",
             "",
             "| method | label | model | params on device | plan on the wire kB | update kB | "
             "peak RSS MB | above imports MB | epoch s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case, params, plan_bytes, r in rows:
        model = case.family + (f", {case.note}" if case.note else "")
        lines.append(f"| {case.method} | {case.label} | {model} | {params:,} | {plan_bytes / 1e3:.0f} | "
                     f"{r['update_bytes'] / 1e3:.0f} | {r['peak_mb']:.0f} | "
                     f"{r['peak_mb'] - baseline['peak_mb']:.0f} | {r['epoch_s']:.1f} |")
    emit("\n" + "\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak: what a coordinator writes per model version, over 10,000 versions — report.json,
metrics.csv (appended), devices.csv (appended), the checkpoint and its history.jsonl — timed and
measured as versions accumulate, to show that write time, checkpoint size and memory stay flat.

It drives the coordinator's own persistence path (`RunReport.add_round` + `write`, `save_checkpoint`
with its history, `DeviceCountsFile`) with synthetic round records of a 10-device fleet and a
FLANC-sized state (no broker, no training: those do not grow with versions). Prints one line per
block of versions and the ratio of the last block to the first.

    OMP_NUM_THREADS=1 python bench/version_soak.py --versions 10000 --devices 10 --out /tmp/version-soak
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from coordinator.runtime.device_counts import DeviceCount, DeviceCountsFile
from coordinator.runtime.report import KEEP_ROUNDS, RoundRecord, RunReport
from coordinator.runtime.round_loop import HISTORY_FILE
from coordinator.runtime.state import CHECKPOINT_FILE, save_checkpoint


def _record(rnd: int, devices: list[str], rng: np.random.Generator) -> RoundRecord:
    acc = float(rng.uniform(0.8, 0.95))
    return RoundRecord(round=rnd, accuracy={"0.5": acc, "1.0": acc + 0.01}, loss=0.3, bytes_down=200_000,
                       bytes_up=180_000, seconds=12.0, host_seconds=0.5, participants=devices, aggregated=True,
                       federated_accuracy={"0.5": acc}, federated_loss=0.3,
                       evaluation={"samples": 400, "devices": len(devices), "by_label": {
                           "0.5": {"accuracy": acc, "samples": 400, "devices": len(devices), "low": acc - 0.03,
                                   "high": acc + 0.03, "enough": True}}},
                       version=rnd + 1, published_version=rnd + 1)


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", type=int, default=10_000)
    p.add_argument("--devices", type=int, default=10)
    p.add_argument("--block", type=int, default=1000)
    p.add_argument("--out", default="/tmp/edgefl-version-soak")
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    report_dir, ckpt_dir = out / "report", out / "checkpoint"
    rng = np.random.default_rng(0)
    devices = [f"dev{i:03d}" for i in range(args.devices)]
    state = {f"layer{i}": rng.normal(size=(64, 64)).astype(np.float32) for i in range(8)}  # ~130 kB
    report = RunReport("flanc", {"job": "soak"})
    counts = DeviceCountsFile(report_dir / "devices.csv")
    blocks = []
    started = time.perf_counter()
    for rnd in range(args.versions):
        t0 = time.perf_counter()
        report.add_round(_record(rnd, devices, rng))
        counts.append([DeviceCount(rnd + 1, d, "0.5", 300 + rnd // 10, 80, 70) for d in devices])
        report.write(report_dir, plots=False)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        with open(ckpt_dir / HISTORY_FILE, "a") as fh:
            fh.write(json.dumps(asdict(report.rounds[-1]), separators=(",", ":")) + "\n")
        save_checkpoint(ckpt_dir, "flanc", rnd, report.rounds_as_dicts(), state, {"method": "flanc"},
                        report.rounds_total, report.totals)
        blocks.append(time.perf_counter() - t0)
        if (rnd + 1) % args.block == 0:
            block = blocks[-args.block:]
            print(f"versions {rnd + 2 - args.block:>6}-{rnd + 1:<6} write {1000 * np.median(block):6.2f} ms median "
                  f"(p95 {1000 * np.percentile(block, 95):6.2f})  checkpoint "
                  f"{(ckpt_dir / CHECKPOINT_FILE).stat().st_size / 1e6:6.2f} MB  report.json "
                  f"{(report_dir / 'report.json').stat().st_size / 1e6:5.2f} MB  RSS {_rss_mb():6.1f} MB  "
                  f"appended: metrics {(report_dir / 'metrics.csv').stat().st_size / 1e6:5.1f} MB, history "
                  f"{(ckpt_dir / HISTORY_FILE).stat().st_size / 1e6:5.1f} MB", flush=True)
    # the first block fills the report's window of recent rounds (KEEP_ROUNDS): from the second on it is full
    full, last = blocks[args.block:2 * args.block] or blocks[:args.block], blocks[-args.block:]
    print(f"{args.versions} versions in {time.perf_counter() - started:.0f} s; last block / second block (the "
          f"first with a full window of {KEEP_ROUNDS} rounds): write time {np.median(last) / np.median(full):.2f}x "
          f"(medians)")


if __name__ == "__main__":
    main()

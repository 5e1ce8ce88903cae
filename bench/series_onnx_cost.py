"""Milliseconds a series for the ONNX models of a folder, with nothing but numpy and onnxruntime:
what a device serving them pays, here or under an emulated aarch64 Python
(`deploy/raspberrypi/aarch64_check.sh --onnx DIR`). The folder comes from
``bench/series_model_cost.py --save DIR`` (each model's ``.onnx`` and ``series.npz``, raw PLAID test
series of 134-1,000 values; the resampling to the fitted length is inside each graph).

    python bench/series_onnx_cost.py DIR [--series 50]

Prints the machine, onnxruntime's version, and per model the median and p90 milliseconds a series
(one thread, one series a call, after one warm call) and its ratio to ``cnn1d``'s in the same run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def timed(path: Path, series: list[np.ndarray]) -> list[float]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    session.run(None, {name: series[0][None, None, :]})  # warm
    out = []
    for s in series:
        started = time.perf_counter()
        session.run(None, {name: s[None, None, :]})
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--series", type=int, default=50, help="series timed per model (default %(default)s)")
    args = p.parse_args()
    stored = np.load(args.folder / "series.npz")
    series = [np.ascontiguousarray(stored[k], np.float32) for k in sorted(stored.files, key=lambda k: int(k[1:]))]
    series = series[:args.series]
    print(f"{platform.machine()}, onnxruntime {ort.__version__}, {len(series)} raw series of "
          f"{min(map(len, series))}-{max(map(len, series))} values", flush=True)
    medians = {}
    for path in sorted(args.folder.glob("*.onnx")):
        ms = timed(path, series)
        medians[path.stem] = float(np.median(ms))
        print(f"{path.stem}: {medians[path.stem]:.2f} ms a series (median), p90 {np.percentile(ms, 90):.2f} ms",
              flush=True)
    if "cnn1d" in medians:
        for name, ms in medians.items():
            if name != "cnn1d":
                print(f"{name} / cnn1d: {ms / medians['cnn1d']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a published series model costs a device that serves it: onnxruntime (one thread) on one raw
PLAID test series at a time, MiniRocket (the transform inside the model) against cnn1d, the same
exported way (`export_onnx` with PLAID's preprocessing: any length is resampled inside the graph).

    OMP_NUM_THREADS=1 python bench/series_model_cost.py [--series 200] [--widths 0.25,0.5,0.75,1] [--save DIR]

Prints each model's file size, median and p90 milliseconds a series (the archive's raw lengths,
134-1,000 values), and the ratio MiniRocket / cnn1d measured in the same run; with ``--widths``,
MiniRocket at each width (HeteroFL's: a share of its 84 kernels) as well. ``--save DIR`` keeps the
models and the series (``series.npz``) for ``bench/series_onnx_cost.py`` (e.g. under an emulated
aarch64 Python: ``deploy/raspberrypi/aarch64_check.sh --onnx DIR``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.runtime.export import export_onnx  # noqa: E402
from edge_sdk.data.datasets import load_dataset  # noqa: E402
from edge_sdk.data.sensor_datasets import sensor_files  # noqa: E402
from edge_sdk.data.ts_format import read_ts  # noqa: E402
from edge_sdk.inference import OnnxClassifier  # noqa: E402
from edge_sdk.models.minirocket_biases import fleet_biases, series_statistics  # noqa: E402
from edge_sdk.models.spec import build_model  # noqa: E402
from edge_sdk.models.zoo import model_for_dataset  # noqa: E402


def timed(path: Path, series: list[np.ndarray]) -> list[float]:
    classifier = OnnxClassifier(path, threads=1)
    classifier.predict(series[0][None])  # warm
    out = []
    for s in series:
        started = time.perf_counter()
        classifier.predict(s[None])
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--series", type=int, default=200, help="raw test series timed (default %(default)s)")
    p.add_argument("--widths", default="1", help="minirocket's widths timed (default %(default)s)")
    p.add_argument("--save", type=Path, help="keep the models and the series in this folder")
    args = p.parse_args()
    models = [("cnn1d", 1.0)] + [("minirocket", float(w)) for w in args.widths.split(",")]
    torch.set_num_threads(1)
    dataset = load_dataset("plaid")
    raw = [np.asarray(s, np.float32) for s in read_ts(sensor_files("plaid")[1]).series[:args.series]]
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.save or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        if args.save:
            np.savez(tmp / "series.npz", **{f"s{i}": np.ravel(s) for i, s in enumerate(raw)})
        for family, width in models:
            torch.manual_seed(0)
            model = build_model(model_for_dataset(family, dataset.input_shape, dataset.num_classes,
                                                  width=width)).eval()
            if family == "minirocket":
                layer = model.layers[0]
                stats = series_statistics(layer.plan, dataset.x_train)
                layer.biases.copy_(torch.as_tensor(fleet_biases(layer.plan, stats["shares"], stats["scales"],
                                                                np.ones(1), 0)))
            name = family if width == 1 else f"{family} width {width:g}"
            path = Path(tmp) / f"{name.replace(' ', '-')}.onnx"
            export_onnx(model, path, dataset.x_test[:4], preprocessing=dataset.preprocessing)
            ms = timed(path, raw)
            results[name] = statistics.median(ms)
            print(f"{name}: {path.stat().st_size / 1e6:.2f} MB, {statistics.median(ms):.2f} ms a series (median), "
                  f"p90 {np.percentile(ms, 90):.2f} ms, {len(raw)} raw series of {min(map(len, map(np.ravel, raw)))}"
                  f"-{max(map(len, map(np.ravel, raw)))} values", flush=True)
    for name, ms in results.items():
        if name != "cnn1d":
            print(f"{name} / cnn1d: {ms / results['cnn1d']:.2f}x the time a series")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""sktime's MiniRocket + ridge beside edgefl's MiniRocket layer + the same ridge, on the same splits
(issue 60's peer): which part of a gap is the transform, its biases, the series' representation.

    OMP_NUM_THREADS=1 python bench/minirocket_peer.py --datasets plaid,acsf1,basicmotions --seeds 0,1,2

sktime needs numba, which edgefl's own install does not: the peer runs in a separate venv
(``--peer-venv``, made on first use with ``sktime==1.2.0 numba scikit-learn``; only this bench
uses it). Both sides read the arrays edgefl's loaders give (PLAID as windows of 500 values: a
shorter series repeated, a longer one cut), and for PLAID sktime's variable-length MiniRocket also
runs on the raw series of the archive's files, and edgefl's on series resampled to 300 values (the
loader's way until 2026-11-29). edgefl's side: its `MiniRocket` layer with the biases a fleet fits
(`fleet_biases`: the statistics of all training series, as one device's), with sktime's
choice (`example_biases`: one random training series per combination) and with none at all (what a
job's `[task]` alone could give: white noise's quantiles), each into a ridge
classifier with cross-validated regularisation (scikit-learn's ``RidgeClassifierCV``, alphas
10^-3..10^3, features scaled first: sktime's documented pipeline).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from statistics import NormalDist
from pathlib import Path

import numpy as np

PEER = """
import json, sys, warnings
import numpy as np, sklearn, sktime
warnings.filterwarnings("ignore")
from sklearn.linear_model import RidgeClassifierCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sktime.transformations.panel.rocket import MiniRocketMultivariate, MiniRocketMultivariateVariable
from sktime.datasets import load_from_tsfile
arrays, files, seeds = sys.argv[1], json.loads(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
d = np.load(arrays)
def ridge(ftr, fte):
    clf = make_pipeline(StandardScaler(with_mean=False), RidgeClassifierCV(alphas=np.logspace(-3, 3, 10)))
    return float(clf.fit(ftr, d["y_train"]).score(fte, d["y_test"]))
out = {"versions": {"sktime": sktime.__version__, "sklearn": sklearn.__version__}, "fixed": [], "variable": []}
for seed in seeds:
    t = MiniRocketMultivariate(random_state=seed)
    out["fixed"].append(ridge(t.fit_transform(d["x_train"]), t.transform(d["x_test"])))
    if files:
        (xtr, ytr), (xte, yte) = load_from_tsfile(files[0]), load_from_tsfile(files[1])
        v = MiniRocketMultivariateVariable(random_state=seed, pad_value_short_series=-10.0)
        clf = make_pipeline(StandardScaler(with_mean=False), RidgeClassifierCV(alphas=np.logspace(-3, 3, 10)))
        out["variable"].append(float(clf.fit(v.fit_transform(xtr), ytr).score(v.transform(xte), yte)))
print(json.dumps(out))
"""


def peer_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making the peer's venv in {venv} (sktime 1.2.0, numba, scikit-learn)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "sktime==1.2.0", "numba", "scikit-learn"],
                       check=True)
    return python


def ours(name: str, seeds: list[int]) -> dict[str, list[float]]:
    import torch
    from sklearn.linear_model import RidgeClassifierCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from edge_sdk.data.sensor_datasets import load_sensor_arrays
    from edge_sdk.models.minirocket import MiniRocket, MiniRocketPlan
    from edge_sdk.models.minirocket_biases import example_biases, fleet_biases, series_statistics

    torch.set_num_threads(1)
    xtr, ytr, xte, yte, _ = load_sensor_arrays(name)
    plan = MiniRocketPlan(xtr.shape[1], xtr.shape[2])
    plain = layer = MiniRocket(plan)
    stats = series_statistics(plan, xtr)

    def features(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return np.concatenate([layer(torch.as_tensor(x[i:i + 64])).numpy() for i in range(0, len(x), 64)])

    standardising = MiniRocket(plan, series_norm=True)
    out: dict[str, list[float]] = {"fleet biases": [], "one series per combination": [],
                                   "fleet biases, each series standardised (series_norm)": [],
                                   "no data (white noise's quantiles)": []}
    # biases a job could set from its [task] alone: each combination's quantiles for standardised white noise,
    # through a kernel of six -1 and three 2 (its outputs' std is sqrt(6 + 12)), the same for every seed
    white = np.array([np.sqrt(18.0) * NormalDist().inv_cdf(float(q)) for q in plan.quantiles()], np.float32)
    for seed in seeds:
        for how, biases in (("fleet biases", fleet_biases(plan, stats["shares"], stats["scales"],
                                                          np.ones(plan.channels), seed)),
                            ("no data (white noise's quantiles)", white),
                            ("one series per combination", example_biases(layer, xtr, seed)),
                            ("fleet biases, each series standardised (series_norm)",
                             fleet_biases(plan, stats["shares"], stats["scales"], np.ones(plan.channels), seed, True))):
            layer = standardising if "series_norm" in how else plain
            layer.biases.copy_(torch.as_tensor(biases))
            clf = make_pipeline(StandardScaler(with_mean=False), RidgeClassifierCV(alphas=np.logspace(-3, 3, 10)))
            out[how].append(float(clf.fit(features(xtr), ytr).score(features(xte), yte)))
    return out


def resampled(name: str, length: int, seeds: list[int]) -> list[float]:
    """PLAID's raw series each resampled to ``length`` values (the loader's way before 2026-11-29,
    which stretched each waveform by its own factor); edgefl's MiniRocket with the fleet's biases
    and the ridge: what resampling costs against the loader's windows."""
    import torch
    from sklearn.linear_model import RidgeClassifierCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from edge_sdk.data.sensor_datasets import resample, sensor_files
    from edge_sdk.data.ts_format import read_ts
    from edge_sdk.models.minirocket import MiniRocket, MiniRocketPlan
    from edge_sdk.models.minirocket_biases import fleet_biases, series_statistics

    train, test = (read_ts(f) for f in sensor_files(name))
    xtr, xte = (np.stack([resample(np.asarray(s, np.float32), length) for s in d.series]) for d in (train, test))
    plan = MiniRocketPlan(xtr.shape[1], length)
    layer, stats = MiniRocket(plan), series_statistics(plan, xtr)
    out = []
    for seed in seeds:
        layer.biases.copy_(torch.as_tensor(fleet_biases(plan, stats["shares"], stats["scales"], np.ones(1), seed)))
        with torch.no_grad():
            ftr, fte = (np.concatenate([layer(torch.as_tensor(x[i:i + 64])).numpy() for i in range(0, len(x), 64)])
                        for x in (xtr, xte))
        clf = make_pipeline(StandardScaler(with_mean=False), RidgeClassifierCV(alphas=np.logspace(-3, 3, 10)))
        out.append(float(clf.fit(ftr, train.labels).score(fte, test.labels)))
    return out


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from edge_sdk.data.sensor_datasets import load_sensor_arrays, sensor_files

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="plaid,acsf1,basicmotions")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--peer-venv", type=Path, default=Path("runs/sktime-venv"))
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    python = peer_python(args.peer_venv)
    results = {}
    for name in args.datasets.split(","):
        started = time.monotonic()
        xtr, ytr, xte, yte, _ = load_sensor_arrays(name)
        with tempfile.TemporaryDirectory() as tmp:
            arrays = Path(tmp) / f"{name}.npz"
            np.savez(arrays, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
            files = [str(f) for f in sensor_files(name)] if name == "plaid" else []
            env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
            done = subprocess.run([str(python), "-c", PEER, str(arrays), json.dumps(files), args.seeds], env=env,
                                  capture_output=True, text=True, check=True)
        peer = json.loads(done.stdout.strip().splitlines()[-1])
        results[name] = {"sktime": peer, "edgefl": ours(name, seeds)}
        if name == "plaid":
            results[name]["edgefl"]["fleet biases, series resampled to 300 values (before 2026-11-29)"] = \
                resampled(name, 300, seeds)
        show = {f"sktime MiniRocket ({xtr.shape[2]} values)": peer["fixed"],
                **({"sktime MiniRocket, raw variable lengths": peer["variable"]} if peer["variable"] else {}),
                **{f"edgefl MiniRocket, {how}": accs for how, accs in results[name]["edgefl"].items()}}
        print(f"{name} ({time.monotonic() - started:.0f} s; sktime {peer['versions']['sktime']}, "
              f"scikit-learn {peer['versions']['sklearn']}):")
        for what, accs in show.items():
            print(f"  {what}: {np.mean(accs):.3f} ({', '.join(f'{a:.3f}' for a in accs)})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

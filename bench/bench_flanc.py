"""FLANC vs HeteroFL vs smallest-width FedAvg in the same harness, plus bytes and step cost.

Run: ``python bench/bench_flanc.py`` (defaults: 21 devices = 3 of each of the 7 default
profiles, mnist-sample, ``shards:3``, seed 0, the paper's CNN without norm layers, lr 0.01
as in the paper's CNN script, 2 local epochs, 30 rounds; about 10-15 minutes on a shared
2-core box). ``--norm batchnorm --lr 0.05 --epochs 1 --rounds 25`` is HeteroFL's setting.

(a) accuracy per width after the last round of ``edgefl simulate`` for ``flanc``,
    ``heterofl`` and ``fedavg --option width=<smallest>`` (same partition, seed, fleet,
    training settings and norm), widths assigned from the profiles' measured FLOPS;
(b) MQTT payload bytes per round per device of each width (the plan it downloads and
    the update it uploads, encoded by the real codec) next to the dense network of the
    same width;
(c) one training step (batch 32, one thread) of the composed network against the dense
    network of the same width, median over interleaved repetitions;
(d) ONNX export of every pre-composed FLANC width, onnxruntime vs torch.
Targets: mean FLANC accuracy over the widths >= HeteroFL's + 1 point; FLANC bytes at
p = 1 <= 0.55 x dense p = 1; composed step <= 1.3 x dense step. Exit status 1 if missed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods.settings.options import option_pairs
from simulation.simulate import DEFAULT_FLEET, SimulationConfig, run_simulation, sim_federation
from edge_sdk.models.flanc import flanc_modules
from edge_sdk.models.flanc_zoo import FlancConfig, flanc_specs, width_label
from edge_sdk.models.spec import build_model, count_params
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.protocol.messages import Envelope, Plan, Update, encode_envelope
from edge_sdk.tensors import state_to_numpy
from edge_sdk.training import TrainConfig

WIDTHS = (0.25, 0.5, 0.75, 1.0)


def accuracy_runs(args: argparse.Namespace, out: Path) -> dict[str, dict]:
    """One simulate run per method; returns method -> report dict."""
    common = dict(clients=args.clients, dataset=args.dataset, partition=args.partition,
                  model=args.model, profiles=DEFAULT_FLEET, throttle="off", plots=False,
                  federation=sim_federation(rounds=args.rounds, seed=args.seed,
                                            train=TrainConfig(epochs=args.epochs, batch_size=32, lr=args.lr,
                                                              optimizer=args.optimizer, momentum=args.momentum)))
    norm = {"norm": args.norm}
    runs = {
        "flanc": {**norm, "export": str(out / "onnx"), **option_pairs(args.flanc_option)},
        "heterofl": {**norm, **option_pairs(args.heterofl_option)},
        "fedavg": {**norm, "width": str(WIDTHS[0])},
    }
    runs = {name: (name, options) for name, options in runs.items()}
    for variant in args.variant:  # NAME,METHOD,KEY=VALUE,...
        name, method, *pairs = variant.split(",")
        runs[name] = (method, {**norm, **option_pairs(pairs)})
    reports = {}
    for name, (method, options) in runs.items():
        start = time.perf_counter()
        report = run_simulation(SimulationConfig(method=method, out=str(out / name), job=f"bench-{name}",
                                                 options=options, **common))
        reports[name] = report.to_dict()
        print(f"  {name}: {time.perf_counter() - start:.0f} s, {method} options {options}", flush=True)
    return reports


def print_accuracy(reports: dict[str, dict]) -> tuple[float, float]:
    labels = [width_label(p) for p in WIDTHS]
    print("\n(a) accuracy per width after the last round (held-out real digits)")
    print(f"{'method':<22}" + "".join(f"{'p=' + lab:>9}" for lab in labels) + f"{'mean':>9}  devices per width")
    means = {}
    for method, report in reports.items():
        acc = report["final"]["accuracy"]
        groups = {lab: sum(d["assignment"] == lab for d in report["devices"]) for lab in labels}
        cells = "".join(f"{acc[lab]:>9.3f}" if lab in acc else f"{'-':>9}" for lab in labels)
        means[method] = float(np.mean(list(acc.values())))
        name = method if method != "fedavg" else f"fedavg (p={labels[0]} all)"
        print(f"{name:<22}{cells}{means[method]:>9.3f}  {groups}")
    best = {m: max(float(np.mean(list(r['accuracy'].values()))) for r in rep["rounds"]) for m, rep in reports.items()}
    print("best mean over rounds: " + ", ".join(f"{m} {v:.3f}" for m, v in best.items()))
    return means["flanc"], means["heterofl"]


def _encoded(body: object) -> int:
    return len(encode_envelope(Envelope.of(body, "coordinator", round=0)))


def _task(args: argparse.Namespace) -> tuple[tuple[int, ...], int]:
    """The dataset's sample shape and class count (images 1 x 28 x 28, PLAID's series 1 x 300, ...)."""
    dataset = load_dataset(args.dataset)
    return dataset.input_shape, dataset.num_classes


def bytes_table(args: argparse.Namespace, reports: dict[str, dict] | None) -> float:
    """Per-round bytes of one device per width; returns FLANC/dense at p = 1."""
    norm = None if args.norm == "none" else args.norm
    shape, classes = _task(args)
    specs = flanc_specs(args.model, shape, classes, FlancConfig(WIDTHS), norm=norm)
    train = TrainConfig().to_dict()
    print("\n(b) MQTT payload bytes per round for one device (download plan + upload update)")
    print(f"{'width':>6} {'FLANC params':>13} {'dense params':>13} {'FLANC bytes':>12} {'dense bytes':>12} "
          f"{'ratio':>6} {'measured plan (run)':>20}")
    ratio = float("nan")
    for p in WIDTHS:
        label = width_label(p)
        flanc = build_model(specs[label])
        dense_spec = model_for_dataset(args.model, shape, classes, width=p, norm=norm)
        dense = build_model(dense_spec)
        f_tensors, d_tensors = state_to_numpy(flanc), state_to_numpy(dense)
        f_bytes = (_encoded(Plan("flanc", label, specs[label], f_tensors, train))
                   + _encoded(Update(label, f_tensors, 100, {"loss": 0.0})))
        d_bytes = (_encoded(Plan("fedavg", label, dense_spec, d_tensors, train))
                   + _encoded(Update(label, d_tensors, 100, {"loss": 0.0})))
        measured = reports["flanc"]["models"].get(label, {}).get("payload_bytes", 0) if reports else 0
        ratio = f_bytes / d_bytes
        print(f"{label:>6} {count_params(flanc):>13,} {count_params(dense):>13,} {f_bytes:>12,} {d_bytes:>12,} "
              f"{ratio:>6.2f} {measured:>20,}")
    return ratio


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def step_costs(args: argparse.Namespace) -> float:
    """Median training-step time of composed vs dense per width; returns the worst ratio."""
    torch.set_num_threads(1)
    norm = None if args.norm == "none" else args.norm
    shape, classes = _task(args)
    specs = flanc_specs(args.model, shape, classes, FlancConfig(WIDTHS), norm=norm)
    x, y = torch.randn(32, *shape), torch.randint(0, classes, (32,))
    print("\n(c) one training step, batch 32, 1 thread (median ms over interleaved repetitions)")
    print(f"{'width':>6} {'dense':>8} {'composed':>9} {'ratio':>6} {'two-stage forced':>17}")
    worst = 0.0
    for p in WIDTHS:
        models = {"dense": build_model(model_for_dataset(args.model, shape, classes, width=p, norm=norm)),
                  "auto": build_model(specs[width_label(p)]), "two": build_model(specs[width_label(p)])}
        for _, module in flanc_modules(models["two"]):
            module.precompose = False
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in models.items()}
        times: dict[str, list[float]] = {k: [] for k in models}
        for rep in range(args.step_reps + 3):
            for k, m in models.items():
                t = _step(m, x, y, opts[k])
                if rep >= 3:
                    times[k].append(t)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["auto"] / med["dense"]
        worst = max(worst, ratio)
        print(f"{width_label(p):>6} {med['dense'] * 1e3:>8.2f} {med['auto'] * 1e3:>9.2f} {ratio:>6.2f} "
              f"{med['two'] / med['dense']:>16.2f}x")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=21)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--dataset", default="mnist-sample")
    ap.add_argument("--model", default="cnn4")
    ap.add_argument("--partition", default="shards:3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="the devices' optimizer")
    ap.add_argument("--momentum", type=float, default=TrainConfig.momentum, help="SGD's momentum")
    ap.add_argument("--norm", default="none", choices=["none", "batchnorm", "groupnorm"])
    ap.add_argument("--flanc-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--heterofl-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME,METHOD,KEY=VALUE,...",
                    help="one more run in the accuracy table, e.g. heterofl-he,heterofl,init=he,scaler=false")
    ap.add_argument("--step-reps", type=int, default=40)
    ap.add_argument("--out", default="runs/bench_flanc")
    ap.add_argument("--skip-accuracy", action="store_true", help="only bytes and step cost")
    args = ap.parse_args()
    out = Path(args.out)
    print(f"bench_flanc: {args.clients} devices ({', '.join(DEFAULT_FLEET)} in turn), {args.dataset}, "
          f"{args.partition}, {args.rounds} rounds x {args.epochs} local epoch(s), {args.optimizer} lr {args.lr}, "
          f"batch 32, "
          f"norm {args.norm}, seed {args.seed}, torch {torch.__version__}", flush=True)
    reports, acc_ok = None, True
    if not args.skip_accuracy:
        reports = accuracy_runs(args, out)
        flanc_mean, het_mean = print_accuracy(reports)
        acc_ok = flanc_mean >= het_mean + 0.01
        exported = json.loads((out / "onnx" / "export.json").read_text())
        print("\n(d) ONNX export of the pre-composed FLANC widths (onnxruntime vs torch, 64 inputs)")
        for label, info in exported.items():
            print(f"  p={label}: {info['params']:,} dense params, max |diff| {info['max_abs_diff']:.2e}")
    bytes_ratio = bytes_table(args, reports)
    step_ratio = step_costs(args)
    print("\ntargets")
    if reports is not None:
        print(f"  FLANC mean accuracy >= HeteroFL + 1 point: {flanc_mean:.3f} vs {het_mean:.3f} "
              f"-> {'met' if acc_ok else 'NOT met'}")
    print(f"  FLANC bytes at p=1 <= 0.55 x dense: {bytes_ratio:.2f} -> {'met' if bytes_ratio <= 0.55 else 'NOT met'}")
    print(f"  composed step <= 1.3 x dense (worst width): {step_ratio:.2f} -> "
          f"{'met' if step_ratio <= 1.3 else 'NOT met'}")
    return 0 if acc_ok and bytes_ratio <= 0.55 and step_ratio <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())

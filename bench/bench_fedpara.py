"""FedPara figures: parameter counts, accuracy against bytes per round, pFedPara's local accuracy.

Every federated run is a real job (embedded broker, one MQTT client per device, real
MNIST digits from ``mnist-sample``: 4,000 training / 1,000 test images); bytes are the
MQTT payload bytes the loop measured. Parts (``--part``, each ≤ 15 min on a loaded
2-core machine):

- ``params``: the issue's counts (m = n = 256, R = 16: a FedPara linear layer has 16,384
  parameters, a 3×3 256→256 Proposition-3 conv 20,992) and cnn4's size per γ;
- ``iid`` / ``noniid`` (Dirichlet 0.5): dense FedAvg, FedPara and the naive ``W = X Yᵀ``
  network at equal parameters for γ ∈ {0.1, 0.3, 0.5}; every one with Adam at lr 0.002
  and at 0.005 (``--lrs``, ``--dense-lrs``), the better counts. Accuracy is the mean over the last 3 rounds; bytes
  per round are down + up per device;
- ``pfedpara``: pFedPara vs FedAvg on a 2-classes-per-device split. *Local accuracy*:
  each device's own model (FedAvg: the final global model; pFedPara: the final shared
  W1 with the device's own W2 read from its state directory) on the test images of the
  classes that device holds, averaged over devices. pFedPara devices also report the
  accuracy on a held-out 20 % of their shard (never trained on; FedAvg trains on 100 %).

    python bench/bench_fedpara.py --part params|iid|noniid|pfedpara [--rounds 20] [--clients 8] [--json F]
    python bench/bench_fedpara.py --part plot --json iid.json,noniid.json [--png bench/results/fedpara.png]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import torch

import simulation.simulate as simulate
from coordinator.runtime.broker import EmbeddedBroker
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.strategies.fedpara import FedPara
from coordinator.strategies.fedpara import choose_gamma
from coordinator.core.device_record import DeviceRecord
from coordinator.core.federation import FederationConfig
from coordinator.strategies.base import StrategyContext
from edge_sdk.data.datasets import load_dataset
from edge_sdk.methods.pfedpara import PERSONAL_FILE
from edge_sdk.models.fedpara import FedParaConv2d, FedParaLinear
from edge_sdk.models.fedpara_zoo import fedpara_spec, layer_ranks, naive_lowrank_spec
from edge_sdk.models.spec import count_params
from edge_sdk.models.zoo import model_for_dataset
from edge_sdk.data.partition import partition
from edge_sdk.profiling import load_profile
from edge_sdk.tensors import load_numpy_state
from edge_sdk.training import TrainConfig, evaluate

__all__ = ["main"]

SHAPE = (1, 28, 28)
GAMMAS = (0.1, 0.3, 0.5)
#: Every method runs at each of these Adam learning rates (``--lrs``); the best counts.
LRS = (0.002, 0.005)


def part_params() -> dict[str, Any]:
    linear = sum(p.numel() for p in FedParaLinear(256, 256, rank=16, bias=False).parameters())
    conv = sum(p.numel() for p in FedParaConv2d(256, 256, 3, rank=16, bias=False).parameters())
    print(f"FedPara linear 256x256, R=16: {linear:,} parameters (issue: 16,384)")
    print(f"FedPara conv 3x3 256->256, R=16 (Proposition 3): {conv:,} parameters (issue: 20,992)")
    dense = count_params(model_for_dataset("cnn4", SHAPE, 10))
    print(f"\ncnn4 on 28x28: dense {dense:,} parameters")
    print(f"{'gamma':>6} {'fedpara':>9} {'ranks':>22} {'naive':>9} {'naive ranks':>22} {'dense/fedpara':>14}")
    rows = []
    for g in (0.0, *GAMMAS, 1.0):
        fp, nv = fedpara_spec("cnn4", SHAPE, 10, g), naive_lowrank_spec("cnn4", SHAPE, 10, g)
        rows.append({"gamma": g, "fedpara": count_params(fp), "naive": count_params(nv)})
        print(f"{g:6.1f} {count_params(fp):9,} {str(layer_ranks(fp)):>22} {count_params(nv):9,} "
              f"{str(layer_ranks(nv)):>22} {dense / count_params(fp):14.2f}")
    strategy = FedPara.create(StrategyContext(FederationConfig(), "cnn4", SHAPE, 10))
    fleet = [DeviceRecord(f"d{i}", load_profile(p), 500) for i, p in enumerate(simulate.DEFAULT_FLEET)]
    for d in fleet:
        d.label = strategy.assign(d)
    gamma, info = choose_gamma(fleet, strategy.sent_bytes, 0.1)
    print(f"\ngamma=auto on the default 7-profile fleet, comm_s=0.1: gamma={gamma} "
          f"(slowest transfer {info['worst_transfer_s']:.3f} s)")
    return {"linear": linear, "conv": conv, "cnn4": rows, "auto_gamma": gamma}


def _capture() -> dict[str, Any]:
    """Keep the strategy run_simulation builds (its final weights) and each device's last update."""
    captured: dict[str, Any] = {"last": {}}
    original = simulate.build_strategy

    def build(*args: Any, **kw: Any) -> Any:
        strategy = captured["strategy"] = original(*args, **kw)
        aggregate = strategy.aggregate

        def keep(rnd: int, updates: list, failures: Any = None) -> dict[str, float]:
            captured["last"].update({u.device_id: u.update.tensors for u in updates})
            return aggregate(rnd, updates, failures)

        strategy.aggregate = keep
        return strategy

    simulate.build_strategy = build  # type: ignore[assignment]
    return captured


def _run(args: argparse.Namespace, url: str, tmp: str, method: str, partition_spec: str, lr: float,
         options: dict[str, str], tag: str) -> tuple[dict[str, Any], dict[str, Any], SimulationConfig]:
    captured = _capture()
    config = SimulationConfig(method=method, clients=args.clients, dataset=args.dataset, data_root=args.data_root,
                              model=args.model, partition=partition_spec, out=str(Path(tmp) / tag), broker_url=url,
                              throttle="off", plots=False, job=f"bench-fedpara-{tag}", sim_device=args.sim_device,
                              options=options,
                              federation=sim_federation(rounds=args.rounds, devices_per_round=args.per_round,
                                                        seed=args.seed, round_deadline_s=300,
                                                        train=TrainConfig(epochs=args.epochs, batch_size=32, lr=lr, optimizer="adam", threads=1)))
    started = time.monotonic()
    report = run_simulation(config)
    data = report.to_dict()
    acc_key = "global"
    tail = [r["accuracy"][acc_key] for r in data["rounds"][-3:]]
    per_round = [(r["bytes_down"] + r["bytes_up"]) / max(1, len(r["participants"])) for r in data["rounds"]]
    row = {"tag": tag, "method": method, "lr": lr, "options": options, "params": data["models"][acc_key]["params"],
           "payload_bytes": data["models"][acc_key]["payload_bytes"], "acc": float(np.mean(tail)),
           "final": data["rounds"][-1]["accuracy"][acc_key], "bytes_per_round": float(np.mean(per_round)),
           "curve": [round(r["accuracy"][acc_key], 4) for r in data["rounds"]],
           "rejections": len(data["rejections"]), "seconds": round(time.monotonic() - started, 1)}
    if "local" in data["rounds"][-1]["accuracy"]:
        row["local_holdout"] = data["rounds"][-1]["accuracy"]["local"]
    print(f"{tag:>16} params {row['params']:>7,} payload {row['payload_bytes']:>7,} B  bytes/round/device "
          f"{row['bytes_per_round']:>9,.0f}  acc(last3) {row['acc']:.4f} final {row['final']:.4f}  "
          f"({row['seconds']:.0f} s) curve {row['curve']}", flush=True)
    return row, captured, config


def part_accuracy(args: argparse.Namespace, url: str, tmp: str, split: str) -> dict[str, Any]:
    spec = "iid" if split == "iid" else "dirichlet:0.5"
    print(f"\n== {split}: {args.clients} devices, {args.rounds} rounds x {args.epochs} local epoch(s), "
          f"partition {spec} ==", flush=True)
    rows = [_run(args, url, tmp, "fedavg", spec, lr, {}, f"{split}-dense-{lr}")[0] for lr in args.dense_lrs]
    dense = max(rows, key=lambda r: r["acc"])
    best: dict[str, dict[str, Any]] = {}
    for g in args.gammas:
        for method in ("fedpara", "lowrank"):
            runs = [_run(args, url, tmp, method, spec, lr, {"gamma": str(g), "lr": str(lr)},
                         f"{split}-{method}-{g}-{lr}")[0] for lr in args.lrs]
            rows += runs
            best[f"{method}-{g}"] = max(runs, key=lambda r: r["acc"])
    print(f"\n{split}: baseline dense FedAvg lr {dense['lr']}: acc {dense['acc']:.4f}, "
          f"{dense['bytes_per_round']:,.0f} B/round/device")
    print(f"{'gamma':>6} {'fedpara acc':>12} {'naive acc':>10} {'bytes ratio':>12} {'gap (pts)':>10} "
          f"{'>=3x & <=1.5':>13} {'beats naive':>12}")
    summary = []
    for g in args.gammas:
        fp, nv = best[f"fedpara-{g}"], best[f"lowrank-{g}"]
        ratio, gap = dense["bytes_per_round"] / fp["bytes_per_round"], 100 * (dense["acc"] - fp["acc"])
        ok, beats = ratio >= 3 and gap <= 1.5, fp["acc"] > nv["acc"]
        summary.append({"gamma": g, "ratio": ratio, "gap_points": gap, "target_met": ok, "beats_naive": beats,
                        "fedpara": fp["acc"], "naive": nv["acc"], "fedpara_lr": fp["lr"], "naive_lr": nv["lr"]})
        print(f"{g:6g} {fp['acc']:12.4f} {nv['acc']:10.4f} {ratio:12.2f} {gap:10.2f} {str(ok):>13} {str(beats):>12}"
              f"   (lr: fedpara {fp['lr']}, naive {nv['lr']})")
    return {"runs": rows, "baseline": dense["tag"], "summary": summary}


def _local_accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, classes: list[np.ndarray]) -> list[float]:
    return [evaluate(model, x[np.isin(y, c)], y[np.isin(y, c)])[0] for c in classes]


def part_pfedpara(args: argparse.Namespace, url: str, tmp: str) -> dict[str, Any]:
    print(f"\n== pFedPara vs FedAvg: {args.clients} devices, 2 classes each, {args.rounds} rounds x "
          f"{args.epochs} local epoch(s) ==", flush=True)
    data = load_dataset(args.dataset, root=args.data_root, seed=args.seed)
    shards = partition(data.y_train, args.clients, "shards:2", seed=args.seed)
    classes = [np.unique(data.y_train[s]) for s in shards]
    print("classes per device:", [c.tolist() for c in classes])
    out: dict[str, Any] = {"classes": [c.tolist() for c in classes]}
    x, y = data.x_test, data.y_test
    for method, lr in [("fedavg", lr) for lr in args.dense_lrs] + [("pfedpara", lr) for lr in args.lrs]:
        options = {"gamma": "0.5", "lr": str(lr)} if method == "pfedpara" else {}
        row, captured, config = _run(args, url, tmp, method, "shards:2", lr, options, f"2class-{method}-{lr}")
        strategy, last = captured["strategy"], captured["last"]
        after, start = [], []  # after this device's last local training; with the final global tensors
        trained = [(f"dev{i:03d}", c) for i, c in enumerate(classes) if f"dev{i:03d}" in last]
        for device, c in trained:  # with --per-round some devices may never have been sampled
            if method == "fedavg":
                model = strategy.model
                load_numpy_state(model, strategy.weights)
                start += _local_accuracy(model, x, y, [c])
                load_numpy_state(model, last[device])
                after += _local_accuracy(model, x, y, [c])
                continue
            with np.load(Path(config.out) / "devices" / device / PERSONAL_FILE, allow_pickle=False) as z:
                own = {k: z[k] for k in z.files if not k.startswith("__")}  # this device's W2
            model = strategy.loaded_model("global")  # the final shared W1 (W2 = 0) ...
            load_numpy_state(model, own, strict=False)  # ... with the device's own W2
            start += _local_accuracy(model, x, y, [c])
            load_numpy_state(model, last[device], strict=False)  # the W1 it trained last, with its W2
            after += _local_accuracy(model, x, y, [c])
        row["devices_measured"] = len(trained)
        row["local_global_model"] = float(np.mean(start))
        row["local_after_training"] = float(np.mean(after))
        row["local_per_device"] = {"global": [round(a, 3) for a in start], "after": [round(a, 3) for a in after]}
        print(f"{'':>16} {len(trained)} of {len(classes)} devices trained at least once; their "
              f"local accuracy on the test images of their classes: with the final "
              f"global tensors {row['local_global_model']:.4f}, after the device's last local training "
              f"{row['local_after_training']:.4f}" + (f"; held-out 20 % of shards: {row['local_holdout']:.4f}"
                                                      if "local_holdout" in row else ""), flush=True)
        out[row["tag"]] = row
    fedavg = max((out[f"2class-fedavg-{lr}"] for lr in args.dense_lrs), key=lambda r: r["local_global_model"])
    pfp = max((out[f"2class-pfedpara-{lr}"] for lr in args.lrs), key=lambda r: r["local_after_training"])
    beats = pfp["local_after_training"] > fedavg["local_global_model"]
    print(f"\npFedPara (lr {pfp['lr']}) local accuracy (its personal model after local training) "
          f"{pfp['local_after_training']:.4f} "
          f"vs FedAvg (lr {fedavg['lr']}, global model) {fedavg['local_global_model']:.4f}: beats FedAvg = {beats}")
    print(f"  also: pFedPara with the final global W1 + own W2 {pfp['local_global_model']:.4f}; FedAvg after "
          f"local training (fine-tuned) {fedavg['local_after_training']:.4f}")
    print(f"  bytes/round/device: pFedPara {pfp['bytes_per_round']:,.0f}, FedAvg {fedavg['bytes_per_round']:,.0f} "
          f"({fedavg['bytes_per_round'] / pfp['bytes_per_round']:.1f}x)")
    out["beats_fedavg"] = beats
    return out


def part_plot(inputs: list[str], out: str) -> dict[str, Any]:
    """Accuracy against bytes per round per device, one panel per ``--part iid|noniid`` JSON."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(inputs), figsize=(5.5 * len(inputs), 4), squeeze=False)
    for ax, path in zip(axes[0], inputs):
        best: dict[tuple[str, str], dict[str, Any]] = {}  # the best learning rate of each (method, γ)
        for r in json.loads(Path(path).read_text())["runs"]:
            key = (r["method"], r["options"].get("gamma", ""))
            if key not in best or r["acc"] > best[key]["acc"]:
                best[key] = r
        for method, marker in (("fedavg", "s"), ("fedpara", "o"), ("lowrank", "^")):
            mine = sorted((r for r in best.values() if r["method"] == method), key=lambda r: r["bytes_per_round"])
            ax.plot([r["bytes_per_round"] / 1e3 for r in mine], [100 * r["acc"] for r in mine], marker=marker,
                    label={"fedavg": "dense FedAvg", "fedpara": "FedPara", "lowrank": "naive low-rank"}[method])
            for r in mine:
                if method != "fedavg":
                    ax.annotate(f"γ={r['options']['gamma']}", (r["bytes_per_round"] / 1e3, 100 * r["acc"]),
                                fontsize=7, textcoords="offset points", xytext=(3, -9))
        ax.set(xscale="log", xlabel="MQTT bytes per round per device (kB, down + up)",
               ylabel="test accuracy, mean of last 3 rounds (%)", title=Path(path).stem)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return {"plot": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["params", "iid", "noniid", "pfedpara", "plot"], required=True)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", default="mnist-sample",
                   help="e.g. fashion-mnist (apt-get install dataset-fashion-mnist) for the paper-scale table")
    p.add_argument("--data-root", default=None)
    p.add_argument("--sim-device", default="cpu",
                   help="where the simulated devices train and the model is evaluated: cpu, cuda, cuda:N, auto")
    p.add_argument("--model", default="cnn4", help="model family, e.g. flanc_cnn")
    p.add_argument("--per-round", type=int, default=None, help="devices per round (default: all)")
    p.add_argument("--lrs", default=",".join(map(str, LRS)), help="Adam learning rates of the factorised runs")
    p.add_argument("--dense-lrs", default=",".join(map(str, LRS)), help="Adam learning rates of the dense runs")
    p.add_argument("--gammas", default=",".join(map(str, GAMMAS)), help="γ values of the iid/noniid parts")
    p.add_argument("--json", help="write the figures here (plot: comma-separated iid/noniid JSONs to read)")
    p.add_argument("--png", default="bench/results/fedpara.png", help="plot: the image to write")
    args = p.parse_args()
    args.lrs = [float(v) for v in args.lrs.split(",")]
    args.gammas = [float(v) for v in args.gammas.split(",")]
    args.dense_lrs = [float(v) for v in args.dense_lrs.split(",")]
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # devices are threads of this process; one intra-op thread each
    started = time.monotonic()
    if args.part == "plot":
        part_plot(args.json.split(","), args.png)
        return
    if args.part == "params":
        result = part_params()
    else:
        with TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
            if args.part == "pfedpara":
                result = part_pfedpara(args, broker.url, tmp)
            else:
                result = part_accuracy(args, broker.url, tmp, args.part)
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()

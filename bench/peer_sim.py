"""The same FedAvg job three ways — `edgefl simulate`, Flower 1.42's simulation engine and a bare
torch loop — interleaved A B C per repetition, with what each costs the machine (issue 39).

    # once: Flower in a venv of its own, used by this benchmark only (not an edgefl dependency)
    python3 -m venv /work/flower-venv
    /work/flower-venv/bin/pip install "flwr[simulation]==1.42.0" "torch==2.13.0" numpy

    # from the repository root, in edgefl's venv
    OMP_NUM_THREADS=1 python bench/peer_sim.py --fleets 100x600,1000x60 --rounds 10 --reps 2 \\
        --which edgefl,flower,bare --json out.json
    OMP_NUM_THREADS=1 python bench/peer_sim.py --fleets 10000x6,10000x60 --rounds 10 --reps 1 \\
        --which flower,bare --json out10k.json
    OMP_NUM_THREADS=1 python bench/peer_sim.py --fleets 20x300 --rounds 3 --reps 1   # smoke test

    # edgefl as of one commit while the checkout is being edited: measure an exported tree
    mkdir /work/edgefl-base && git archive HEAD | tar -x -C /work/edgefl-base
    git rev-parse HEAD > /work/edgefl-base/EDGEFL_COMMIT
    OMP_NUM_THREADS=1 python bench/peer_sim.py ... --edgefl-tree /work/edgefl-base

A fleet ``NxM`` is N devices with M Fashion-MNIST training images each: 100x600, 1000x60 and
10000x6 split the 60,000 images IID; 10000x60 splits a 10x tiled copy of them (the same work per
round as 1000x60); a smaller N*M takes the first N*M images. The job: cnn4, SGD lr 0.05, momentum
0.9, batch 32, one local epoch, 10 devices per round, plain sample-weighted FedAvg, one torch
thread, seed 0; the global model is evaluated on the 10,000 test images after the last round only.

What makes the three the same job (the final accuracies agree to the digit when they are):
  * data: the arrays edgefl's ``load_dataset`` gives (normalised with the training set's
    statistics), saved once as .npy and memory-mapped by the peers; the IID split is
    ``edge_sdk.data.partition.partition(y, N, "iid", seed)``, re-implemented here and checked equal;
  * sampling: round r draws ``np.random.default_rng([seed, r]).choice(ids, 10, replace=False)``
    over the sorted device ids ``dev000``... as coordinator/runtime/round_loop.py ``_sample`` does;
  * initial weights: edgefl's FedAvg model (``build_model`` under ``seeded_init(seed)``), exported
    to an .npz the peers load;
  * local training: ``train_local``'s loop (``torch.Generator().manual_seed(s)``, one ``randperm``
    per epoch, SGD with a fresh momentum buffer) with ``s = (seed + device) * 100_003 + round``
    as ``DeviceContext.train`` seeds it;
  * averaging: float64 accumulation of ``w_i * tensors_i`` in the order of the sorted device ids,
    ``w_i = n_i / sum n``, cast to float32 (edgefl's ``weighted_average``; edgefl runs with
    ``--option clip=none --option max_share=1`` so that it averages plainly).
Where they differ: see "Differences" at the end of this docstring.

Columns of the table (median over the repetitions; every run is in the JSON):
  s/round     wall seconds per round in the steady state: the mean of rounds 2..R-1 (round 1 may
              still pay for start-up, e.g. Flower starts its Ray actors while round 1 waits for
              them; round R also evaluates). A round runs from the draw of its devices to the new
              global model. edgefl: the coordinator's own ``host_seconds`` of each round
              (report.json); peers: timestamps they write.
  start-up s  from this script's ``Popen`` of the job's process to the end of round 1, less one
              steady round (s/round): process start, imports, data, broker or Ray, registration,
              and whatever round 1 waited for beyond a steady round. The JSON also has
              ``startup_to_round1_s`` (``Popen`` to the draw of round 1; edgefl: the instant it
              printed "round 1/R" minus round 1's ``host_seconds``).
  shutdown s  from the end of round R (including the final evaluation) until the whole process
              tree has exited (this script is a child subreaper: orphans such as Ray's daemons
              come back to it and are waited for).
  peak PSS MB the largest sum of PSS over the process tree, sampled every 0.5 s (psutil).
  CPU s       user + system seconds of the whole tree: the larger of two lower bounds,
              ``getrusage(RUSAGE_CHILDREN)`` around the run (every process of the tree is reaped
              by its parent or by this script; it misses a process whose parent ignores SIGCHLD)
              and the sum over every process seen of its last sampled CPU seconds (it misses up
              to 0.5 s of each); the JSON has both (``cpu_rusage_s``, ``cpu_sampled_s``).
  runnable, machine
              the largest ``procs_running`` of /proc/stat (the whole machine's runnable tasks,
              this script's sampler and anyone else's work included, every 0.5 s) during start-up
              (``Popen`` to the end of round 1) / during shutdown.
  runnable, tree
              the same for the job alone: the most threads of the process tree in state R
              (/proc/PID/task/TID/stat) at one sample.
  mean runnable, machine
              the mean of the same ``procs_running`` samples over start-up / shutdown: the load
              over that window, which the kernel's load average smooths over a minute (the
              sampler itself is one of them, the machine's idle services about one more).
  load average  the largest 1-minute load average (``os.getloadavg``) sampled during start-up /
              shutdown.
  threads     the most threads the tree had at one sample.
  accuracy    on the 10,000 test images after the last round; test loss: the mean cross-entropy
              there (edgefl: the last round's ``loss`` in report.json), a finer check that the jobs
              are the same. The JSON also has the peers' sha256 of the final weights.
  ratios      against the bare loop and against Flower, from the same repetitions.

Differences between the three (by design or not removable):
  * edgefl sends every plan/update through a real MQTT broker, validates, signs and keeps a state
    folder per device, writes report.json, metrics.csv and plots, and publishes the final model
    as ONNX to every device (all in its shutdown); the peers do none of that;
  * Flower's ServerApp cannot see which node holds which partition (node ids are random and the
    node-to-partition map lives inside the engine), so device i is the node with the i-th
    smallest node id, and the train message names the device whose shard it trains (10 messages,
    10 ClientApp runs per round, as with Flower's own sampling); FedAvg is Flower's
    ``serverapp.strategy.FedAvg`` with ``configure_train`` (edgefl's draw) and
    ``aggregate_train`` (float64, in edgefl's order) overridden, no federated evaluation, and
    the centralised ``evaluate_fn`` after round R only; its Ray backend runs ``num_cpus`` per
    ClientApp as given (default 2: one actor on a 2-core machine);
  * the peers build a plain ``nn.Sequential`` cnn4 (same layers, same state-dict names, checked
    to give the same outputs as edgefl's ``SpecModel``) and skip ``train_local``'s per-step
    checks (finite loss, label range, the loss it reports) and its ``torch.manual_seed`` (cnn4
    draws no random numbers while training);
  * the peers memory-map the saved arrays (one copy in the page cache, shared by Flower's
    actors); edgefl loads the dataset in its process (and once per Ray actor).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
FLOWER_PYTHON = "/work/flower-venv/bin/python"
#: Fashion-MNIST's training images: a fleet of N x M images takes the first N*M (N*M < this) or a
#: tiled copy (a multiple of it).
BASE_IMAGES = 60_000
EVAL_BATCH = 128  # edge_sdk.training.EVAL_BATCH
SAMPLE_EVERY_S = 0.5
WHICH = ("edgefl", "flower", "bare")


# ---------------------------------------------------------------------------------------------
# The job, as the peers run it (this part imports only numpy and torch: Flower's venv loads it)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobSpec:
    """One FedAvg job: the fleet, the training settings and where its arrays lie."""

    clients: int
    per_device: int
    rounds: int
    seed: int = 0
    devices_per_round: int = 10
    lr: float = 0.05
    momentum: float = 0.9
    batch_size: int = 32
    local_epochs: int = 1
    threads: int = 1
    #: folder with x_base.npy, y_train.npy, x_test.npy, y_test.npy (see `prepare_data`)
    data_dir: str = ""
    #: the initial global weights (.npz, state-dict names)
    init_file: str = ""

    @property
    def fleet(self) -> str:
        return f"{self.clients}x{self.per_device}"

    @property
    def total_images(self) -> int:
        return self.clients * self.per_device

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "JobSpec":
        return cls(**json.loads(Path(path).read_text()))


class Cnn4(nn.Module):
    """edgefl's cnn4 for 1x28x28 inputs (edge_sdk/models/zoo.py, no norm layers): the same layers
    at the same indices, so its state dict has the same names as edgefl's ``SpecModel``."""

    def __init__(self, channels: Sequence[int] = (32, 64, 64, 128), num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 1
        for c in channels:  # 28 -> 14 -> 7 -> 3 -> 1
            layers += [nn.Conv2d(cin, c, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)]
            cin = c
        layers += [nn.Flatten(), nn.Linear(cin, num_classes)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def iid_partition(num_samples: int, clients: int, seed: int) -> list[np.ndarray]:
    """``edge_sdk.data.partition.partition(y, clients, "iid", seed)``: a seeded permutation split in
    ``clients`` near-equal parts, each sorted (checked equal by `check_peer_job`)."""
    parts = np.array_split(np.random.default_rng(seed).permutation(num_samples), clients)
    return [np.sort(p).astype(np.int64) for p in parts]


def device_ids(clients: int) -> list[str]:
    """edgefl's simulated device ids (simulation/sim_devices.py ``device_id``), sorted as the
    coordinator's ``Fleet.online`` sorts them (as strings: dev1000 comes before dev101)."""
    return sorted(f"dev{i:03d}" for i in range(clients))


def sample_devices(ids: list[str], seed: int, rnd: int, k: int) -> list[int]:
    """The devices (indices) of 0-based round ``rnd``, drawn as edgefl's round loop draws them,
    in the order of their sorted ids (the order edgefl averages in)."""
    rng = np.random.default_rng([seed, rnd])
    chosen = list(ids) if k >= len(ids) else sorted(rng.choice(ids, size=k, replace=False).tolist())
    return [int(name[3:]) for name in chosen]


def train_seed(job_seed: int, device: int, rnd: int) -> int:
    """``DeviceContext.train``'s seed: the device's seed (job seed + index) * 100_003 + round."""
    return (job_seed + device) * 100_003 + rnd


def train_device(model: nn.Module, x: np.ndarray, y: np.ndarray, job: JobSpec, seed: int) -> int:
    """``edge_sdk.training.train_local``'s SGD loop on ``(x, y)``; returns the sample count."""
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    opt = torch.optim.SGD(list(model.parameters()), lr=job.lr, momentum=job.momentum, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    n = len(xt)
    model.train()
    for _ in range(job.local_epochs):
        order = torch.randperm(n, generator=gen)
        for i in range(0, n, job.batch_size):
            idx = order[i:i + job.batch_size]
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return n


def fold(tensor_sets: Sequence[dict[str, np.ndarray]], counts: Sequence[int]) -> dict[str, np.ndarray]:
    """Sample-weighted mean as edgefl's ``weighted_average``: float64 sums in the given order."""
    w = np.asarray(counts, dtype=np.float64)
    w = w / w.sum()
    out: dict[str, np.ndarray] = {}
    for name in tensor_sets[0]:
        acc = np.zeros(np.shape(tensor_sets[0][name]), dtype=np.float64)
        for tensors, wi in zip(tensor_sets, w, strict=True):
            acc += wi * tensors[name]
        out[name] = acc.astype(np.float32)
    return out


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(top-1 accuracy, mean cross-entropy) in eval mode, batches of 128, as
    ``edge_sdk.training.evaluate`` sums them."""
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), EVAL_BATCH):
            xb = torch.from_numpy(np.ascontiguousarray(x[i:i + EVAL_BATCH], dtype=np.float32))
            yb = torch.from_numpy(np.asarray(y[i:i + EVAL_BATCH], dtype=np.int64))
            logits = model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    return correct / len(y), loss_sum / len(y)


def digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 of the float32 weights in name order: equal digests, bit-identical models."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name], dtype=np.float32).tobytes())
    return h.hexdigest()


class PeerJob:
    """What a peer process holds of a job: memory-mapped arrays, the split and the draws."""

    def __init__(self, job: JobSpec) -> None:
        self.spec = job
        data = Path(job.data_dir)
        self.x_base = np.load(data / "x_base.npy", mmap_mode="r")  # (B, 1, 28, 28) float32
        self.y_train = np.load(data / "y_train.npy", mmap_mode="r")  # (N*M,) int64
        self.shards = iid_partition(len(self.y_train), job.clients, job.seed)
        self.ids = device_ids(job.clients)

    def shard(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """Device ``device``'s images (rows of the tiled set: row j is base image j mod B)."""
        idx = self.shards[device]
        return self.x_base[idx % len(self.x_base)], np.asarray(self.y_train[idx])

    def sample(self, rnd: int) -> list[int]:
        """The devices of 0-based round ``rnd``, in edgefl's order (`sample_devices`)."""
        return sample_devices(self.ids, self.spec.seed, rnd, self.spec.devices_per_round)

    def test_set(self) -> tuple[np.ndarray, np.ndarray]:
        data = Path(self.spec.data_dir)
        return np.load(data / "x_test.npy"), np.load(data / "y_test.npy")

    def initial_state(self) -> dict[str, np.ndarray]:
        with np.load(self.spec.init_file) as npz:
            return {k: npz[k] for k in npz.files}


class Events:
    """Timestamps (``time.monotonic()``, one clock for every process on Linux) a peer writes
    for the driver: ``round_begin``/``round_end`` per round and the final accuracy."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rounds: dict[int, dict[str, float]] = {}
        self.result: dict[str, Any] = {}

    def mark(self, rnd: int, what: str) -> None:
        self.rounds.setdefault(rnd, {})[what] = time.monotonic()

    def write(self) -> None:
        self.path.write_text(json.dumps({"rounds": {str(k): v for k, v in self.rounds.items()},
                                         **self.result}))


def bare_main(job_file: str, events_file: str) -> None:
    """The floor: every round, for each drawn device build cnn4, load the global weights, train
    one epoch, keep its weights; then average. One process, one thread."""
    job = PeerJob(JobSpec.load(job_file))
    torch.set_num_threads(job.spec.threads)
    events = Events(events_file)
    x_test, y_test = job.test_set()
    weights = job.initial_state()
    for rnd in range(job.spec.rounds):
        events.mark(rnd, "round_begin")
        states, counts = [], []
        for device in job.sample(rnd):
            model = Cnn4()
            model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
            x, y = job.shard(device)
            counts.append(train_device(model, x, y, job.spec, train_seed(job.spec.seed, device, rnd)))
            states.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
        weights = fold(states, counts)
        if rnd == job.spec.rounds - 1:
            model = Cnn4()
            model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
            events.result["accuracy"], events.result["test_loss"] = evaluate(model, x_test, y_test)
            events.result["weights_sha256"] = digest(weights)
        events.mark(rnd, "round_end")
    events.write()


# ---------------------------------------------------------------------------------------------
# The driver (edgefl's venv): data and initial weights, the three runs, measuring, the table
# ---------------------------------------------------------------------------------------------

def parse_fleet(text: str) -> tuple[int, int]:
    """``"1000x60"`` -> (1000, 60)."""
    n, _, m = text.lower().partition("x")
    if not (n.isdigit() and m.isdigit()) or int(n) < 1 or int(m) < 1:
        raise argparse.ArgumentTypeError(f"a fleet is DEVICESxIMAGES (e.g. 1000x60), got {text!r}")
    return int(n), int(m)


def edgefl_dataset(total: int, cache: Path) -> str:
    """The ``--dataset`` edgefl gets for a training set of ``total`` images: Fashion-MNIST itself,
    or an npz of its raw images (the first ``total``, or a tiled copy) and its test set."""
    if total == BASE_IMAGES:
        return "fashion-mnist"
    if total > BASE_IMAGES and total % BASE_IMAGES:
        raise ValueError(f"{total} images: use N*M below 60,000 or a multiple of it")
    path = cache / f"fmnist-{total}.npz"
    if not path.exists():
        from edge_sdk.data.datasets import _default_root, _find_idx, read_idx  # raw uint8 idx files
        root = _default_root("fashion-mnist")
        raw = {split: (read_idx(_find_idx(root, f"{split}-images-idx3-ubyte", "fashion-mnist")),
                       read_idx(_find_idx(root, f"{split}-labels-idx1-ubyte", "fashion-mnist")))
               for split in ("train", "t10k")}
        x, y = raw["train"]
        if total < BASE_IMAGES:
            x, y = x[:total], y[:total]
        else:
            x, y = np.tile(x, (total // BASE_IMAGES, 1, 1)), np.tile(y, total // BASE_IMAGES)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, x_train=x, y_train=y, x_test=raw["t10k"][0], y_test=raw["t10k"][1])
        tmp.rename(path)
    return f"npz:{path}"


def prepare_data(total: int, cache: Path) -> Path:
    """The peers' arrays for a training set of ``total`` images, as edgefl's ``load_dataset`` of
    `edgefl_dataset` normalises them: x_base.npy (its distinct images), y_train.npy (every
    label, tiled), x_test.npy, y_test.npy. Written once per size."""
    folder = cache / f"data-{total}"
    if (folder / "y_test.npy").exists():
        return folder
    from edge_sdk.data.datasets import load_dataset
    dataset = load_dataset(edgefl_dataset(total, cache))
    base = min(total, BASE_IMAGES)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x_base.npy", np.ascontiguousarray(dataset.x_train[:base], dtype=np.float32))
    np.save(folder / "y_train.npy", dataset.y_train.astype(np.int64))
    np.save(folder / "x_test.npy", np.ascontiguousarray(dataset.x_test, dtype=np.float32))
    np.save(folder / "y_test.npy", dataset.y_test.astype(np.int64))
    if total > base:  # a tiled copy: row j must be row j mod base
        reps = total // base
        assert np.array_equal(dataset.x_train.reshape(reps, base, -1)[-1],
                              dataset.x_train[:base].reshape(base, -1)), "tiled rows differ"
    return folder


def prepare_job(clients: int, per_device: int, rounds: int, seed: int, cache: Path) -> tuple[JobSpec, Path]:
    """The job's spec file and initial weights (edgefl's FedAvg model for ``seed``)."""
    from coordinator.strategies.base import seeded_init
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import model_for_dataset
    from edge_sdk.tensors import state_to_numpy

    data = prepare_data(clients * per_device, cache)
    init = cache / f"init-cnn4-seed{seed}.npz"
    if not init.exists():
        with seeded_init(seed):  # as FedAvg.__init__ builds its global model
            model = build_model(model_for_dataset("cnn4", (1, 28, 28), 10))
        np.savez(init, **state_to_numpy(model))
    job = JobSpec(clients=clients, per_device=per_device, rounds=rounds, seed=seed,
                  data_dir=str(data), init_file=str(init))
    path = cache / f"job-{job.fleet}-r{rounds}-s{seed}.json"
    job.save(path)
    check_peer_job(job)
    return job, path


def check_peer_job(job: JobSpec) -> None:
    """The peers' split, draws, averaging and model are edgefl's: the partition equals
    ``edge_sdk.data.partition``'s, every round's draw ``RoundLoop._sample``'s, `fold` equals
    ``weighted_average`` bit for bit, and `Cnn4` with the initial weights gives ``SpecModel``'s
    outputs."""
    from types import SimpleNamespace

    from coordinator.aggregate.averaging import weighted_average
    from coordinator.runtime.round_loop import RoundLoop
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import model_for_dataset
    from edge_sdk.data.partition import partition

    peer = PeerJob(job)
    ours = peer.shards
    theirs = partition(np.asarray(peer.y_train), job.clients, "iid", seed=job.seed)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True)), "partition differs"
    assert {len(s) for s in ours} == {job.per_device}, f"shards are not {job.per_device} images each"
    loop = SimpleNamespace(config=SimpleNamespace(devices_per_round=job.devices_per_round))
    for rnd in range(job.rounds):
        drawn = RoundLoop._sample(loop, device_ids(job.clients), np.random.default_rng([job.seed, rnd]))
        assert peer.sample(rnd) == [int(d[3:]) for d in drawn], f"round {rnd + 1}'s draw differs"
    rng = np.random.default_rng(1)
    sets = [{"a": rng.standard_normal(1000).astype(np.float32)} for _ in range(10)]
    counts = rng.integers(1, 100, size=10).tolist()
    assert np.array_equal(fold(sets, counts)["a"], weighted_average(sets, counts)["a"]), "averaging differs"
    state = {k: torch.from_numpy(v) for k, v in peer.initial_state().items()}
    spec_model, cnn = build_model(model_for_dataset("cnn4", (1, 28, 28), 10)), Cnn4()
    spec_model.load_state_dict(state)
    cnn.load_state_dict(state)
    x = torch.from_numpy(np.array(peer.x_base[:64]))
    with torch.no_grad():
        assert torch.equal(spec_model.eval()(x), cnn.eval()(x)), "Cnn4 differs from edgefl's cnn4"


@dataclass
class TreeRun:
    """What one process tree did: timestamps (monotonic), memory, CPU and the machine's load."""

    cmd: list[str]
    t_start: float = 0.0
    t_root_exit: float = 0.0
    t_tree_exit: float = 0.0
    returncode: int | None = None
    peak_pss_mb: float = 0.0
    cpu_s: float = 0.0
    lingering_killed: int = 0
    max_processes: int = 0
    #: CPU seconds of the tree: getrusage(RUSAGE_CHILDREN); the last sampled CPU of every process
    #: seen; the larger of the two (both are lower bounds)
    cpu_rusage_s: float = 0.0
    cpu_sampled_s: float = 0.0
    max_threads: int = 0
    loadavg: tuple[float, float] = (0.0, 0.0)
    #: (t, the machine's 1-minute load average), every 0.5 s
    loadavg_samples: list[tuple[float, float]] = field(default_factory=list)
    #: (t, procs_running of the machine) and (t, threads of the tree in state R), every 0.5 s
    runnable: list[tuple[float, int]] = field(default_factory=list)
    tree_runnable: list[tuple[float, int]] = field(default_factory=list)
    #: (t, "process/thread" names of the tree's threads in state R) at the same samples
    tree_runnable_names: list[tuple[float, list[str]]] = field(default_factory=list)
    #: (t, line) of the merged stdout and stderr
    lines: list[tuple[float, str]] = field(default_factory=list)


def _procs_running() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return -1


def _tree_threads(pids: list[int]) -> tuple[list[str], int]:
    """(the "process/thread" names of the threads in state R, the count of threads) over the
    processes ``pids`` (/proc/PID/task/TID/stat)."""
    running: list[str] = []
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    head, _, rest = f.read().rpartition(")")
                state = rest.split()[0]
            except (OSError, IndexError):
                continue
            total += 1
            if state == "R":
                running.append(f"{pid}/{head.partition('(')[2]}")
    return running, total


def become_subreaper() -> None:
    """Orphaned descendants (Ray's daemons, say) are re-parented to this process, so that they
    stay in the measured tree and are reaped here (their CPU time lands in RUSAGE_CHILDREN)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        print("warning: not a child subreaper: CPU of orphaned processes is not counted", file=sys.stderr)


def run_tree(cmd: list[str], env: dict[str, str], log_file: Path, timeout_s: float,
             linger_s: float = 60.0, cwd: Path = REPO) -> TreeRun:
    """Run ``cmd`` and measure its whole process tree until every process of it has exited."""
    import resource

    import psutil

    me = psutil.Process()
    run = TreeRun(cmd=cmd)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    stop = threading.Event()
    cpu_seen: dict[int, float] = {}

    def sample() -> None:
        while not stop.is_set():
            total, procs = 0, me.children(recursive=True)
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    total += proc.memory_full_info().pss
                    cpu = proc.cpu_times()
                    cpu_seen[proc.pid] = cpu.user + cpu.system
            run.peak_pss_mb = max(run.peak_pss_mb, total / 2**20)
            run.max_processes = max(run.max_processes, len(procs))
            now = time.monotonic()
            run.runnable.append((now, _procs_running()))
            run.loadavg_samples.append((now, os.getloadavg()[0]))
            running, threads = _tree_threads([p.pid for p in procs])
            run.tree_runnable.append((now, len(running)))
            run.tree_runnable_names.append((now, running))
            run.max_threads = max(run.max_threads, threads)
            stop.wait(SAMPLE_EVERY_S)

    load_before = os.getloadavg()[0]
    with open(log_file, "w") as log:
        run.t_start = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                run.lines.append((time.monotonic(), line.rstrip("\n")))
                log.write(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            run.returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            run.returncode = proc.wait()
            log.write(f"\n[peer_sim] killed after {timeout_s} s\n")
        run.t_root_exit = time.monotonic()
        deadline, killed = run.t_root_exit + linger_s, False
        while True:  # orphans come back to this subreaper: wait for them and reap them all (zombies
            _reap()  # left unreaped would leave their CPU seconds out of RUSAGE_CHILDREN)
            left = me.children(recursive=True)
            if not left:
                break
            if time.monotonic() > deadline:
                if killed:  # unkillable: give up on them
                    break
                for p in left:  # processes this run started, by pid
                    with contextlib.suppress(psutil.NoSuchProcess):
                        if p.status() != psutil.STATUS_ZOMBIE:
                            run.lingering_killed += 1
                            p.send_signal(signal.SIGKILL)
                deadline, killed = time.monotonic() + 10.0, True
            time.sleep(0.05)
        run.t_tree_exit = time.monotonic()
        stop.set()
        sampler.join()
        reader.join(timeout=5)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.cpu_rusage_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    run.cpu_sampled_s = sum(cpu_seen.values())
    run.cpu_s = max(run.cpu_rusage_s, run.cpu_sampled_s)
    run.loadavg = (load_before, os.getloadavg()[0])
    return run


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@dataclass
class Measured:
    """One run's figures (None where the run failed or did not say)."""

    which: str
    fleet: str
    rep: int
    ok: bool
    error: str = ""
    s_per_round: float | None = None
    round_s: list[float] = field(default_factory=list)
    last_round_s: float | None = None
    startup_s: float | None = None
    startup_to_round1_s: float | None = None
    shutdown_s: float | None = None
    wall_s: float | None = None
    peak_pss_mb: float | None = None
    cpu_s: float | None = None
    cpu_rusage_s: float | None = None
    cpu_sampled_s: float | None = None
    runnable_startup_max: int | None = None
    runnable_shutdown_max: int | None = None
    runnable_rounds_max: int | None = None
    tree_runnable_startup_max: int | None = None
    tree_runnable_shutdown_max: int | None = None
    #: the mean of the machine's ``procs_running`` samples during start-up / shutdown
    runnable_startup_mean: float | None = None
    runnable_shutdown_mean: float | None = None
    #: the largest 1-minute load average sampled during start-up / shutdown
    loadavg_startup_max: float | None = None
    loadavg_shutdown_max: float | None = None
    #: the threads in state R at the start-up sample with the most of them ("pid/name")
    tree_runnable_startup_names: list[str] = field(default_factory=list)
    threads_max: int | None = None
    accuracy: float | None = None
    #: mean cross-entropy on the test images after the last round (a finer check than accuracy)
    test_loss: float | None = None
    #: sha256 of the final global weights (the peers: Flower and the bare loop must agree)
    weights_sha256: str | None = None
    processes_max: int | None = None
    lingering_killed: int = 0
    #: the machine's 1-minute load average as the run began and ended (others' work included)
    loadavg: tuple[float, float] | None = None
    command: str = ""
    note: str = ""


def _measured(which: str, job: JobSpec, rep: int, run: TreeRun, begins: list[float], ends: list[float],
              final: dict[str, Any], note: str = "") -> Measured:
    m = Measured(which=which, fleet=job.fleet, rep=rep, ok=True, command=" ".join(run.cmd), note=note,
                 wall_s=run.t_tree_exit - run.t_start, peak_pss_mb=run.peak_pss_mb, cpu_s=run.cpu_s,
                 cpu_rusage_s=run.cpu_rusage_s, cpu_sampled_s=run.cpu_sampled_s, processes_max=run.max_processes,
                 lingering_killed=run.lingering_killed, loadavg=run.loadavg, accuracy=final.get("accuracy"),
                 test_loss=final.get("test_loss"), weights_sha256=final.get("weights_sha256"))
    m.round_s = [e - b for b, e in zip(begins, ends, strict=True)]
    m.s_per_round = statistics.fmean(m.round_s[1:-1])
    m.last_round_s = m.round_s[-1]
    m.startup_to_round1_s = begins[0] - run.t_start
    m.startup_s = ends[0] - run.t_start - m.s_per_round
    m.shutdown_s = run.t_tree_exit - ends[-1]

    def peak(samples: Sequence[tuple[float, float]], lo: float, hi: float) -> Any:
        vals = [n for t, n in samples if lo <= t <= hi]
        return max(vals) if vals else None

    def mean(samples: Sequence[tuple[float, float]], lo: float, hi: float) -> float | None:
        vals = [n for t, n in samples if lo <= t <= hi]
        return statistics.fmean(vals) if vals else None

    m.runnable_startup_max = peak(run.runnable, run.t_start, ends[0])
    m.runnable_shutdown_max = peak(run.runnable, ends[-1], run.t_tree_exit)
    m.runnable_rounds_max = peak(run.runnable, ends[0], ends[-1])
    m.tree_runnable_startup_max = peak(run.tree_runnable, run.t_start, ends[0])
    m.tree_runnable_shutdown_max = peak(run.tree_runnable, ends[-1], run.t_tree_exit)
    m.runnable_startup_mean = mean(run.runnable, run.t_start, ends[0])
    m.runnable_shutdown_mean = mean(run.runnable, ends[-1], run.t_tree_exit)
    m.loadavg_startup_max = peak(run.loadavg_samples, run.t_start, ends[0])
    m.loadavg_shutdown_max = peak(run.loadavg_samples, ends[-1], run.t_tree_exit)
    m.tree_runnable_startup_names = max((names for t, names in run.tree_runnable_names if run.t_start <= t <= ends[0]),
                                        key=len, default=[])
    m.threads_max = run.max_threads
    return m


def _failed(which: str, job: JobSpec, rep: int, run: TreeRun, why: str) -> Measured:
    tail = [line for _, line in run.lines if line.strip()][-3:]
    return Measured(which=which, fleet=job.fleet, rep=rep, ok=False, command=" ".join(run.cmd),
                    error=f"{why}; rc {run.returncode}; " + " | ".join(tail)[-600:],
                    wall_s=run.t_tree_exit - run.t_start, peak_pss_mb=run.peak_pss_mb, cpu_s=run.cpu_s,
                    loadavg=run.loadavg)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               FLWR_TELEMETRY_ENABLED="0", RAY_USAGE_STATS_ENABLED="0")
    env.update(extra or {})
    return env


def run_edgefl(job: JobSpec, rep: int, args: argparse.Namespace, work: Path) -> Measured:
    """`edgefl simulate` on the job (``--edgefl-backend auto``: edgefl's own default backend)."""
    backend = args.edgefl_backend
    out = work / f"edgefl-{job.fleet}-{rep}"
    cmd = [sys.executable, "-m", "edge_sdk.cli", "simulate", "--method", "fedavg",
           "--dataset", edgefl_dataset(job.total_images, args.cache), "--clients", str(job.clients),
           "--devices-per-round", str(job.devices_per_round), "--rounds", str(job.rounds),
           "--partition", "iid", "--model", "cnn4", "--lr", str(job.lr), "--momentum", str(job.momentum),
           "--batch-size", str(job.batch_size), "--local-epochs", str(job.local_epochs),
           "--threads", str(job.threads), "--seed", str(job.seed), "--out", str(out),
           "--eval-every", str(job.rounds), "--option", "clip=none", "--option", "max_share=1",
           *(["--backend", backend] if backend != "auto" else [])]
    if args.edgefl_connections is not None:  # an older tree has no such option
        cmd += ["--connections", args.edgefl_connections]
    if args.edgefl_device_processes is not None:  # an older tree has no such option
        cmd += ["--device-processes", str(args.edgefl_device_processes)]
    tree = args.edgefl_tree.resolve()
    run = run_tree(cmd, child_env({"PYTHONPATH": str(tree)}), work / f"edgefl-{job.fleet}-{rep}.log", args.timeout,
                   cwd=tree)
    note = ((f"--backend {backend}" if backend != "auto" else "its default --backend")
            + (f" --connections {args.edgefl_connections}" if args.edgefl_connections else "")
            + (f" --device-processes {args.edgefl_device_processes}" if args.edgefl_device_processes else ""))
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return _failed("edgefl", job, rep, run, "no report.json")
    printed = {}
    for t, line in run.lines:
        head = line.strip().split(":", 1)[0]
        if head.startswith("round ") and "/" in head:
            printed[int(head.split()[1].split("/")[0])] = t
    rounds = report.get("rounds", [])
    if run.returncode != 0 or report.get("status") != "finished" or len(rounds) != job.rounds \
            or len(printed) != job.rounds:
        return _failed("edgefl", job, rep, run, f"status {report.get('status')}, {len(rounds)} rounds")
    host = [r["host_seconds"] for r in rounds]
    ends = [printed[r + 1] for r in range(job.rounds)]
    begins = [e - h for e, h in zip(ends, host, strict=True)]  # the draw of the round's devices
    final = {"accuracy": report.get("final", {}).get("accuracy", {}).get("global"), "test_loss": rounds[-1].get("loss")}
    if isinstance(report.get("config", {}).get("ray"), dict):
        note += f", {len(report['config']['ray'].get('hosts', []) or [])} Ray actors"
    shutil.rmtree(out / "devices", ignore_errors=True)  # one folder per device: not kept
    return _measured("edgefl", job, rep, run, begins, ends, final, note)


def _peer_result(which: str, job: JobSpec, rep: int, run: TreeRun, events_file: Path, note: str) -> Measured:
    try:
        events = json.loads(events_file.read_text())
        rounds = events["rounds"]
        begins = [rounds[str(r)]["round_begin"] for r in range(job.rounds)]
        ends = [rounds[str(r)]["round_end"] for r in range(job.rounds)]
    except (OSError, ValueError, KeyError):
        return _failed(which, job, rep, run, "no round timestamps")
    if run.returncode != 0:
        return _failed(which, job, rep, run, "non-zero exit")
    return _measured(which, job, rep, run, begins, ends, events, note)


def run_flower(job: JobSpec, job_file: Path, rep: int, args: argparse.Namespace, work: Path) -> Measured:
    """Flower 1.42's ``run_simulation`` (Ray backend) on the job (bench/peer_flower_app.py)."""
    events = work / f"flower-{job.fleet}-{rep}.json"
    cmd = [args.flower_python, str(BENCH / "peer_flower_app.py"), "--job", str(job_file),
           "--events", str(events), "--cpus-per-client", str(args.flower_cpus_per_client)]
    run = run_tree(cmd, child_env({"PYTHONPATH": str(BENCH)}), work / f"flower-{job.fleet}-{rep}.log",
                   args.timeout)
    return _peer_result("flower", job, rep, run, events, f"num_cpus {args.flower_cpus_per_client} per ClientApp")


def run_bare(job: JobSpec, job_file: Path, rep: int, args: argparse.Namespace, work: Path) -> Measured:
    """The bare torch loop (`bare_main`) in a process of its own."""
    events = work / f"bare-{job.fleet}-{rep}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--bare-worker", str(job_file), str(events)]
    run = run_tree(cmd, child_env(), work / f"bare-{job.fleet}-{rep}.log", args.timeout)
    return _peer_result("bare", job, rep, run, events, "")


# -- reporting ----------------------------------------------------------------------------------

ROWS = (("s/round", "s_per_round", "{:.2f}"), ("start-up s", "startup_s", "{:.1f}"),
        ("shutdown s", "shutdown_s", "{:.1f}"), ("peak PSS MB", "peak_pss_mb", "{:,.0f}"),
        ("CPU s", "cpu_s", "{:.0f}"), ("runnable start-up, machine", "runnable_startup_max", "{:.0f}"),
        ("runnable shutdown, machine", "runnable_shutdown_max", "{:.0f}"),
        ("runnable start-up, tree", "tree_runnable_startup_max", "{:.0f}"),
        ("runnable shutdown, tree", "tree_runnable_shutdown_max", "{:.0f}"),
        ("mean runnable start-up, machine", "runnable_startup_mean", "{:.1f}"),
        ("mean runnable shutdown, machine", "runnable_shutdown_mean", "{:.1f}"),
        ("load average start-up", "loadavg_startup_max", "{:.1f}"),
        ("load average shutdown", "loadavg_shutdown_max", "{:.1f}"), ("threads", "threads_max", "{:,.0f}"),
        ("accuracy", "accuracy", "{:.4f}"), ("test loss", "test_loss", "{:.6f}"))


def summarise(results: list[Measured]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per fleet and runner: the median of each figure over its successful repetitions."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for m in results:
        out.setdefault(m.fleet, {})
    for fleet in out:
        for which in WHICH:
            runs = [m for m in results if m.fleet == fleet and m.which == which and m.ok]
            if not runs:
                continue
            out[fleet][which] = {key: (statistics.median(v) if (v := [getattr(m, key) for m in runs
                                                                       if getattr(m, key) is not None])
                                       else None)
                                 for _, key, _ in ROWS}
            out[fleet][which]["reps"] = len(runs)
    return out


def table(results: list[Measured], rounds: int) -> str:
    """The markdown table: the three side by side and the ratios."""
    summary = summarise(results)
    lines = ["| fleet | | edgefl | Flower | bare loop | edgefl ÷ Flower | edgefl ÷ bare | Flower ÷ bare |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(fig: dict[str, float | None] | None, key: str, fmt: str) -> str:
        v = None if fig is None else fig.get(key)
        return "—" if v is None else fmt.format(v)

    def ratio(a: dict[str, float | None] | None, b: dict[str, float | None] | None, key: str) -> str:
        x, y = (None if a is None else a.get(key)), (None if b is None else b.get(key))
        return "—" if x is None or not y or key in ("accuracy", "test_loss") else f"{x / y:.2f}"

    for fleet, figs in summary.items():
        e, f, b = figs.get("edgefl"), figs.get("flower"), figs.get("bare")
        reps = max((int(v["reps"] or 0) for v in figs.values()), default=0)
        for i, (label, key, fmt) in enumerate(ROWS):
            head = f"{fleet}, {rounds} rounds ({reps} reps)" if i == 0 else ""
            lines.append(f"| {head} | {label} | {cell(e, key, fmt)} | {cell(f, key, fmt)} | {cell(b, key, fmt)} "
                         f"| {ratio(e, f, key)} | {ratio(e, b, key)} | {ratio(f, b, key)} |")
    failures = [m for m in results if not m.ok]
    for m in failures:
        lines.append(f"\n{m.which} {m.fleet} rep {m.rep} failed: {m.error}")
    return "\n".join(lines)


def versions(flower_python: str) -> dict[str, Any]:
    """Versions of both venvs and a description of the machine."""
    from importlib import metadata
    mine = {name: _version(metadata, name) for name in ("edgefl", "torch", "numpy", "paho-mqtt", "ray", "psutil")}
    probe = ("import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
             "('flwr', 'torch', 'numpy', 'ray', 'protobuf', 'grpcio')}))")
    try:
        flower = json.loads(subprocess.run([flower_python, "-c", probe], capture_output=True, text=True,
                                           timeout=60, check=True).stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        flower = {"error": str(exc)}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"edgefl_venv": {"python": platform.python_version(), **mine}, "flower_venv": flower,
            "machine": {"cpus": os.cpu_count(), "cpu": cpu, "memory_gb": round(mem_gb, 1),
                        "kernel": platform.release(), "loadavg_at_start": os.getloadavg()}}


def tree_version(tree: Path) -> dict[str, Any]:
    """Which edgefl was measured: the tree, its commit and whether it had uncommitted changes."""
    def git(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(tree), *argv], capture_output=True, text=True, check=False)

    head = git("rev-parse", "HEAD")
    if head.returncode == 0 and (tree / ".git").exists():
        dirty = bool(git("status", "--porcelain", "--", "edge_sdk", "coordinator", "simulation").stdout.strip())
        return {"path": str(tree), "commit": head.stdout.strip(), "uncommitted_changes": dirty}
    marker = tree / "EDGEFL_COMMIT"
    return {"path": str(tree), "commit": marker.read_text().strip() if marker.exists() else None,
            "uncommitted_changes": None}


def _version(metadata: Any, name: str) -> str | None:
    try:
        return str(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fleets", default="100x600,1000x60", help="DEVICESxIMAGES,... (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=10, help="rounds per job, at least 3 (default: %(default)s)")
    p.add_argument("--reps", type=int, default=1, help="repetitions of A B C (default: %(default)s)")
    p.add_argument("--which", default=",".join(WHICH), help="any of edgefl,flower,bare (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    p.add_argument("--edgefl-backend", choices=("auto", "local", "process", "ray"), default="auto",
                   help="auto: edgefl's own default (the tree's --backend auto: local up to 1,000 devices, "
                        "process past that; local on trees before it) (default: %(default)s)")
    p.add_argument("--edgefl-device-processes", type=int, metavar="N",
                   help="edgefl's --device-processes (default: not passed, edgefl's own default)")
    p.add_argument("--edgefl-connections", choices=("auto", "own", "shared"),
                   help="edgefl's --connections (default: not given: its own default, auto)")
    p.add_argument("--edgefl-tree", type=Path, default=REPO,
                   help="the edgefl source tree to measure (e.g. a `git archive` of a commit, with its sha in "
                        "EDGEFL_COMMIT), imported before the installed one (default: this checkout)")
    p.add_argument("--flower-python", default=FLOWER_PYTHON, help="the Flower venv's python (default: %(default)s)")
    p.add_argument("--flower-cpus-per-client", type=float, default=2.0,
                   help="Flower's client_resources num_cpus (Flower's default 2) (default: %(default)s)")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "peer_sim_cache",
                   help="arrays, npz datasets and initial weights (default: %(default)s)")
    p.add_argument("--work", type=Path, help="logs and run folders (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    p.add_argument("--bare-worker", nargs=2, metavar=("JOB", "EVENTS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bare_worker:
        bare_main(*args.bare_worker)
        return 0
    which = [w.strip() for w in args.which.split(",") if w.strip()]
    if not which or set(which) - set(WHICH):
        p.error(f"--which takes some of {','.join(WHICH)}")
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (s/round is the mean of rounds 2..R-1)")
    fleets = [parse_fleet(f) for f in args.fleets.split(",") if f.strip()]
    sys.path.insert(0, str(args.edgefl_tree.resolve()))  # the driver prepares data with the measured edgefl
    args.cache.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="peer_sim_"))
    work.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    info = versions(args.flower_python)
    info["edgefl_tree"] = tree_version(args.edgefl_tree.resolve())
    print(f"logs in {work}; {json.dumps(info)}", flush=True)
    results: list[Measured] = []
    for clients, per_device in fleets:
        job, job_file = prepare_job(clients, per_device, args.rounds, args.seed, args.cache)
        for rep in range(args.reps):
            for w in which:
                if w == "edgefl":
                    m = run_edgefl(job, rep, args, work)
                elif w == "flower":
                    m = run_flower(job, job_file, rep, args, work)
                else:
                    m = run_bare(job, job_file, rep, args, work)
                results.append(m)
                print(f"{job.fleet} rep {rep} {w}: {one_line(m)}", flush=True)
                if args.json:
                    _write_json(args.json, info, args, results)
    print()
    print(table(results, args.rounds))
    if args.json:
        _write_json(args.json, info, args, results)
    return 0 if all(m.ok for m in results) else 1


def one_line(m: Measured) -> str:
    """A run's main figures, as it finishes."""
    if not m.ok:
        return f"FAILED {m.error}"
    lo, hi = m.loadavg or (0.0, 0.0)
    return (f"{m.s_per_round:.2f} s/round, start-up {m.startup_s:.1f} s, shutdown {m.shutdown_s:.1f} s, "
            f"peak PSS {m.peak_pss_mb:,.0f} MB, CPU {m.cpu_s:.0f} s, accuracy {m.accuracy}, test loss {m.test_loss}, "
            f"machine load average {lo:.0f} -> {hi:.0f}")


def _write_json(path: Path, info: dict[str, Any], args: argparse.Namespace, results: list[Measured]) -> None:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "bare_worker"}
    path.write_text(json.dumps({"versions": info, "args": settings, "runs": [asdict(m) for m in results],
                                "summary": summarise(results)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())

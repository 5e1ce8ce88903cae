"""REFT's teacher screen, rule by rule, on the logits of real default jobs (issue 56).

    python bench/reft_teacher_screen.py                     # seeds 0-2, IID and shards:3 (~2 minutes)
    python bench/reft_teacher_screen.py --seeds 1 --partitions iid

Runs ``edgefl simulate --method reft --clients 8 --rounds 1`` (every default but a 1-epoch
distillation: the teacher is built before it) in this process, keeps what the devices uploaded
(logits on the public set, class counts, pruning levels), finds the public set's labels (each
public input is a training image: its nearest neighbour in the split), then builds the teacher
with each rule and prints how often its top class is the true one — honest, with the densest
device uploading its logits x -20, and with that device scaled to exactly 3x the longest honest
device's logits (an attacker that knows the default bound). Rules: no screen; the old screen
(centred logits against 3x the round's median norm); the default screen, the longest other
device's logits times K (3, 2, 1); the importance-weighted median; and the importance-weighted
mean of softmax probabilities (T = 1), a bounded-influence alternative not shipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = ["RULES", "capture_job", "main"]

Rule = Callable[[list, np.ndarray], np.ndarray]


def _median_screen(logits: list, counts: np.ndarray) -> np.ndarray:
    """The screen before issue 56: centred logits against 3x the round's median norm."""
    from coordinator.aggregate.robust import reference_norm
    from coordinator.strategies.distillation import capped_importance

    stack = np.stack(logits).astype(np.float64)
    weights = capped_importance(counts, 0.5)
    centred = stack - stack.mean(axis=2, keepdims=True)
    norms = np.sqrt((centred ** 2).sum(axis=(1, 2)))
    scales = np.minimum(1.0, 3.0 * reference_norm(norms) / norms)
    weights = weights * scales[:, None]
    return np.einsum("tnc,tc->nc", centred * scales[:, None, None], weights / weights.sum(axis=0))


def _probability_mean(logits: list, counts: np.ndarray) -> np.ndarray:
    from coordinator.strategies.distillation import capped_importance

    z = np.stack(logits).astype(np.float64)
    p = np.exp(z - z.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    q = np.einsum("tnc,tc->nc", p, capped_importance(counts, 0.5))
    return np.log(np.maximum(q / q.sum(axis=1, keepdims=True), 1e-12))


def _rules() -> dict[str, Rule]:
    from coordinator.strategies.distillation import ensemble_logits

    return {
        "none": lambda z, c: ensemble_logits(z, c, "mean", None, 0.5),
        "median 3x (old)": _median_screen,
        "longest other 3x (default)": lambda z, c: ensemble_logits(z, c, "mean", 3.0, 0.5),
        "longest other 2x": lambda z, c: ensemble_logits(z, c, "mean", 2.0, 0.5),
        "longest other 1x": lambda z, c: ensemble_logits(z, c, "mean", 1.0, 0.5),
        "aggregate=median": lambda z, c: ensemble_logits(z, c, "median", 3.0, 0.5),
        "probability mean": _probability_mean,
    }


RULES = ("none", "median 3x (old)", "longest other 3x (default)", "longest other 2x", "longest other 1x",
         "aggregate=median", "probability mean")


def capture_job(seed: int, partition: str, out: Path) -> dict[str, np.ndarray]:
    """The teacher's inputs of ``edgefl simulate --method reft --clients 8 --rounds 1``, and the labels."""
    import coordinator.strategies.reft as reft
    from edge_sdk.cli import main as edgefl
    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.methods.reft import dequantize_logits

    saved: dict[str, np.ndarray] = {}
    original = reft.Reft.aggregate

    def keep(self, rnd, updates, failures=None):
        saved["logits"] = np.stack([dequantize_logits(u.update.tensors) for u in updates])
        saved["counts"] = np.stack([u.update.tensors["counts"] for u in updates])
        saved["levels"] = np.array([self.levels[u.device_id] for u in updates])
        saved["public_x"] = self.public_x
        return original(self, rnd, updates, failures)

    reft.Reft.aggregate = keep
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            edgefl(["simulate", "--method", "reft", "--clients", "8", "--rounds", "1", "--seed", str(seed),
                    "--partition", partition, "--option", "distill_epochs=1", "--out", str(out)])
    finally:
        reft.Reft.aggregate = original
    train = load_dataset("mnist-sample", seed=seed)
    x = train.x_train.reshape(len(train.x_train), -1)
    p = saved["public_x"].reshape(len(saved["public_x"]), -1)
    nearest = ((p ** 2).sum(1)[:, None] - 2 * p @ x.T + (x ** 2).sum(1)[None]).argmin(axis=1)
    saved["labels"] = train.y_train[nearest]
    return saved


def attacks(logits: np.ndarray, levels: np.ndarray) -> dict[str, np.ndarray]:
    """Honest, the densest device x -20, and that device at exactly 3x the longest honest device."""
    strong = int(np.argmin(levels))
    norms = np.sqrt((logits.astype(np.float64) ** 2).sum(axis=(1, 2)))
    flipped, adaptive = logits.copy(), logits.copy()
    flipped[strong] = -20.0 * logits[strong]
    adaptive[strong] = -3.0 * np.delete(norms, strong).max() / norms[strong] * logits[strong]
    return {"honest": logits, "x -20": flipped, "at 3x the longest honest": adaptive}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--partitions", default="iid,shards:3")
    args = parser.parse_args(argv)
    rules = _rules()
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as work:
        for partition in args.partitions.split(","):
            for seed in map(int, args.seeds.split(",")):
                job = capture_job(seed, partition, Path(work) / f"{seed}-{partition.replace(':', '')}")
                logits = job["logits"].astype(np.float64)
                print(f"{partition} seed {seed}: levels {job['levels'].tolist()}, each device's top class right "
                      f"{[round(float(np.mean(z.argmax(1) == job['labels'])), 2) for z in logits]}", flush=True)
                for attack, zs in attacks(logits, job["levels"]).items():
                    for name in RULES:
                        teacher = rules[name](list(zs), job["counts"])
                        results.setdefault((partition, attack, name), []).append(
                            float(np.mean(teacher.argmax(1) == job["labels"])))
    print("\nteacher's top class right on the public set, seeds " + args.seeds + "\n")
    print("| partition | upload | " + " | ".join(RULES) + " |")
    print("| --- | --- |" + " --- |" * len(RULES))
    for partition in args.partitions.split(","):
        for attack in ("honest", "x -20", "at 3x the longest honest"):
            cells = [" / ".join(f"{a:.2f}" for a in results[(partition, attack, name)]) for name in RULES]
            print(f"| {partition} | {attack} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

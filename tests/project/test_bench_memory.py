"""bench/bench_memory.py keeps working: every case builds the plan it claims, and a device process
measures a real epoch on one of them."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edge_sdk.data.datasets import load_dataset
from edge_sdk.protocol.messages import Envelope, decode_envelope, encode_envelope
from edge_sdk.training import TrainConfig

from tests.support.paths import REPO_ROOT
sys.path.insert(0, str(REPO_ROOT / "bench"))
import bench_memory  # noqa: E402

pytestmark = pytest.mark.slow  # device processes measured for their peak memory


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist-sample")


def test_every_case_gets_the_label_it_measures(mnist) -> None:
    train = TrainConfig(epochs=1, batch_size=32, threads=1)
    seen = set()
    for case in bench_memory.CASES:
        plan = bench_memory.build_plan(case, mnist, train)
        assert plan.method == case.method and plan.label == case.label
        decoded = decode_envelope(encode_envelope(Envelope.of(plan, "coordinator", 0))).body
        assert set(decoded.tensors) == set(plan.tensors)
        seen.add((case.method, case.label, tuple(sorted(case.options.items()))))
    assert len(seen) == len(bench_memory.CASES)  # no two cases measure the same thing


def test_a_device_process_reports_its_peak(mnist, tmp_path) -> None:
    case = next(c for c in bench_memory.CASES if c.method == "fdnnc" and c.label == "small")
    plan = bench_memory.build_plan(case, mnist, TrainConfig(epochs=1, batch_size=32, threads=1))
    plan_file = tmp_path / "plan.bin"
    plan_file.write_bytes(encode_envelope(Envelope.of(plan, "coordinator", 0)))
    npz = tmp_path / "shard.npz"
    np.savez(npz, x=mnist.x_train[:200], y=mnist.y_train[:200])
    figures = bench_memory.measure(str(plan_file), npz, 1, tmp_path / "state")
    assert figures["label"] == "small" and np.isfinite(figures["loss"])
    assert figures["peak_mb"] >= figures["after_plan_mb"] >= figures["after_import_mb"] > 50
    # CEFO (the default half upload): one factor per layer goes back
    assert figures["update_bytes"] < plan_file.stat().st_size

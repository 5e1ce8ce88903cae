"""``[task] mean = "fleet"``: a coordinator without data normalises the job with the devices'
merged statistics (asked before round 1, weighed by the samples it believes), frozen in the
checkpoint; the statistics merge exactly."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from coordinator.runtime.coordinator_command import coordinator_config_from_toml, run_coordinator
from coordinator.runtime.state import load_checkpoint
from edge_sdk.data.channel_moments import ChannelMoments, channel_moments, merge_moments
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.methods import LocalData
from tests.coordinator.test_growing_data import NAMES, _client, _digits, _write


def test_merged_moments_are_the_moments_of_the_union_in_the_raw_scale() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 2.0, (300, 2, 24)).astype(np.float32)
    x[:, 1] *= 10
    parts = [channel_moments(LocalData(x[a:b], np.zeros(b - a, np.int64), 2)) for a, b in ((0, 40), (40, 260),
                                                                                            (260, 300))]
    merged = merge_moments(parts)
    assert merged.count == 300
    np.testing.assert_allclose(merged.mean, x.astype(np.float64).mean(axis=(0, 2)), rtol=1e-9)
    np.testing.assert_allclose(merged.std(), x.astype(np.float64).std(axis=(0, 2)), rtol=1e-9)
    # a device that normalised its data itself is measured in the raw scale all the same
    own = Preprocessing((5.0, 50.0), (2.0, 20.0))
    normalised = LocalData(own.apply(x), np.zeros(300, np.int64), 2, preprocessing=own)
    np.testing.assert_allclose(channel_moments(normalised).mean, merged.mean, rtol=1e-5)
    # a claim of more samples than believed weighs as the believed count, the statistics unchanged
    heavy = ChannelMoments(10_000, (100.0,), (10_000 * 4.0,)).weighed_as(100)
    assert heavy.count == 100 and heavy.std() == pytest.approx((2.0,))


def test_a_coordinator_without_data_normalises_with_the_fleets_statistics(tmp_path, broker) -> None:
    x, y = _digits()
    for i, name in enumerate(("d0", "d1")):
        rows = np.arange(i * 600, i * 600 + 600)
        _write(tmp_path / f"{name}.csv", x[rows], y[rows], start=0)
    (tmp_path / "job.toml").write_text(f"""
method = "fedavg"
job = "growing"
model = "mlp"
out = "{tmp_path / 'report'}"
[broker]
url = "{broker.url}"
[task]
input_shape = [1, 8, 8]
classes = {NAMES!r}
mean = "fleet"
std = "fleet"
[federation]
rounds = 1
min_devices = 2
round_deadline_s = 60
register_timeout_s = 30
checkpoint_dir = "{tmp_path / 'ck'}"
""".replace("'", '"'))
    clients = [_client(tmp_path, broker.url, name, i) for i, name in enumerate(("d0", "d1"))]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    try:
        report = run_coordinator(coordinator_config_from_toml(tmp_path / "job.toml"))
    finally:
        for c in clients:
            c.stop()
        for thread in threads:
            thread.join(timeout=20)
    assert report is not None and report.rounds[0].aggregated
    kept = report.config["normalisation"]
    training = np.concatenate([c.data.x for c in clients]).astype(np.float64)  # what the devices train on
    assert kept["from"] == "fleet"
    assert kept["mean"][0] == pytest.approx(training.mean(), rel=1e-6)
    assert kept["std"][0] == pytest.approx(training.std(), rel=1e-6)
    checkpoint = load_checkpoint(tmp_path / "ck")
    assert checkpoint is not None and checkpoint.job["normalisation"]["mean"] == kept["mean"]


@pytest.mark.parametrize("task, words", [
    ('mean = "fleet"\nstd = [1.0]', 'mean and std are both "fleet"'),
    ('mean = "fleet"\nstd = "fleet"\nnum_classes = 2', 'mean = "fleet" needs input_shape'),
])
def test_fleet_statistics_are_asked_for_in_full_or_not_at_all(tmp_path, task, words) -> None:
    (tmp_path / "c.toml").write_text(f'method = "fedavg"\n[broker]\nurl = "mqtt://127.0.0.1:1"\n[task]\n{task}\n')
    with pytest.raises(ValueError, match=words):
        coordinator_config_from_toml(tmp_path / "c.toml")

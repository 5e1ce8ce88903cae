"""The FLANC paper's protocol on the CLI: every width in every round (``sample=every``), a step
lr decay, interim evaluations on a subset and the last on the whole test set, flips."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from coordinator.strategies.assignment import LevelAssigner
from edge_sdk.methods.settings.shared import AssignmentConfig
from coordinator.core.device_record import DeviceRecord
from coordinator.runtime.fleet import Fleet
from coordinator.core.lr_schedule import lr_factor, parse_lr_decay
from simulation.simulate import SimulationConfig, run_simulation, sim_federation
from coordinator.core.federation import EvalData, FederationConfig
from edge_sdk.data.datasets import load_dataset
from edge_sdk.models.spec import build_model
from edge_sdk.models.zoo import cnn4, mlp
from edge_sdk.profiling import load_profile
from edge_sdk.protocol.messages import Plan
from edge_sdk.training import TrainConfig, train_local
from tests.support.paths import REPO_ROOT

LEVELS = ["0.25", "0.5", "0.75", "1.0"]


def _records(n: int) -> list[DeviceRecord]:
    profile = load_profile("raspberry-pi-4b")
    return [DeviceRecord(device_id=f"dev{i:03d}", profile=profile, num_samples=10) for i in range(n)]


def test_sample_every_puts_every_width_in_every_round_and_repeats_on_resume() -> None:
    assigner = LevelAssigner(AssignmentConfig(sample="every"), LEVELS)
    records = _records(10)
    for record in records:
        assigner.observe(record)
    drawn = []
    for rnd in range(30):
        assigner.draw_round([r.device_id for r in records], rnd, seed=3)
        levels = [assigner.round_level(r, rnd, seed=3) for r in records]
        assert set(levels) == set(LEVELS), f"round {rnd}: {levels}"
        drawn.append(levels)
    assert len({tuple(d) for d in drawn}) > 20  # random, not a fixed pattern
    again = LevelAssigner(AssignmentConfig(sample="every"), LEVELS)  # a resumed coordinator
    for record in records:
        again.observe(record)
    again.draw_round([r.device_id for r in reversed(records)], 7, seed=3)
    assert [again.round_level(r, 7, seed=3) for r in records] == drawn[7]


def test_sample_every_with_fewer_participants_than_widths_repeats_none() -> None:
    assigner = LevelAssigner(AssignmentConfig(sample="every"), LEVELS)
    records = _records(3)
    for rnd in range(10):
        assigner.draw_round([r.device_id for r in records], rnd)
        levels = [assigner.round_level(r, rnd) for r in records]
        assert len(set(levels)) == 3


@pytest.mark.parametrize("text, schedule", [("100:0.1", ((100, 0.1),)), ("", ()),
                                            ("50:0.5, 75:0.1", ((50, 0.5), (75, 0.1)))])
def test_lr_decay_is_parsed(text, schedule) -> None:
    assert parse_lr_decay(text) == schedule


@pytest.mark.parametrize("text, message", [
    ("100", "expected ROUND:FACTOR"), ("a:0.1", "expected ROUND:FACTOR"), ("0:0.1", "round must be"),
    ("10:0", "factor must be"), ("10:nan", "factor must be"), ("20:0.1,10:0.1", "must increase")])
def test_bad_lr_decay_is_a_clear_error(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_lr_decay(text)


def test_lr_factor_compounds_after_each_milestone() -> None:
    decay = ((2, 0.1), (4, 0.5))
    assert [lr_factor(decay, r) for r in range(6)] == pytest.approx([1, 1, 0.1, 0.1, 0.05, 0.05])
    assert FederationConfig(lr_decay="100:0.1").lr_decay == ((100, 0.1),)  # the coordinator TOML's string


def test_the_stratified_subset_keeps_class_proportions() -> None:
    y = np.repeat(np.arange(10), [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000])
    data = EvalData(np.arange(len(y))[:, None].astype(np.float32), y)
    sub = data.stratified(550, seed=0)
    assert len(sub.y) == 550
    assert np.bincount(sub.y, minlength=10).tolist() == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert np.array_equal(sub.y, y[sub.x[:, 0].astype(int)])  # inputs stay with their labels
    assert np.array_equal(data.stratified(550, seed=0).x, sub.x)


def test_a_flanc_job_with_the_papers_protocol(tmp_path, broker, monkeypatch) -> None:
    sent: list[tuple[int, str, float]] = []
    real_send = Fleet.send

    def recording_send(self, device_id, body, rnd=-1, **kw):
        if isinstance(body, Plan):
            sent.append((rnd, body.label, body.train["lr"], body.train["augment"]))
        return real_send(self, device_id, body, rnd, **kw)

    monkeypatch.setattr(Fleet, "send", recording_send)
    config = SimulationConfig(method="flanc", clients=8, dataset="digits", model="mlp", out=str(tmp_path),
                              broker_url=broker.url, job="paper-protocol", plots=False, options={"sample": "every"},
                              federation=sim_federation(rounds=3, devices_per_round=5, lr_decay=((2, 0.1),),
                                                        eval_samples=60,
                                                        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, augment="hflip")))
    report = run_simulation(config)
    for rnd in range(3):
        plans = [s for s in sent if s[0] == rnd]
        assert len(plans) == 5 and {label for _, label, _, _ in plans} == set(LEVELS)
        assert [lr for _, _, lr, _ in plans] == pytest.approx([0.05 if rnd < 2 else 0.005] * 5)
    assert {aug for *_, aug in sent} == {"hflip"}
    held_out = len(load_dataset("digits", seed=0).y_test)
    assert held_out > 300 and [r.metrics["eval_samples"] for r in report.rounds] == [60, 60, held_out]
    assert json.loads((tmp_path / "report.json").read_text())["config"]["federation"]["lr_decay"] == [[2, 0.1]]


def test_hflip_mirrors_a_random_half_of_each_batch() -> None:
    x = np.random.default_rng(0).normal(size=(64, 1, 8, 8)).astype(np.float32)
    y = np.arange(64) % 10
    spec = cnn4(1, 10, 8, channels=(4, 4, 4, 4))
    seen: list[torch.Tensor] = []

    def trained(augment: str) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = build_model(spec)
        model.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
        train_local(model, x, y, TrainConfig(epochs=1, batch_size=64, lr=0.1, augment=augment), seed=1)
        return {k: v.clone() for k, v in model.state_dict().items()}

    plain = trained("none")
    assert {tuple(r.flatten().tolist()) for r in seen[-1]} == {tuple(r.flatten().tolist()) for r in torch.from_numpy(x)}
    flipped = trained("hflip")
    batch = seen[-1]
    originals = {tuple(row.flatten().tolist()) for row in torch.from_numpy(x)}
    mirrored = sum(tuple(row.flatten().tolist()) not in originals for row in batch)
    assert 16 <= mirrored <= 48  # about half of the 64, each a left-right mirror of a sample
    mirrors = {tuple(row.flip(-1).flatten().tolist()) for row in torch.from_numpy(x)}
    assert all(tuple(r.flatten().tolist()) in originals | mirrors for r in batch)
    assert any(not torch.equal(plain[k], flipped[k]) for k in plain)
    with pytest.raises(ValueError, match="hflip' needs N x C x H x W images"):
        train_local(build_model(mlp(4, 2)), x[:, 0, 0, :4].copy(), y % 2, TrainConfig(augment="hflip"))
    with pytest.raises(ValueError, match="augment must be one of"):
        TrainConfig(augment="rotate")


def test_the_cli_rejects_a_bad_lr_decay_in_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "simulate", "--lr-decay", "100"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "argument --lr-decay: expected ROUND:FACTOR (e.g. 100:0.1), got '100'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_coordinator_toml_takes_the_protocol(tmp_path) -> None:
    from coordinator.runtime.coordinator_command import coordinator_config_from_toml

    path = tmp_path / "coordinator.toml"
    path.write_text('dataset = "digits"\n[federation]\nrounds = 200\ndevices_per_round = 10\neval_every = 10\n'
                    'eval_samples = 2000\nlr_decay = "100:0.1"\n')
    federation = coordinator_config_from_toml(path).federation
    assert (federation.lr_decay, federation.eval_samples, federation.devices_per_round) == (((100, 0.1),), 2000, 10)
    path.write_text('dataset = "digits"\n[federation]\nlr_decay = "100"\n')
    with pytest.raises(ValueError, match="expected ROUND:FACTOR"):
        coordinator_config_from_toml(path)


@pytest.mark.slow
def test_a_simulation_resumes_from_its_checkpoint(tmp_path, broker) -> None:
    base = dict(method="flanc", clients=4, dataset="digits", model="mlp", broker_url=broker.url, plots=False,
                options={"sample": "every"})
    job = dict(checkpoint_dir=str(tmp_path / "ckpt"), train=TrainConfig(epochs=1, batch_size=32, lr=0.05))
    first = run_simulation(SimulationConfig(out=str(tmp_path / "a"), job="resume-a", **base,
                                            federation=sim_federation(rounds=2, **job)))
    assert (tmp_path / "ckpt" / "simulation.json").exists()
    longer = run_simulation(SimulationConfig(out=str(tmp_path / "b"), job="resume-b", **base,
                                             federation=sim_federation(rounds=3, **job)))
    assert len(longer.rounds) == 3
    assert [r.accuracy for r in longer.rounds[:2]] == [r.accuracy for r in first.rounds]  # restored, not retrained
    assert longer.rounds[2].accuracy and longer.rounds[2].participants
    with pytest.raises(ValueError, match=r"another job \(train was .* use another --checkpoint-dir"):
        run_simulation(SimulationConfig(out=str(tmp_path / "c"), job="resume-c", **base, federation=sim_federation(
            rounds=4, **{**job, "train": TrainConfig(epochs=1, batch_size=32, lr=0.01)})))
    # how many torch threads train is where the job runs, not what it is: a resume may change it
    threads = run_simulation(SimulationConfig(out=str(tmp_path / "d"), job="resume-d", **base,
                                              federation=sim_federation(rounds=4, **{**job, "train": TrainConfig(
                                                  epochs=1, batch_size=32, lr=0.05, threads=1)})))
    assert len(threads.rounds) == 4 and threads.rounds[2].accuracy == longer.rounds[2].accuracy


def _paper_bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_fmnist", REPO_ROOT / "bench" / "paper_fmnist.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_static_fleet_of_the_paper_bench_puts_a_quarter_of_the_devices_on_each_width() -> None:
    from coordinator.strategies.assignment import assign_levels

    bench = _paper_bench()
    fleet = bench.STATIC_FLEET
    gflops = {f"dev{i:03d}": load_profile(fleet[i % len(fleet)]).gflops for i in range(100)}
    labels = assign_levels(gflops, LEVELS, mode="cluster")
    assert sorted(np.unique(list(labels.values()), return_counts=True)[1].tolist()) == [25, 25, 25, 25]


def test_the_paper_bench_can_normalise_images_as_the_official_code() -> None:
    from edge_sdk.data.datasets import ImageDataset

    raw = np.array([0.0, 51.0, 255.0], dtype=np.float64)  # pixels
    mean, std = 72.9, 90.0
    x = ((raw - mean) / std).astype(np.float32).reshape(3, 1, 1, 1)
    y = np.zeros(3, dtype=np.int64)
    data = ImageDataset("toy", x, y, x.copy(), y, 1, mean=(mean,), std=(std,))
    official = _paper_bench().normalise_as_official(lambda *a, **k: data)("toy")
    expected = (raw / 255.0 - 0.1307) / 0.3081
    assert official.x_train.ravel() == pytest.approx(expected, abs=1e-5)
    assert official.x_test.dtype == np.float32 and official.y_train is data.y_train

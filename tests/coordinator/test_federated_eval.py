"""Federated evaluation: devices evaluate the model they would be served on their held-out data;
the coordinator adds up their counts per label, bounds what one device weighs, and never waits
for one that does not answer past the deadline."""

from __future__ import annotations

import csv
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from coordinator.aggregate.evaluation import fold_evaluations
from coordinator.runtime.round_loop import EVAL_SAMPLES_FLOOR, EVAL_SAMPLES_PER_TRAINING, RoundLoop
from edge_sdk.protocol.messages import Evaluate, Evaluation, Plan
from tests.coordinator.test_fleet_rejects import DEVICE, Peer, setup  # noqa: F401  (the fixture)


def test_counts_add_up_per_label_weighted_by_samples() -> None:
    reports = {
        "a": Evaluation("0.5", 100, 90, 30.0, (50, 50), (45, 45)),
        "b": Evaluation("0.5", 300, 150, 90.0, (100, 200), (100, 50)),
        "c": Evaluation("1.0", 50, 40, 10.0, (25, 25), (20, 20)),
        "d": Evaluation("1.0", 0, 0, 0.0, reason="too little data"),
    }
    result = fold_evaluations(reports, missing=["e"])
    assert result.accuracy == {"0.5": pytest.approx(240 / 400), "1.0": pytest.approx(40 / 50)}
    assert result.accuracy_all == pytest.approx(280 / 450)
    assert result.loss == pytest.approx(130 / 450)
    assert result.samples == 450 and result.by_device == {"a": 0.9, "b": 0.5, "c": 0.8}
    assert result.per_class["0.5"] == [pytest.approx(145 / 150), pytest.approx(95 / 250)]
    assert result.no_evaluation == {"d": "too little data"} and result.missing == ["e"]
    summary = result.summary()
    assert (summary["devices"], summary["no_evaluation"], summary["missing"]) == (3, 1, 1)
    assert summary["no_evaluation_reasons"] == ["too little data"]


def test_nobody_evaluated_gives_no_accuracy() -> None:
    result = fold_evaluations({"a": Evaluation("g", 0, 0, 0.0, reason="no data")})
    assert result.accuracy == {} and result.accuracy_all is None and result.loss is None


def _loop_check(strategy, fleet, per_class=False):
    from dataclasses import replace
    strategy.config = replace(strategy.config, eval_per_class=per_class)
    loop = RoundLoop(strategy, fleet, report=None)  # type: ignore[arg-type]
    return loop._evaluation_check({DEVICE: "global"})


@pytest.mark.parametrize("evaluation, code", [
    (Evaluation("0.5", 10, 5, 1.0), "wrong_label"),
    (Evaluation("global", max(EVAL_SAMPLES_FLOOR, EVAL_SAMPLES_PER_TRAINING * 50) + 1, 5, 1.0), "bad_evaluation"),
    (Evaluation("global", 10, 5, 1.0, (5, 5, 0), (2, 3, 0)), "bad_evaluation"),  # class counts not asked for
])
def test_a_bad_evaluation_is_refused_and_never_counted(setup, evaluation, code) -> None:  # noqa: F811
    strategy, fleet, peer = setup
    check = _loop_check(strategy, fleet)
    result: dict = {}
    collector = threading.Thread(target=lambda: result.update(
        r=fleet.collect_evaluations(0, [DEVICE], 10.0, check)))
    collector.start()
    time.sleep(0.2)
    msg_id = peer.send(evaluation, rnd=0)
    reply = peer.reply()
    assert reply.body.code == code and reply.reply_to == msg_id
    ok = Evaluation("global", 20, 15, 4.0)
    peer.send(ok, rnd=0)
    collector.join(10)
    assert result["r"].reports == {DEVICE: ok} and result["r"].missing == []
    assert fleet.devices[DEVICE].last_evaluation == (0, 20, 15, "global")


def test_an_evaluation_outside_an_evaluation_is_refused(setup) -> None:  # noqa: F811
    strategy, fleet, peer = setup
    result: dict = {}
    collector = threading.Thread(target=lambda: result.update(
        r=fleet.collect(0, [DEVICE], 3.0, strategy.check_update)))
    collector.start()
    time.sleep(0.2)
    peer.send(Evaluation("global", 20, 15, 4.0), rnd=0)  # while updates are collected
    assert peer.reply().body.code == "wrong_round"
    collector.join(10)


def test_a_device_that_does_not_answer_is_counted_not_waited_for(setup) -> None:  # noqa: F811
    strategy, fleet, peer = setup
    started = time.monotonic()
    collected = fleet.collect_evaluations(0, [DEVICE], 1.0, _loop_check(strategy, fleet))
    assert time.monotonic() - started < 3.0
    assert collected.reports == {} and collected.missing == [DEVICE]


def test_the_evaluate_message_carries_the_model_a_plan_would() -> None:
    plan = Plan("fedavg", "global", {"layers": []}, {"w": np.ones(2, np.float32)}, {"lr": 0.1}, {"mean": [0.0],
                                                                                              "std": [1.0]})
    request = Evaluate.of(plan, per_class=True)
    back = request.as_plan()
    assert (back.method, back.label, back.train, back.preprocessing) == ("fedavg", "global", {"lr": 0.1},
                                                                         plan.preprocessing)
    assert request.per_class


def test_a_device_counts_the_published_baseline_on_the_same_samples() -> None:
    from sklearn.datasets import load_digits

    from coordinator.core.device_record import DeviceRecord
    from coordinator.core.federation import FederationConfig
    from coordinator.runtime.continuous import against_baseline
    from coordinator.strategies.base import StrategyContext
    from coordinator.strategies.fedavg import FedAvg
    from edge_sdk.evaluation import evaluate_holdout
    from edge_sdk.methods.base import DeviceContext, LocalData
    from edge_sdk.profiling import load_profile

    digits = load_digits()
    held_out = LocalData(((digits.data[:300] - 4.88) / 6.02).astype(np.float32).reshape(-1, 1, 8, 8),
                         digits.target[:300].astype(np.int64), 10)
    device = DeviceRecord("d0", load_profile("raspberry-pi-4b"), 100)
    plans = [FedAvg.create(StrategyContext(FederationConfig(seed=seed), "mlp", (1, 8, 8), 10))
             .configure_evaluate(0, device) for seed in (0, 1)]
    ctx = DeviceContext("d0", 0)
    alone = [evaluate_holdout(Evaluate.of(plan), held_out, ctx) for plan in plans]
    both = evaluate_holdout(Evaluate.of(plans[0], baseline=plans[1].tensors), held_out, ctx)
    assert alone[0].correct != alone[1].correct  # two different models, so the test can tell them apart
    assert (both.num_samples, both.correct, both.baseline_correct) == (300, alone[0].correct, alone[1].correct)
    assert alone[0].baseline_correct == -1
    pooled = against_baseline({"d0": both, "d1": alone[1]}, {"d0", "d1"}, 3)  # d1 could not compare: left out
    assert pooled == {both.label: {"samples": 300, "devices": 1, "accuracy": alone[0].correct / 300,
                                   "published_accuracy": alone[1].correct / 300, "published_version": 3}}


def test_a_simulated_fleet_reports_both_accuracies_for_the_same_model(tmp_path) -> None:
    from simulation.simulate import SimulationConfig, run_simulation, sim_federation
    from edge_sdk.training import TrainConfig

    out = tmp_path / "run"
    config = SimulationConfig(
        method="fedavg", clients=3, dataset="digits", model="mlp", out=str(out), plots=True, holdout=0.3,
        federation=sim_federation(rounds=2, seed=3, eval_per_class=True, checkpoint_dir=str(tmp_path / "ck"),
                                  train=TrainConfig(lr=0.1, batch_size=16)))
    report = run_simulation(config)
    last = report.rounds[-1]
    central, federated = last.accuracy["global"], last.federated_accuracy["global"]
    assert central > 0.6 and federated > 0.6
    assert abs(central - federated) < 0.12  # same model, IID data: the two test sets agree
    ev = last.evaluation
    assert ev["devices"] == 3 and ev["asked"] == 3 and ev["missing"] == 0
    # each device held out ~30 % of its ~480 samples; none of them trained on
    assert 300 < ev["samples"] < 560
    assert len(ev["per_class"]["global"]) == 10
    data = json.loads((out / "report.json").read_text())
    assert data["final"]["federated_accuracy"]["global"] == pytest.approx(federated)
    assert all(d["evaluation"]["samples"] > 50 for d in data["devices"])
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert float(rows[-1]["federated_accuracy_global"]) == pytest.approx(federated)
    assert int(rows[-1]["federated_samples"]) == ev["samples"]
    assert (out / "accuracy.png").stat().st_size > 1000
    # devices.csv: per device and round, what it trained on and held out, adding up to the figures
    with open(out / "devices.csv") as fh:
        counts = list(csv.DictReader(fh))
    assert [r["round"] for r in counts] == ["1"] * 3 + ["2"] * 3
    last_round = counts[3:]
    assert sum(int(r["held_out"]) for r in last_round) == ev["samples"]
    assert sum(int(r["correct"]) for r in last_round) == round(federated * ev["samples"])
    assert {d["id"]: d["trained_samples"] for d in data["devices"]} == {r["device"]: int(r["trained"])
                                                                       for r in last_round}
    # the same final model on the same held-out samples, evaluated here: the very same count
    same = _central_on_the_devices_holdout(config, tmp_path / "ck")
    assert same == (ev["samples"], round(federated * ev["samples"]))


def _central_on_the_devices_holdout(config, checkpoint: Path) -> tuple[int, int]:
    """(samples, correct) of the checkpointed final model on every device's held-out share, rebuilt
    here from the dataset, the partition and the sample keys as the simulated devices chose it."""
    from coordinator.runtime.state import load_checkpoint
    from edge_sdk.data.datasets import load_dataset
    from edge_sdk.data.holdout import split_holdout
    from edge_sdk.methods import LocalData
    from edge_sdk.models.spec import build_model
    from edge_sdk.models.zoo import model_for_dataset
    from edge_sdk.data.partition import partition
    from edge_sdk.tensors import load_numpy_state
    from edge_sdk.training import evaluate_counts

    dataset = load_dataset(config.dataset, seed=config.federation.seed)
    model = build_model(model_for_dataset(config.model, dataset.input_shape, dataset.num_classes))
    load_numpy_state(model, load_checkpoint(checkpoint).tensors)
    samples = correct = 0
    for shard in partition(dataset.y_train, config.clients, config.partition, seed=config.federation.seed):
        data = LocalData(dataset.x_train[shard], dataset.y_train[shard], 10, keys=shard.astype(np.uint64))
        held = split_holdout(data, config.holdout).holdout
        counts = evaluate_counts(model, held.x, held.y)
        samples, correct = samples + counts.samples, correct + counts.correct
    return samples, correct


@pytest.mark.parametrize("capabilities, version, takes", [
    (("fedavg", "evaluate"), "0.5.0", True), (("evaluate",), "", True),  # it says so: its version does not matter
    (("fedavg",), "0.5.0", False), (("fedavg",), "1.0", False),  # a later SDK that does not say so: not asked
    (("fedavg",), "0.4.0", True), (("fedavg",), "0.4.7", True),  # SDK 0.4 named only methods, and answers
    ((), "0.3.0", False), ((), "0.2.9", False), ((), "", False), ((), "x.y", False)])
def test_only_a_device_that_answers_evaluations_is_asked(capabilities, version, takes) -> None:
    """A device that does not answer `evaluate` would hold every evaluation until its deadline, so
    the loop asks only those that name the ``evaluate`` capability (and SDK 0.4 devices, which
    answer it but named only their methods; the round's `evaluation.sdk_too_old` counts the rest)."""
    from coordinator.core.device_record import DeviceRecord
    from edge_sdk.profiling import load_profile

    record = DeviceRecord("d", load_profile("raspberry-pi-4b"), 10, sdk_version=version, capabilities=capabilities)
    assert record.takes_evaluations() is takes


def test_a_device_names_what_it_can_do_and_the_list_is_bounded() -> None:
    from edge_sdk.methods import DEVICE_METHODS
    from edge_sdk.protocol.capabilities import EVALUATE
    from edge_sdk.protocol.errors import ProtocolError
    from edge_sdk.protocol.messages import MAX_CAPABILITIES, Envelope, Register, decode_envelope, encode_envelope

    def register(capabilities: tuple[str, ...]) -> Register:
        env = Envelope.of(Register({"name": "pi"}, 10, capabilities=capabilities), "d1")
        return decode_envelope(encode_envelope(env)).body

    ours = (*DEVICE_METHODS, EVALUATE)
    assert register(ours).capabilities == ours
    for hostile in (("x",) * (MAX_CAPABILITIES + 1), ("x" * 65,)):
        with pytest.raises(ProtocolError, match="capabilities"):
            register(hostile)

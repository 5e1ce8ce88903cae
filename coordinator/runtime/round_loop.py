"""The round loop: the one place that runs a federated job's rounds, for every method.

A round: sample online devices → announce the round → send each its plan → collect valid
updates until all arrived or the deadline → aggregate when a quorum arrived → evaluate →
checkpoint. The loop owns the fleet, the report, checkpoints, publishing, the held-out data and
failure accounting; the method (:class:`coordinator.strategies.base.Strategy`) only answers its
hooks, with every input passed explicitly (docs/architecture.md).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_sdk.accelerator import resolve_device
from edge_sdk.data.preprocessing import Preprocessing
from edge_sdk.protocol.capabilities import EVALUATE_BASELINE
from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import Evaluate, Evaluation, Plan, RoundStart, Stop

from coordinator.aggregate.validation import UpdateRejected

from coordinator.core.federation import EvalData, FederationConfig, TrainingFailed
from coordinator.core.device_record import DeviceRecord
from coordinator.core.received_update import ReceivedUpdate
from coordinator.runtime.fleet import Fleet
from coordinator.core.health import Health
from coordinator.runtime.publish import publish_models
from coordinator.runtime.continuous import ContinuousServing, against_baseline
from coordinator.runtime.device_counts import DeviceCount
from coordinator.runtime.fleet_normalisation import normalisation_from_fleet, stored_normalisation
from coordinator.runtime.sim_clock import SimClock
from coordinator.runtime.series_features import fit_rocket_biases, rocket_layers
from coordinator.runtime.job_identity import refuse_another_job
from coordinator.runtime.kept_versions import clear_rollback, keep_version, kept_versions, pending_rollback, \
    version_tensors
from coordinator.runtime.report import RoundRecord, RunReport, merge_stages
from coordinator.runtime.safe_files import appending
from coordinator.runtime.state import load_checkpoint, save_checkpoint
from coordinator.strategies.base import Strategy

__all__ = ["EVAL_SAMPLES_PER_TRAINING", "RoundLoop"]

#: every round's record, one JSON line each, appended beside the checkpoint (a round redone after a
#: crash between the two appears twice: its last line counts)
HISTORY_FILE = "history.jsonl"

log = logging.getLogger(__name__)
_SERVER_OPT = "server_opt:"  # checkpoint tensors of the server optimizer's moments
#: A device's evaluation counts at most this many samples per sample it trains on (a holdout of
#: at most 0.9 holds out 9 per training sample), or `EVAL_SAMPLES_FLOOR`: what one device may
#: weigh in the federated accuracy is bounded like its updates.
EVAL_SAMPLES_PER_TRAINING = 10
EVAL_SAMPLES_FLOOR = 1000


def _same_model(a: Plan, b: Plan) -> bool:
    """Are two plans' models of one label, spec and tensor shapes (one can stand in for the other)?"""
    return a.label == b.label and a.model_spec == b.model_spec and \
        {k: v.shape for k, v in a.tensors.items()} == {k: v.shape for k, v in b.tensors.items()}


class RoundLoop:
    """Runs ``strategy``'s rounds on ``fleet`` and fills ``report``.

    ``eval_data``: the held-out set the coordinator evaluates on (None: none);
    ``preprocessing``: the job's input normalisation, sent with every plan and published with
    the models (None: devices keep their own); ``clock``: a simulated fleet's (`SimClock`; None: none).
    """

    def __init__(self, strategy: Strategy, fleet: Fleet, report: RunReport, *,
                 eval_data: EvalData | None = None, preprocessing: Preprocessing | None = None,
                 identity: dict[str, Any] | None = None, fleet_normalisation: bool = False,
                 clock: SimClock | None = None) -> None:
        self.strategy = strategy
        self.fleet = fleet
        self.report = report
        self.eval_data = eval_data
        self.preprocessing = preprocessing
        self.config: FederationConfig = strategy.config
        resolve_device(self.config.eval_device)  # no such GPU: a one-line error before any round
        #: the first bytes sent of each label's plan (the report's payload_bytes)
        self.payload_bytes: dict[str, int] = {}
        self.published: list = []  # what the last publishing sent
        #: a MiniRocket model's fitted biases by state key: fixed for the job (`_hold_rocket_biases`)
        self._rocket_biases: dict[str, np.ndarray] = {}
        #: what the method had exported to ONNX after the run, per label (`export_networks`; None: nothing)
        self.exported: dict[str, dict[str, Any]] | None = None
        self._eval_subset: EvalData | None = None  # the interim evaluations' subset (eval_samples)
        self._failed_in_a_row = 0  # rounds (stages) in a row in which every device asked failed
        self._last_failure = ""
        fleet.on_register = self._on_register
        fleet.on_profile_update = self._on_profile_update
        #: called before each round with its index; may hold the job there (e.g. paused from Home Assistant)
        self.before_round: Callable[[int], None] | None = None
        #: what makes the job this job, kept in its checkpoint and checked on resume (None: not checked)
        self.identity: dict[str, Any] | None = identity
        #: ``[task] mean = "fleet"``: the normalisation comes from the devices' statistics before round 1
        #: (``preprocessing`` gives its classes and shape), frozen in the checkpoint
        self.fleet_normalisation = fleet_normalisation
        self._frozen_normalisation: Preprocessing | None = None
        #: called after a resume with the rounds the checkpoint restored (Home Assistant's counters)
        self.on_resumed: Callable[[list[RoundRecord]], None] | None = None
        #: a job that keeps serving (`FederationConfig.min_new_samples`): its pacing and publishing
        self.serving = ContinuousServing(self.config, fleet) if self.config.min_new_samples > 0 else None
        self.version = 0  # the model version: rounds aggregated so far
        self.published_version = 0  # the version devices serve (0: none published)
        self._rolled_back: float | None = None  # the rollback request applied, until its checkpoint
        #: whether the checkpoint, the kept versions (and, in `run_job`, the report) could be written
        self.health = Health()
        #: a job that keeps serving: the published version's training state (its baseline)
        self._published_state: dict[str, Any] | None = None
        #: the last round's counts per device (trained, held out): devices.csv's rows
        self.device_counts: list[DeviceCount] = []
        self._counts: dict[str, DeviceCount] = {}
        #: a simulated fleet's clock (availability, a simulated deadline; `coordinator.runtime.sim_clock`):
        #: every round then records ``sim_time_s``, its end in simulated seconds since the job began
        self.clock: SimClock | None = clock

    # -- fleet events -------------------------------------------------------
    def _on_register(self, device: DeviceRecord) -> None:
        device.label = self.strategy.assign(device)
        self._write_relabelled()

    def _on_profile_update(self, device: DeviceRecord) -> None:
        """Between rounds: a registered device measured itself again; its label from now on."""
        device.label = self.strategy.reassign(device)
        self._write_relabelled()

    def _write_relabelled(self) -> None:
        """The labels of other devices that a (re)assignment changed: the loop writes the fleet's
        records, the method only says what changed."""
        for device_id, label in self.strategy.relabelled().items():
            if device_id in self.fleet.devices:
                self.fleet.devices[device_id].label = label

    # -- the job ------------------------------------------------------------
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunReport:
        """Run every remaining round; returns the filled report."""
        config, fleet, report = self.config, self.fleet, self.report
        for device in fleet.devices.values():
            self._on_register(device)
        start = self._resume()
        if report.rounds and self.on_resumed is not None:
            self.on_resumed(report.rounds)
        self.version = report.rounds[-1].version if report.rounds else 0
        if report.rounds:
            self.published_version = report.rounds[-1].published_version
            self._restore_published()
        if start < config.rounds:
            online = fleet.wait_for_devices(config.min_devices, config.register_timeout_s)
            if len(online) < config.min_devices:
                raise TimeoutError(f"only {len(online)} of {config.min_devices} devices registered "
                                   f"within {config.register_timeout_s} s; {fleet.why_not_registered()}")
            if self.fleet_normalisation and self._frozen_normalisation is None:
                self._freeze_normalisation()
            labels = self.strategy.setup(dict(fleet.devices), fleet.online())
            self._fit_rocket_biases()  # after setup: FedPara's network exists once γ is chosen
            for device_id, label in (labels or {}).items():  # the method labels; the fleet's records keep it
                fleet.devices[device_id].label = label
        every = config.publish_every
        try:
            for rnd in range(start, config.rounds):
                self._rollback_if_asked(rnd)
                if self.serving is not None:
                    self.serving.poll = partial(self._rollback_if_asked, rnd)
                    self.serving.wait_for_data(rnd)
                if self.before_round is not None:
                    self.before_round(rnd)
                record = self._round(rnd)
                self.version += int(record.aggregated)
                record = replace(record, version=self.version)
                if self.serving is not None and self.serving.round_ended(record, self.published_version):
                    self._publish(rnd)
                record = replace(record, published_version=self.published_version)
                report.add_round(record)
                self._checkpoint(rnd)
                if self._rolled_back is not None:  # the checkpoint now holds it: the request is done
                    clear_rollback(Path(config.checkpoint_dir or "."), self._rolled_back)
                    self._rolled_back = None
                if on_round is not None:
                    on_round(record)
                self._stop_if_training_fails(rnd)
                if every > 0 and (rnd + 1) % every == 0 and rnd + 1 < config.rounds and self.serving is None:
                    self._publish(rnd)  # an interim model
        except BaseException:  # Ctrl-C or an error: the report of the finished rounds names the devices
            report.finish(fleet, self.strategy.model_params(), self.payload_bytes)
            raise
        if self.serving is None:  # a job that keeps serving published what was worth it as it went
            self._publish(config.rounds - 1)
            report.published_version = self.published_version
        fleet.broadcast(Stop("training finished"))
        report.finish(fleet, self.strategy.model_params(), self.payload_bytes)
        self.strategy.finished(self.eval_data)
        self.exported = self._export()
        return report

    def _export(self) -> dict[str, dict[str, Any]] | None:
        """What the method has exported to ONNX after the run (:meth:`Strategy.onnx_export`: e.g. every
        width with ``--option export=DIR``), checked on up to 64 held-out samples; None: nothing asked."""
        export = self.strategy.onnx_export()
        if export is None:
            return None
        if self.eval_data is None:
            raise ValueError("export needs held-out inputs to check the ONNX graphs on")
        from coordinator.runtime.export import export_networks  # torch.onnx only when asked

        return export_networks(export, self.eval_data.x[:64])

    def _stop_if_training_fails(self, rnd: int) -> None:
        limit = self.config.stop_after_failed_rounds
        if limit and self._failed_in_a_row >= limit:
            raise TrainingFailed(f"every device failed its training in the last {self._failed_in_a_row} rounds "
                                 f"(to round {rnd + 1}): {self._last_failure}")

    def _publish(self, rnd: int, version: int | None = None) -> None:
        """Send every device the model of its label as of round ``rnd`` (when publishing is on), the
        latest version (or ``version``, rolled back to) — kept when `keep_versions` says so."""
        if not self.config.publish:
            return
        self.published_version = self.version if version is None else version
        if self.serving is not None:
            self._published_state = {k: np.array(v, copy=True) for k, v in self._training_state().items()}
        inputs = self.eval_data.x if self.eval_data is not None else None
        onnx: dict[str, bytes] = {}
        self.published = publish_models(self.strategy.inference_model, self.fleet, rnd,
                                        retain=self.config.retain_models, preprocessing=self.preprocessing,
                                        inputs=inputs, only=self._publish_to(), keep=onnx.__setitem__,
                                        version=self.published_version)
        if self.config.keep_versions and self.config.checkpoint_dir is not None and version is None:
            figures = self.serving.published_figures if self.serving is not None else self._latest_figures()
            with self.health.writing("the kept versions"):
                keep_version(Path(self.config.checkpoint_dir), self.version, rnd, self.strategy.name,
                             self._training_state(), figures, onnx, self.config.keep_versions)

    def _latest_figures(self) -> dict[str, float]:
        """The latest evaluated round's accuracy per label (the test set's, else the devices')."""
        for record in reversed(self.report.rounds):
            if record.accuracy or record.federated_accuracy:
                return dict(record.accuracy or record.federated_accuracy)
        return {}

    def _restore_published(self) -> None:
        """After a resume: the published version's state and figures, from its kept copy (when kept)."""
        if self.serving is None or self.config.checkpoint_dir is None or not self.published_version:
            return
        directory = Path(self.config.checkpoint_dir)
        kept = {v.version: v for v in kept_versions(directory)}.get(self.published_version)
        if kept is not None:
            self._published_state = version_tensors(directory, kept.version)
            self.serving.published_figures = dict(kept.figures)

    def _rollback_if_asked(self, rnd: int) -> None:
        """Before round ``rnd`` and while waiting for data: serve a kept version again when
        ``edgefl coordinator --rollback`` asked (`coordinator.runtime.kept_versions`)."""
        if self.config.checkpoint_dir is None:
            return
        directory = Path(self.config.checkpoint_dir)
        request = pending_rollback(directory)
        if request is None or request["asked_at"] == self._rolled_back:
            return
        version = request["to"]
        self._load_training_state(version_tensors(directory, version))
        kept = {v.version: v for v in kept_versions(directory)}
        if self.serving is not None:
            self.serving.published_figures = dict(kept[version].figures) if version in kept else {}
        log.warning("rollback: the devices serve version %d again and training continues from it (the next "
                    "version is %d)", version, self.version + 1)
        self._publish(max(rnd - 1, 0), version=version)
        self._rolled_back = request["asked_at"]

    def _publish_to(self) -> list[str] | None:
        """`publish_devices` of the devices, the latest round's participants first (None: all)."""
        k = self.config.publish_devices
        if k is None or k >= len(self.fleet.devices):
            return None
        latest = self.report.rounds[-1].participants if self.report.rounds else []
        rest = [d for d in sorted(self.fleet.devices) if d not in set(latest)]
        return (list(latest) + rest)[:k]

    def evaluates(self, rnd: int) -> bool:
        """Whether round ``rnd`` (0-based) is evaluated: every `eval_every`-th and the last."""
        return (rnd + 1) % self.config.eval_every == 0 or rnd + 1 == self.config.rounds

    # -- one round ----------------------------------------------------------
    def _round(self, rnd: int) -> RoundRecord:
        fleet = self.fleet
        if not fleet.online():  # the whole fleet dropped (e.g. with the broker): wait for it as for round 0
            fleet.wait_for_devices(self.config.min_devices, self.config.register_timeout_s)
        rng = np.random.default_rng([self.config.seed, rnd])  # a resumed job samples alike
        self._counts = {}
        clock, online = self.clock, fleet.online()
        if clock is not None and online and not any(clock.online(d) for d in online):  # all away: wait for one
            clock.now = min(clock.availability(d).next_online(clock.now) for d in online)
        records = []
        for stage in self.strategy.round_stages(rnd, fleet.online_records()):
            self.strategy.begin_stage(rnd, stage)
            records.append(self._stage(rnd, rng))
            if clock is not None:
                clock.now += records[-1].seconds
        record = merge_stages(records)
        if clock is not None:
            record = replace(record, metrics={**record.metrics, "sim_time_s": clock.now})
        if self.evaluates(rnd) and self.config.federated_eval:
            record = self._federated_evaluation(rnd, record)
        self.device_counts = [self._counts[d] for d in sorted(self._counts)]
        return record

    def _count(self, rnd: int, device: str, label: str, **counts: int) -> None:
        before = self._counts.get(device, DeviceCount(rnd + 1, device, label))
        self._counts[device] = replace(before, **counts)

    def _sample(self, candidates: list[str], rng: np.random.Generator, k: int | None = -1) -> list[str]:
        """``k`` of ``candidates`` drawn with ``rng`` (-1: `devices_per_round`; None: all)."""
        k = self.config.devices_per_round if k == -1 else k
        if k is None or k >= len(candidates):
            return list(candidates)
        # the same draw as rng.choice(candidates, ...), without making an array of 10,000 strings
        return sorted(candidates[i] for i in rng.choice(len(candidates), size=k, replace=False))

    def _stage(self, rnd: int, rng: np.random.Generator) -> RoundRecord:
        strategy, fleet, config = self.strategy, self.fleet, self.config
        started = time.monotonic()
        candidates = strategy.candidates(fleet.online())
        if self.clock is not None:  # a simulated device away now is not asked
            candidates = [d for d in candidates if self.clock.online(d)]
        participants = self._sample(candidates, rng)
        strategy.begin_round_plans(rnd, participants)
        # the round's announcement reaches only its participants, each named alone: at 10,000 devices a
        # broadcast cost every idle device a message, and a list of all cost the round 10,000² names
        down = sum(fleet.send(device_id, RoundStart(config.round_deadline_s, (device_id,)), rnd)
                   for device_id in participants)
        plans: dict[str, Plan] = {}
        for device_id in participants:
            plan = strategy.configure_train(rnd, fleet.devices[device_id])
            if self.preprocessing is not None:
                plan = replace(plan, preprocessing=self.preprocessing.normalisation())
            plans[device_id] = plan
        sent: dict[str, int] = {}

        def send_plan(device_id: str) -> int:  # sent as the round progresses (`Fleet.collect`)
            plan = plans.pop(device_id)
            sent[device_id] = fleet.send(device_id, plan, rnd)
            self.payload_bytes.setdefault(plan.label, sent[device_id])
            return sent[device_id]
        needed = max(1, int(np.ceil(config.quorum * len(participants))))
        collected = fleet.collect(rnd, participants, config.round_deadline_s, strategy.check_update, send_plan,
                                  quorum=needed, straggler_after=config.straggler_after)
        updates, failures = collected.updates, collected.failures
        arrivals = {d: self._arrival(d, sent.get(d, 0), received) for d, received in updates.items()}
        deadline = self.clock.deadline_s if self.clock is not None else None
        late = {d for d, at in arrivals.items() if deadline is not None and at > deadline}
        if late:  # past the simulated deadline: a real coordinator would not have waited for them
            updates = {d: u for d, u in updates.items() if d not in late}
            arrivals = {d: at for d, at in arrivals.items() if d in updates}
        for device_id, received in updates.items():
            self._count(rnd, device_id, received.update.label, trained=received.update.num_samples)
        if participants and set(failures) >= set(participants):
            self._failed_in_a_row += 1
            self._last_failure = next(iter(failures.values()))
        else:
            self._failed_in_a_row = 0
        metrics: dict[str, float] = {}
        if len(updates) >= needed:
            metrics = strategy.aggregate(rnd, list(updates.values()), failures)
            self._hold_rocket_biases(rnd)
        else:
            log.warning("round %d: %d of %d updates, below quorum %d; model unchanged",
                        rnd + 1, len(updates), len(participants), needed)
        accuracy, loss, metrics = self._evaluate(rnd, metrics)
        if collected.not_waited_for:  # stragglers the round stopped waiting for (`Fleet.collect`)
            metrics = {**metrics, "not_waited_for": float(len(collected.not_waited_for))}
        if late:
            metrics = {**metrics, "late": float(len(late))}
        return RoundRecord(
            round=rnd, accuracy=accuracy, loss=loss,
            bytes_down=down + sum(sent.values()), bytes_up=sum(u.nbytes for u in updates.values()),
            seconds=self._simulated_seconds(participants, arrivals, collected.not_waited_for),
            host_seconds=time.monotonic() - started,
            participants=sorted(updates), aggregated=len(updates) >= needed,
            metrics=metrics,
        )

    def _evaluate(self, rnd: int, metrics: dict[str, float]) -> tuple[dict[str, float], float | None,
                                                                      dict[str, float]]:
        """The accuracy per label and loss on the held-out data after round ``rnd`` when it is evaluated
        (else none), and ``metrics`` with the evaluation's sample count."""
        accuracy: dict[str, float] = {}
        loss: float | None = None
        if self.evaluates(rnd):
            held_out = self._eval_set(last=rnd + 1 == self.config.rounds)
            if held_out is None:
                loss = float("nan")
            else:
                accuracy, loss = self.strategy.evaluate(rnd, held_out)
                metrics = {**metrics, "eval_samples": float(len(held_out))}
            accuracy = {**accuracy, **self.strategy.reported_accuracy(rnd)}
        return accuracy, loss, metrics

    # -- federated evaluation -----------------------------------------------
    def _federated_evaluation(self, rnd: int, record: RoundRecord) -> RoundRecord:
        """Ask the online devices (`eval_devices` of them) to evaluate the model each would be
        served on its held-out data, wait for their counts until all answered or the deadline,
        and fold them per model label into ``record`` (``rnd``: the requests' round tag; an
        asynchronous job's is a tag of its own, its display names ``record.round``)."""
        strategy, fleet, config = self.strategy, self.fleet, self.config
        started = time.monotonic()
        rng = np.random.default_rng([config.seed, rnd, 0xE7A1])  # apart from the training's draws
        labels: dict[str, str] = {}
        down = 0
        online = fleet.online()
        able = [d for d in online if fleet.devices[d].takes_evaluations()]
        too_old = len(online) - len(able)
        plans: dict[str, Plan] = {}
        for device_id in self._sample(able, rng, config.eval_devices):
            plan = strategy.configure_evaluate(rnd, fleet.devices[device_id])
            if plan is not None:
                plans[device_id] = plan
        baselines = self._baselines(rnd, plans) if record.aggregated or self.version != self.published_version else {}
        for device_id, plan in plans.items():
            if self.preprocessing is not None:
                plan = replace(plan, preprocessing=self.preprocessing.normalisation())
            down += fleet.send(device_id, Evaluate.of(plan, config.eval_per_class, baselines.get(device_id)), rnd)
            labels[device_id] = plan.label
        asked = list(labels)
        up_before = sum(fleet.devices[d].bytes_up for d in asked)
        deadline = config.eval_deadline_s if config.eval_deadline_s is not None else config.round_deadline_s
        collected = fleet.collect_evaluations(rnd, asked, deadline, self._evaluation_check(labels),
                                              shown_round=record.round)
        result = strategy.aggregate_evaluate(rnd, collected.reports, collected.missing)
        for device_id, report in collected.reports.items():
            self._count(rnd, device_id, report.label, held_out=report.num_samples, correct=report.correct)
        if collected.missing:
            log.info("round %d: %d of %d devices asked sent no evaluation in time", rnd + 1,
                     len(collected.missing), len(asked))
        seconds = time.monotonic() - started
        compared = against_baseline(collected.reports, set(baselines), self.published_version)
        return replace(record, federated_accuracy=result.accuracy, federated_loss=result.loss,
                       evaluation={**result.summary(config.min_eval_samples), "asked": len(asked),
                                   "sdk_too_old": too_old, "host_seconds": seconds,
                                   **({"against_published": compared} if compared else {})},
                       bytes_down=record.bytes_down + down,
                       bytes_up=record.bytes_up + sum(fleet.devices[d].bytes_up for d in asked) - up_before,
                       host_seconds=record.host_seconds + seconds)

    def _baselines(self, rnd: int, plans: dict[str, Plan]) -> dict[str, dict[str, np.ndarray]]:
        """A job that keeps serving: per device able to (``evaluate_baseline``), the tensors of the
        published version's model of the same label and spec, to be counted on the very same held-out
        samples as the new version (none when none is published yet)."""
        able = [d for d in plans if EVALUATE_BASELINE in self.fleet.devices[d].capabilities]
        if self.serving is None or self._published_state is None or not able:
            return {}
        current = {k: np.array(v, copy=True) for k, v in self._training_state().items()}
        self._load_training_state(self._published_state)
        out: dict[str, dict[str, np.ndarray]] = {}
        try:
            for device_id in able:
                plan = self.strategy.configure_evaluate(rnd, self.fleet.devices[device_id])
                if plan is not None and _same_model(plan, plans[device_id]):
                    out[device_id] = {k: np.array(v, copy=True) for k, v in plan.tensors.items()}
        finally:
            self._load_training_state(current)
        return out

    def _evaluation_check(self, labels: dict[str, str]) -> Callable[[DeviceRecord, Evaluation], None]:
        """What a device's evaluation must be: of the label it was sent, of no more samples than
        its training data bounds (`EVAL_SAMPLES_PER_TRAINING`), class counts only when asked and
        for the task's classes."""
        per_class = self.config.eval_per_class
        classes = self.fleet.task.num_classes if self.fleet.task is not None else None

        def check(device: DeviceRecord, evaluation: Evaluation) -> None:
            sent = labels[device.device_id]
            if evaluation.label != sent:
                raise UpdateRejected(ErrorCode.WRONG_LABEL, f"evaluation of {evaluation.label!r}; it was sent {sent!r}")
            bound = max(EVAL_SAMPLES_FLOOR, EVAL_SAMPLES_PER_TRAINING * device.num_samples)
            if evaluation.num_samples > bound:
                raise UpdateRejected(ErrorCode.BAD_EVALUATION, f"{evaluation.num_samples} held-out samples for "
                                     f"{device.num_samples} training samples: at most {bound} count")
            if evaluation.class_counts and not per_class:
                raise UpdateRejected(ErrorCode.BAD_EVALUATION, "class counts this job did not ask for")
            if evaluation.class_counts and classes is not None and len(evaluation.class_counts) != classes:
                raise UpdateRejected(ErrorCode.BAD_EVALUATION, f"{len(evaluation.class_counts)} class counts for "
                                     f"a task of {classes} classes")
        return check

    def _eval_set(self, last: bool) -> EvalData | None:
        """The held-out data of an evaluation: all of it in the last round or without
        ``eval_samples``, else a fixed stratified subset of ``eval_samples`` (seeded)."""
        full, n = self.eval_data, self.config.eval_samples
        if full is None or last or n is None or n >= len(full):
            return full
        if self._eval_subset is None:
            self._eval_subset = full.stratified(n, self.config.seed)
        return self._eval_subset

    def _work_seconds(self, device_id: str, sent: int, received: ReceivedUpdate) -> float:
        """A device's simulated work for one update: its plan's download (``sent`` bytes), its
        training (the update's ``compute_s``) and the update's upload, on its profile."""
        profile = self.fleet.devices[device_id].profile
        down_s = sent * 8 / (profile.downlink_mbps * 1e6)
        up_s = received.nbytes * 8 / (profile.uplink_mbps * 1e6)
        return down_s + float(received.update.metrics.get("compute_s", 0.0)) + up_s

    def _arrival(self, device_id: str, sent: int, received: ReceivedUpdate) -> float:
        """When an update of a round arrives, in simulated seconds after the round began (the
        device's work, paused while it is away when the fleet has a `SimClock`)."""
        work = self._work_seconds(device_id, sent, received)
        if self.clock is None:
            return work
        return self.clock.finish(device_id, self.clock.now, work) - self.clock.now

    def _simulated_seconds(self, participants: list[str], arrivals: dict[str, float],
                           not_waited_for: list[str] = ()) -> float:
        """Round wall-clock on the profiled devices: the latest update's arrival; the deadline when
        a participant was waited for in vain, twice the latest when only stragglers were missing
        (`Fleet.collect` waits for them as long again as the others took)."""
        slowest = max(arrivals.values(), default=0.0)
        deadline = self.config.round_deadline_s
        if self.clock is not None and self.clock.deadline_s is not None:
            deadline = self.clock.deadline_s
        if len(arrivals) + len(not_waited_for) < len(participants):
            slowest = max(slowest, deadline)
        elif not_waited_for:
            slowest = min(2 * slowest, deadline)
        return slowest

    # -- checkpoints --------------------------------------------------------
    def _checkpoint(self, rnd: int) -> None:
        if self.config.checkpoint_dir is None:
            return
        strategy, tensors = self.strategy, self._training_state()
        directory = Path(self.config.checkpoint_dir)
        with self.health.writing("the checkpoint"):
            directory.mkdir(parents=True, exist_ok=True)
            if self.report.rounds:  # every round, appended (the checkpoint keeps the latest)
                with appending(directory / HISTORY_FILE, newline=None) as fh:
                    fh.write(json.dumps(self.report.rounds_as_dicts()[-1], separators=(",", ":")) + "\n")
            save_checkpoint(directory, strategy.name, rnd, self.report.rounds_as_dicts(), tensors, self.identity,
                            self.report.rounds_total, self.report.totals)

    def _training_state(self) -> dict[str, Any]:
        """The method's tensors and its server optimizer's moments (a checkpoint's, a kept version's)."""
        strategy = self.strategy
        return {**strategy.state_tensors(),
                **{_SERVER_OPT + k: v for k, v in strategy.server_opt.state_tensors().items()}}

    def _load_training_state(self, tensors: dict[str, Any]) -> None:
        strategy = self.strategy
        strategy.load_state_tensors({k: v for k, v in tensors.items() if not k.startswith(_SERVER_OPT)})
        strategy.server_opt.load_state_tensors({k[len(_SERVER_OPT):]: v for k, v in tensors.items()
                                                if k.startswith(_SERVER_OPT)})

    def _freeze_normalisation(self) -> None:
        """``[task] mean = "fleet"``: the job's normalisation from the devices' statistics, once."""
        assert self.preprocessing is not None
        self.preprocessing = self._frozen_normalisation = normalisation_from_fleet(
            self.fleet, self.preprocessing, self.config.register_timeout_s)
        self._keep_normalisation()

    def _fit_rocket_biases(self) -> None:
        """A MiniRocket model's biases from the fleet's statistics, once: before its first round (a
        resumed job's checkpoint holds them). They are held from then on (`_hold_rocket_biases`)."""
        state = self.strategy.state_tensors()
        for key, layer in rocket_layers(self.strategy.state_spec()):
            if key not in state:  # a strategy whose state names are not its state_spec's: a bug, not a job
                raise RuntimeError(f"{self.strategy.name}: its state holds no {key!r} of its minirocket layer")
            if not np.any(state[key]):
                assert self.preprocessing is not None
                state[key] = fit_rocket_biases(self.fleet, layer, self.preprocessing, self.config.seed,
                                               self.config.register_timeout_s)
                self.strategy.load_state_tensors(state)
            self._rocket_biases[key] = np.array(state[key], copy=True)
        # fixed from here on: a device that holds them is no longer sent them (`Fleet.fixed`)
        self.fleet.fixed.names = frozenset(self._rocket_biases)

    def _hold_rocket_biases(self, rnd: int) -> None:
        """The fitted biases back where an aggregate moved them: they travel in every update (the
        model's state), honest devices send them back unchanged, and a device that sends others —
        hostile or broken — must not shift every device's features."""
        if not self._rocket_biases:
            return
        state = self.strategy.state_tensors()
        moved = [key for key, held in self._rocket_biases.items() if not np.array_equal(state[key], held)]
        if not moved:
            return
        self.strategy.load_state_tensors({**state, **self._rocket_biases})
        # float16 transfers (`[link] transfer_dtype`) round them on the way: that is no device's doing
        far = [key for key in moved if not np.allclose(state[key], self._rocket_biases[key], rtol=2e-3, atol=1e-5)]
        if far:
            log.warning("round %d: the aggregate moved the fixed minirocket biases (%s): an update sent others; "
                        "restored", rnd + 1, ", ".join(far))

    def _keep_normalisation(self) -> None:
        """The frozen normalisation in the report and in the job's identity (its checkpoint)."""
        assert self._frozen_normalisation is not None
        kept = {"mean": list(self._frozen_normalisation.mean), "std": list(self._frozen_normalisation.std)}
        self.report.config["normalisation"] = {**kept, "from": "fleet"}
        if self.identity is not None:
            self.identity = {**self.identity, "normalisation": kept}

    def _resume(self) -> int:
        if self.config.checkpoint_dir is None:
            return 0
        checkpoint = load_checkpoint(Path(self.config.checkpoint_dir))
        if checkpoint is None:
            return 0
        strategy = self.strategy
        if checkpoint.method != strategy.name:
            raise ValueError(f"checkpoint is for {checkpoint.method!r}, not {strategy.name!r}")
        if self.identity is not None:
            refuse_another_job(checkpoint.job, self.identity, f"the checkpoint in {self.config.checkpoint_dir}")
        self._load_training_state(checkpoint.tensors)
        self.report.restore_rounds(checkpoint.rounds, checkpoint.rounds_total, checkpoint.totals)
        if self.fleet_normalisation and self.preprocessing is not None:  # frozen with the job: not asked again
            self._frozen_normalisation = stored_normalisation(checkpoint.job, self.preprocessing)
            if self._frozen_normalisation is not None:
                self.preprocessing = self._frozen_normalisation
                self._keep_normalisation()
        log.info("resumed after round %d", checkpoint.round + 1)
        return checkpoint.round + 1

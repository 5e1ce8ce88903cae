"""A job that keeps serving (``[federation] min_new_samples``): between rounds it waits for new
data (`DataPacer`), and after each round it publishes the new model version only when it is not
worse than the published one.

A *model version* is the model after an aggregation (round records count them: ``version``); the
*published version* is the one devices serve. A new version replaces the published one when no
label's accuracy is more than ``publish_tolerance`` below the published version's — on the
coordinator's test set when it has one, else on the devices' held-out data when the figure rests on
``min_eval_samples`` or more: there both versions are counted on the very same samples (each device
evaluates the published version's model beside the new one, `against_baseline`); for a label no
device could compare, against the figure the published version had when it was published. Not
evaluable: the published one stays, and the log says why. Training always continues from the latest
version.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from coordinator.core.federation import FederationConfig
from coordinator.runtime.data_pacer import DataPacer, Pace
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.report import RoundRecord
from edge_sdk.protocol.messages import Evaluation

__all__ = ["ContinuousServing", "against_baseline"]

log = logging.getLogger("coordinator.runtime.round_loop")

#: how often at most the wait for data is logged while nothing else changes
_SAY_EVERY_S = 60.0


class ContinuousServing:
    """Waits for data between rounds and decides what is published."""

    def __init__(self, config: FederationConfig, fleet: Fleet) -> None:
        self.config, self.fleet = config, fleet
        self.pacer = DataPacer(config)
        self.published_figures: dict[str, float] = {}  # what the published version scored (empty: unknown)
        #: called while the job waits for data (the Home Assistant bridge: state "waiting_for_data")
        self.on_waiting: Callable[[Pace], None] | None = None
        #: called every second of the wait (the round loop: a rollback asked meanwhile)
        self.poll: Callable[[], None] | None = None

    def wait_for_data(self, rnd: int) -> None:
        """Pump the fleet until round ``rnd`` may start (Ctrl-C or SIGTERM stop it as any wait)."""
        said, said_at = "", -_SAY_EVERY_S
        while not (pace := self.pacer.decide(self.fleet.online_records())).ready:
            if self.on_waiting is not None:
                self.on_waiting(pace)
            if pace.why.split(":")[0] != said.split(":")[0] or time.monotonic() - said_at >= _SAY_EVERY_S:
                log.info("round %d waits for data: %s", rnd + 1, pace.why)
                said, said_at = pace.why, time.monotonic()
            self.fleet.pump(1.0)
            if self.poll is not None:
                self.poll()
        log.info("round %d: %d new samples from %d devices", rnd + 1, pace.new, pace.devices)

    def round_ended(self, record: RoundRecord, published_version: int) -> bool:
        """After a round: its participants' data is trained on. Whether its version is to be
        published (not worse than ``published_version``, the one devices serve); why not is logged."""
        self.pacer.round_ended(self.fleet.devices[d] for d in record.participants if d in self.fleet.devices)
        if not record.aggregated:
            return False
        figures, why = self._figures(record)
        if figures is None:
            log.info("version %d not published (version %d stays): %s", record.version, published_version, why)
            return False
        paired = {label: (pair["accuracy"], pair["published_accuracy"])
                  for label, pair in record.evaluation.get("against_published", {}).items()
                  if pair["samples"] >= self.config.min_eval_samples and not record.accuracy}
        compared = {**{label: (figures[label], before) for label, before in self.published_figures.items()
                       if label in figures}, **paired}
        worse = {label: pair for label, pair in compared.items() if pair[0] < pair[1] - self.config.publish_tolerance}
        if worse:
            shown = ", ".join(f"{label} {new:.3f} < {old:.3f}{' on the same samples' if label in paired else ''}"
                              for label, (new, old) in sorted(worse.items()))
            log.warning("version %d not published: worse than version %d (%s; tolerance %g)", record.version,
                        published_version, shown, self.config.publish_tolerance)
            return False
        self.published_figures = dict(figures)
        same = "; on the same held-out samples: " + ", ".join(
            f"{label} {new:.3f} vs {old:.3f}" for label, (new, old) in sorted(paired.items())) if paired else ""
        log.info("version %d published%s", record.version, same)
        return True

    def _figures(self, record: RoundRecord) -> tuple[dict[str, float] | None, str]:
        """The version's accuracy per label to compare, or None and why it cannot be compared."""
        if record.accuracy and all(v == v for v in record.accuracy.values()):
            return dict(record.accuracy), ""
        if record.federated_accuracy:
            if record.evaluation.get("enough", True):
                return dict(record.federated_accuracy), ""
            return None, "not enough held-out data to compare it"
        return None, "not evaluated (no test set here, no held-out data on the devices)"


def against_baseline(reports: dict[str, Evaluation], asked: set[str], published_version: int) -> dict[str, dict]:
    """Per label, the new version and the published one counted on the very same held-out samples:
    pooled over the devices asked to compare (``asked``) that did. ``{label: {"samples", "devices",
    "accuracy", "published_accuracy", "published_version"}}``; empty when none compared."""
    sums: dict[str, list[int]] = {}
    for device_id, report in reports.items():
        if device_id in asked and report.baseline_correct >= 0 and report.num_samples:
            total = sums.setdefault(report.label, [0, 0, 0, 0])
            total[0] += report.num_samples
            total[1] += report.correct
            total[2] += report.baseline_correct
            total[3] += 1
    return {label: {"samples": n, "devices": devices, "accuracy": correct / n, "published_accuracy": base / n,
                    "published_version": published_version}
            for label, (n, correct, base, devices) in sorted(sums.items())}

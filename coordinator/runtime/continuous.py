"""A job that keeps serving (``[federation] min_new_samples``): between rounds it waits for new
data (`DataPacer`), and after each round it publishes the new model version only when it is not
worse than the published one.

A *model version* is the model after an aggregation (round records count them: ``version``); the
*published version* is the one devices serve. A new version replaces the published one when no
label's accuracy is more than ``publish_tolerance`` below the published version's — on the
coordinator's test set when it has one, else on the devices' held-out data when the figure rests on
``min_eval_samples`` or more. Not evaluable: the published one stays, and the log says why.
Training always continues from the latest version.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from coordinator.core.federation import FederationConfig
from coordinator.runtime.data_pacer import DataPacer, Pace
from coordinator.runtime.fleet import Fleet
from coordinator.runtime.report import RoundRecord

__all__ = ["ContinuousServing"]

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
        worse = {label: (figures[label], before) for label, before in self.published_figures.items()
                 if label in figures and figures[label] < before - self.config.publish_tolerance}
        if worse:
            shown = ", ".join(f"{label} {new:.3f} < {old:.3f}" for label, (new, old) in sorted(worse.items()))
            log.warning("version %d not published: worse than version %d (%s; tolerance %g)", record.version,
                        published_version, shown, self.config.publish_tolerance)
            return False
        self.published_figures = dict(figures)
        log.info("version %d published", record.version)
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

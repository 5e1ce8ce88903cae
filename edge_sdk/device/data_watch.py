"""Between rounds, the device reads its data source again every ``reread_s`` and tells the
coordinator how much it holds when that changes (`DataCount`: training samples, those new since
the last round it trained, held-out samples). A coordinator that paces rounds by new data
(``[federation] min_new_samples``) learns of new rows without a round having to run first."""

from __future__ import annotations

import logging

from edge_sdk.device.client_config import ClientConfig
from edge_sdk.device.device_data import DeviceData
from edge_sdk.device.uplink import Uplink
from edge_sdk.protocol.messages import DataCount, Envelope

__all__ = ["DataWatch"]

log = logging.getLogger("edge_sdk.client")


class DataWatch:
    """Re-reads a device's source on a timer and sends its counts when they change."""

    def __init__(self, config: ClientConfig, local: DeviceData, uplink: Uplink) -> None:
        self.config, self.local, self.uplink = config, local, uplink
        self._next = 0.0  # time.monotonic() of the next re-read
        self._said: tuple[int, int, int] | None = None  # the counts last sent
        self.sent: list[DataCount] = []  # what it told the coordinator, latest last (the latest 16)

    def check(self, now: float, busy: bool) -> None:
        """Re-read and report if due (never while a round is under way: ``busy``)."""
        if busy or self.config.reread_s <= 0 or self.local.source is None or now < self._next:
            return
        self._next = now + self.config.reread_s
        if self.local.read_again(None) is not None:
            return  # said in the log; the next round answers no_data
        self.report()

    def report(self) -> None:
        """Send the counts if they changed since they were last sent."""
        counts = self.local.counts()
        if counts == self._said:
            return
        self._said = counts
        message = DataCount(*counts)
        self.sent = [*self.sent[-15:], message]
        self.uplink.envelope(Envelope.of(message, self.config.device_id))
        log.info("%s: %d samples to train on, %d new since its last round, %d held out", self.config.device_id,
                 *counts)

    def trained(self) -> None:
        """It trained on what it holds: nothing is new (the coordinator counts the same from its update).
        Data given once (a simulated device's shard) never grows: nothing to keep, no work per round."""
        if self.local.source is None:
            return
        self.local.mark_trained()
        self._said = self.local.counts()

"""A round's plans sent while the round progresses, not all at once.

A round of 10,000 participants (a simulated fleet where every device trains) handed the broker
10,000 plans of 0.5 MB at once: mosquitto held gigabytes for devices that train one after another,
and the round never finished. `PlanPacer` sends the plans in the participants' order while the
plans sent and not yet answered stay under a byte budget (`FleetLimits.plan_bytes_in_flight`);
each answer lets the next plans go. A fleet whose plans together fit the budget (every fleet of a
few hundred devices with a model of a megabyte) gets them all at once, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable

__all__ = ["PlanPacer"]


class PlanPacer:
    """Sends ``participants`` their plans by ``send_plan`` (which returns the bytes sent), in order,
    while the plans of participants not yet answered total less than ``max_bytes``: one plan always
    goes, and the last one sent may pass the budget."""

    def __init__(self, participants: Iterable[str], send_plan: Callable[[str], int], max_bytes: int) -> None:
        self._unsent = deque(participants)
        self._send_plan = send_plan
        self._max_bytes = max_bytes
        self._in_flight: dict[str, int] = {}  # participant -> its plan's bytes, until it answers
        self._bytes = 0

    @property
    def pending(self) -> bool:
        """Whether plans are still to be sent."""
        return bool(self._unsent)

    @property
    def bytes_in_flight(self) -> int:
        """The bytes of the plans sent to participants that have not answered."""
        return self._bytes

    def send_more(self, waiting: Collection[str]) -> int:
        """Forget the plans of participants no longer ``waiting`` (answered, or gone), then send
        plans while the budget allows; returns how many were sent."""
        for device in [d for d in self._in_flight if d not in waiting]:
            self._bytes -= self._in_flight.pop(device)
        sent = 0
        while self._unsent and (not self._in_flight or self._bytes < self._max_bytes):
            device = self._unsent.popleft()
            nbytes = self._send_plan(device)
            if device in waiting:
                self._in_flight[device] = nbytes
                self._bytes += nbytes
            sent += 1
        return sent

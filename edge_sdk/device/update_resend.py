"""An update the coordinator has not answered is sent again (issue 56).

The coordinator answers every update it read: an ``ack`` once it accepted it, an ``error`` (a
duplicate, a closed round, a rejected update) otherwise, each with ``reply_to`` the update's
message id. An update lost on the way — the broker's queue towards the coordinator, which every
device shares, full after a flood; a chunk dropped — gets no answer, and without a second copy the
device's round is lost. So a device keeps its latest update until it is answered, or a later
round begins, and sends it again after ``first_s`` seconds, then twice and four times as long
(``resends`` times at most): a bounded cost, and a resent update the coordinator already had is
only a ``duplicate`` for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_sdk.protocol.messages import Update

__all__ = ["UnansweredUpdate"]


@dataclass
class UnansweredUpdate:
    """The update of round ``round`` sent at ``sent_at`` (time.monotonic()) under ``msg_id``, not yet answered."""

    round: int
    update: Update
    msg_id: str
    sent_at: float
    first_s: float
    resends: int
    #: every message id it went out under: the answer to any of them is its answer
    msg_ids: set[str] = field(default_factory=set)
    tries: int = 0  # re-sends so far

    def __post_init__(self) -> None:
        self.msg_ids.add(self.msg_id)

    @property
    def due_at(self) -> float:
        """When it is to be sent again: ``first_s`` after it was first sent, then doubling."""
        return self.sent_at + self.first_s * (2 ** (self.tries + 1) - 1)

    def answered_by(self, reply_to: str | None) -> bool:
        """Is a coordinator's message replying to ``reply_to`` its answer?"""
        return reply_to is not None and reply_to in self.msg_ids

    def exhausted(self) -> bool:
        """True once it was re-sent ``resends`` times."""
        return self.tries >= self.resends

    def resent(self, msg_id: str) -> None:
        """It went out again under ``msg_id``."""
        self.tries += 1
        self.msg_ids.add(msg_id)

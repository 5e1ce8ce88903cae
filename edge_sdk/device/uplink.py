"""What a device sends the coordinator over its `MessageLink`: messages on its uplink topic, its
retained status, and its latest update, kept and sent again while the coordinator has not answered
it (edge_sdk/device/update_resend.py); and a request for a message from the coordinator that stalled."""

from __future__ import annotations

import logging
import time

from edge_sdk.device.client_config import ClientConfig
from edge_sdk.networking.link import MessageLink
from edge_sdk.protocol.errors import ErrorCode, ProtocolError
from edge_sdk.protocol.messages import Ack, Envelope, Error, Status, Update
from edge_sdk.protocol.topics import Topics
from edge_sdk.schedule import Decision
from edge_sdk.device.update_resend import UnansweredUpdate

__all__ = ["Uplink"]

log = logging.getLogger("edge_sdk.client")  # the device's log, whichever part of it speaks


class Uplink:
    """One device's messages to the coordinator (``link`` is set once the device connects)."""

    def __init__(self, config: ClientConfig, topics: Topics) -> None:
        self.device_id = config.device_id
        self.resend_s, self.resends = config.update_resend_s, config.update_resends
        self.topics = topics
        self.link: MessageLink | None = None
        self.status_at = 0.0  # when it last said its status (time.monotonic())
        #: its latest update while the coordinator has not answered it (edge_sdk/device/update_resend.py)
        self.unanswered: UnansweredUpdate | None = None
        self.unanswered_resends: list[int] = []  # rounds whose update was sent again for want of an answer

    def envelope(self, env: Envelope) -> None:
        """Send ``env`` on the uplink; a failure is logged (the device goes on)."""
        assert self.link is not None
        try:
            self.link.send(self.topics.uplink(self.device_id), env)
        except (ProtocolError, ConnectionError) as exc:
            log.error("%s: could not send %s: %s", self.device_id, env.kind, exc)

    def send(self, body: object, rnd: int) -> None:
        """Send ``body`` about round ``rnd``."""
        self.envelope(Envelope.of(body, self.device_id, round=rnd))

    def reply(self, body: object, to: Envelope) -> None:
        """Send ``body`` in answer to ``to``."""
        self.envelope(Envelope.of(body, self.device_id, round=to.round, reply_to=to.msg_id))

    def status(self, state: str, reason: str = "", decision: Decision | None = None) -> None:
        """Say the device's state (retained), with the schedule's readings when ``decision`` has them."""
        self.status_at = time.monotonic()
        assert self.link is not None
        metrics = decision.readings.metrics() if decision is not None else {}
        env = Envelope.of(Status(state, reason[:1000], metrics, self.link.transport.connection_stamp), self.device_id)
        self.link.send(self.topics.status(self.device_id), env, retain=True)

    def update(self, update: Update, rnd: int) -> None:
        """Send ``update`` and keep it until the coordinator answers it (`resend_unanswered`)."""
        env = Envelope.of(update, self.device_id, round=rnd)
        self.envelope(env)
        if self.resend_s > 0 and self.resends > 0:
            self.unanswered = UnansweredUpdate(rnd, update, env.msg_id, time.monotonic(), self.resend_s, self.resends)

    def heard(self, env: Envelope) -> None:
        """An ack or error answering the unanswered update (accepted, or refused for good: a
        duplicate, a closed round) ends its re-sending."""
        pending = self.unanswered
        if pending is not None and isinstance(env.body, (Ack, Error)) and pending.answered_by(env.reply_to):
            self.unanswered = None

    def round_started(self, rnd: int) -> None:
        """Round ``rnd`` began: the coordinator takes no update of an earlier round now."""
        if self.unanswered is not None and rnd > self.unanswered.round:
            self.unanswered = None

    def resend_wait(self, now: float) -> float:
        """Seconds until the unanswered update is due to be sent again (inf: none is)."""
        return float("inf") if self.unanswered is None else max(0.05, self.unanswered.due_at - now)

    def resend_unanswered(self, now: float, forget_before: int) -> None:
        """When the coordinator has not answered the latest update in time: send it again, or give
        up (after its re-sends, or when its round is older than ``forget_before``)."""
        pending = self.unanswered
        if pending is None or now < pending.due_at:
            return
        if pending.round < forget_before or pending.exhausted():
            if pending.exhausted():
                log.warning("%s: round %d's update was never answered after %d re-sends: giving up",
                            self.device_id, pending.round + 1, pending.tries)
            self.unanswered = None
            return
        log.warning("%s: no answer to round %d's update after %.0f s: sending it again",
                    self.device_id, pending.round + 1, time.monotonic() - pending.sent_at)
        env = Envelope.of(pending.update, self.device_id, round=pending.round)
        pending.resent(env.msg_id)
        self.unanswered_resends.append(pending.round)
        self.envelope(env)

    def ask_again_for_stalled(self) -> None:
        """A message from the coordinator whose chunks stopped coming (one was lost on the way)
        is asked for again: `error{code: "incomplete"}` makes it re-send the open round's plan."""
        assert self.link is not None
        for sender, transfer_id, got, count in self.link.expire():
            log.warning("%s: a message from %s stalled at %d/%d chunks: asking for it again",
                        self.device_id, sender, got, count)
            self.send(Error(ErrorCode.INCOMPLETE, f"transfer {transfer_id} timed out with {got}/{count} chunks"), -1)

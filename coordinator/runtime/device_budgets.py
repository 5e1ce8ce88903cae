"""What one device may cost the coordinator: the fleet's per-device budgets.

A device with valid credentials may still be hostile (docs/protocol.md, "Threat model"). Each
device therefore has budgets the coordinator enforces on its own side — error replies per
second, plan re-sends per round, bytes it may have in flight, how fast its claimed sample count
may grow, how often it may report a new measurement — so that what one device does costs the
fleet a bounded, small amount.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_sdk.networking.token_bucket import TokenBucket

__all__ = ["FleetLimits", "TokenBucket", "grown_sample_limit"]


@dataclass(frozen=True)
class FleetLimits:
    """Per-device budgets of a `coordinator.runtime.fleet.Fleet`."""

    #: messages per second a device may have queued for the coordinator (a token bucket per topic,
    #: up to ``message_burst``): the rest are dropped unread and counted as its rejections
    messages_per_s: float = 200.0
    message_burst: int = 2_000
    #: error replies a device gets: a token bucket (sustained per second, burst); the rejections
    #: over it are counted and named in the next reply that goes out
    error_replies_per_s: float = 1.0
    error_reply_burst: int = 10
    #: plan re-sends a participant can ask for (``error{incomplete}``, a reconnect) per round,
    #: at most one every ``plan_resend_interval_s``
    plan_resends_per_round: int = 5
    plan_resend_interval_s: float = 2.0
    #: bytes a device may have in flight (receive queue and reassembly) when it was not asked for
    #: an update; a participant may have ``upload_allowance`` times its plan's bytes on top
    idle_upload_bytes: int = 4 << 20
    upload_allowance: float = 3.0
    #: how far a device's registered sample count may rise per round: by ``sample_growth`` of it,
    #: and at least ``sample_growth_min`` samples (a re-registration cannot jump past that)
    sample_growth: float = 0.1
    sample_growth_min: int = 64
    #: profile updates (a device's new measurement) taken from a device: one per
    #: ``profile_update_interval_s`` on average, up to ``profile_update_burst`` at once (0 s: no limit)
    profile_update_interval_s: float = 60.0
    profile_update_burst: int = 2
    #: the whole fleet's: bytes of a round's plans sent and not yet answered; the round's further
    #: plans wait for answers (`coordinator.runtime.plan_pacer`; 256 MB: 500 plans of cnn4 at once)
    plan_bytes_in_flight: int = 256 << 20
    #: the whole fleet's: bytes of accepted updates kept in memory until they are aggregated; the
    #: rest wait in files (`coordinator.runtime.update_spool`; 512 MB: about 1,000 updates of cnn4)
    updates_in_memory_bytes: int = 512 << 20

    def __post_init__(self) -> None:
        for name in ("messages_per_s", "error_replies_per_s", "plan_resend_interval_s", "upload_allowance",
                     "sample_growth", "profile_update_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"fleet limit {name} must be a finite number >= 0, got {value!r}")
        for name in ("message_burst", "error_reply_burst", "plan_resends_per_round", "idle_upload_bytes",
                     "sample_growth_min", "profile_update_burst", "plan_bytes_in_flight",
                     "updates_in_memory_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"fleet limit {name} must be an integer >= 0, got {value!r}")

        if self.messages_per_s <= 0 or self.message_burst < 1:
            raise ValueError("fleet limits messages_per_s must be > 0 and message_burst >= 1")
        if self.plan_bytes_in_flight < 1:
            raise ValueError("fleet limit plan_bytes_in_flight must be >= 1")
        if self.profile_update_burst < 1:
            raise ValueError("fleet limit profile_update_burst must be >= 1")

    def upload_budget(self, plan_bytes: int) -> int:
        """Bytes a participant sent a plan of ``plan_bytes`` may have in flight."""
        return self.idle_upload_bytes + int(self.upload_allowance * plan_bytes)


def grown_sample_limit(accepted: int, rounds: int, limits: FleetLimits) -> int:
    """The largest sample count a device with ``accepted`` samples may claim ``rounds`` rounds later."""
    if rounds <= 0:
        return accepted
    step = max(limits.sample_growth_min, math.floor(limits.sample_growth * accepted))
    return accepted + rounds * step

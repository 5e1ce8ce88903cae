"""What the coordinator knows about one device: its profile, samples, presence, traffic, the
messages it acknowledged and the rounds it missed (`DeviceRecord`).

The fleet (`coordinator.runtime.fleet.Fleet`) keeps one per registered device and updates it from
the device's messages; the methods read it to assign labels and check updates.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from edge_sdk.data.channel_moments import ChannelMoments
from edge_sdk.profiling import DeviceProfile
from edge_sdk.protocol.capabilities import EVALUATE
from edge_sdk.protocol.messages import FleetStats

__all__ = ["DeviceRecord", "MAX_KEPT_ACKS", "MISS_WINDOW", "MISS_MASK"]

#: How many of a device's latest acknowledgements (the ids of the messages they answer) the fleet keeps.
MAX_KEPT_ACKS = 64


#: How many of a device's latest rounds asked count towards `DeviceRecord.missed_rounds`.
MISS_WINDOW = 4
#: The bits of `DeviceRecord.miss_bits` that count (its last `MISS_WINDOW` rounds asked).
MISS_MASK = (1 << MISS_WINDOW) - 1


@dataclass
class DeviceRecord:
    """What the coordinator knows about one device."""

    device_id: str
    profile: DeviceProfile
    num_samples: int
    online: bool = True
    label: str | None = None
    state: str = "online"
    reason: str = ""
    bytes_down: int = 0
    bytes_up: int = 0
    last_ack: str = ""  # the note of the device's latest acknowledgement, for people (e.g. "model ... installed")
    #: the ``reply_to`` ids of its latest acknowledgements (`MAX_KEPT_ACKS`): what it acknowledged
    #: (`acknowledged`), whatever the note says
    acked: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_KEPT_ACKS))
    #: the newest MQTT connection (`Status.connection`) the device has reported from; a last
    #: will of an older connection is stale and ignored
    connection: int = 0
    offline_since: float = 0.0  # time.monotonic() when it went offline
    #: `Fleet.rounds_collected` when ``num_samples`` was last raised (its growth is counted from there)
    samples_since: int = 0
    #: its latest federated evaluation: (round, samples, correct, label); None: none yet
    last_evaluation: tuple[int, int, int, str] | None = None
    #: the edgefl SDK version it registered with ("" when it did not say)
    sdk_version: str = ""
    #: what it said it can do when it registered: the device parts it trains and features
    #: (`edge_sdk.protocol.capabilities`)
    capabilities: tuple[str, ...] = ()
    #: of the last `MISS_WINDOW` training rounds it was asked for an update, those in which it sent
    #: nothing (no update, no decline) before the round stopped waiting, as bits (bit 0: the
    #: latest); a late update of the latest takes its miss back (`Fleet.collect`)
    miss_bits: int = 0
    #: the latest training round it was asked for an update (-1: none)
    last_asked: int = -1
    #: the round whose miss its late update last took back (at most one in `MISS_WINDOW` rounds)
    took_back: int = -MISS_WINDOW
    #: training samples it holds that it has not trained on, by its latest `data_count` (bounded by
    #: ``num_samples``; 0 again once it trains): what paces rounds by new data
    new_samples: int = 0
    #: held-out samples it holds, by its latest `data_count` (0: it has not said)
    held_out_samples: int = 0
    #: the statistics of its training data it sent (`fleet_stats`), by kind, weighed as far as its
    #: sample count is believed
    stats: dict[str, ChannelMoments | FleetStats] = field(default_factory=dict)

    @property
    def missed_rounds(self) -> int:
        """How many of its last `MISS_WINDOW` rounds asked it missed."""
        return (self.miss_bits & MISS_MASK).bit_count()

    def takes_evaluations(self) -> bool:
        """Does it answer an ``evaluate``? It says so in its capabilities; an SDK 0.4 device that
        names only its device parts answers too (its version is the only sign). Any other would drop
        it, and the evaluation would wait for it until its deadline."""
        return EVALUATE in self.capabilities or self.sdk_version.split(".")[:2] == ["0", "4"]

    def acknowledged(self, msg_id: str) -> bool:
        """Has the device acknowledged the message ``msg_id`` (an `ack` whose ``reply_to`` is it)?"""
        return msg_id in self.acked

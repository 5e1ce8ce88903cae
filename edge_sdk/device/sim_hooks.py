"""What a host that drives many devices in one process (a simulation: simulation/sim_devices.py)
plugs into each one; a real device leaves them all unset and runs on threads of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from edge_sdk.networking.network_loop import NetworkLoop
    from edge_sdk.networking.transport import MqttTransport, TransportConfig

__all__ = ["SimHooks"]


@dataclass
class SimHooks:
    """A device's hooks for its host (`DeviceClient.sim`)."""

    #: where the torch part of a round runs (None: on this device's own thread); simulated
    #: devices of one process hand it to one shared thread (simulation/training_queue.py)
    run_compute: Callable[[Callable[[], object]], object] | None = None
    #: the loop that drives this device's MQTT connection with others' (a simulation's); None:
    #: a network thread of its own (edge_sdk/networking/network_loop.py)
    network: NetworkLoop | None = None
    #: builds this device's connection from its settings (a simulation's host carries many
    #: devices over one: simulation/shared_connection.py); None: an `MqttTransport` of its own
    connect_via: Callable[[TransportConfig], MqttTransport] | None = None
    #: called on the network thread when a message for this device arrived (or `stop` was
    #: called): a host driving many devices by `step` sets it before `open` (None: `run` polls)
    on_ready: Callable[[], None] | None = None
    #: called with the round of every round announcement this device hears (a simulation's host
    #: tells its other devices that the rounds before are over: `forget_updates_before`)
    on_round_start: Callable[[int], None] | None = None
    #: its last update (kept to answer a re-sent plan) is dropped at its next step once it is
    #: older than this round: the coordinator re-sends only the open round's plans
    forget_updates_before: int = -1

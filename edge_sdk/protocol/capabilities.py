"""What a device can do besides training a method's plans: features it names in
`Register.capabilities` beside its device parts (docs/protocol.md, ``register``)."""

from __future__ import annotations

__all__ = ["DATA_COUNT", "EVALUATE", "FEATURES", "FLEET_STATS"]

#: it answers `evaluate`: the served model on its held-out data (federated evaluation)
EVALUATE = "evaluate"
#: it sends `data_count` when its data grows (a coordinator pacing rounds by new data waits for it)
DATA_COUNT = "data_count"
#: it answers `stats_request` with `fleet_stats` (the job's normalisation from the fleet's data)
FLEET_STATS = "fleet_stats"
#: every feature this SDK names
FEATURES: tuple[str, ...] = (EVALUATE, DATA_COUNT, FLEET_STATS)

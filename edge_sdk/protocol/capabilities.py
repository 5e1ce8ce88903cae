"""What a device can do besides training a method's plans: features it names in
`Register.capabilities` beside its device parts (docs/protocol.md, ``register``)."""

from __future__ import annotations

__all__ = ["DATA_COUNT", "EVALUATE", "EVALUATE_BASELINE", "FEATURES", "FLEET_STATS", "SERVE"]

#: it answers `evaluate`: the served model on its held-out data (federated evaluation)
EVALUATE = "evaluate"
#: it also evaluates an ``evaluate``'s ``baseline`` (the published version) on the same held-out
#: samples and answers ``baseline_correct`` (a job that keeps serving compares the two)
EVALUATE_BASELINE = "evaluate_baseline"
#: it sends `data_count` when its data grows (a coordinator pacing rounds by new data waits for it)
DATA_COUNT = "data_count"
#: it answers `stats_request` with `fleet_stats` (the job's normalisation from the fleet's data)
FLEET_STATS = "fleet_stats"
#: it serves its model on live readings (``[serve]``): Home Assistant gets its prediction entities;
#: named only by a device that serves (not in `FEATURES`)
SERVE = "serve"
#: every feature this SDK names
FEATURES: tuple[str, ...] = (EVALUATE, EVALUATE_BASELINE, DATA_COUNT, FLEET_STATS)

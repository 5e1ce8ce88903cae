"""What a device can do besides training a method's plans: features it names in
`Register.capabilities` beside its device parts (docs/protocol.md, ``register``)."""

from __future__ import annotations

__all__ = ["EVALUATE", "FEATURES"]

#: it answers `evaluate`: the served model on its held-out data (federated evaluation)
EVALUATE = "evaluate"
#: every feature this SDK names
FEATURES: tuple[str, ...] = (EVALUATE,)

"""How much a federated accuracy rests on: a 95 % interval for a share of correct answers.

The devices' held-out samples are pooled and treated as independent draws (Wilson's score
interval, which stays inside [0, 1] and is sensible at 0 or n correct and for small n). It does
not widen for devices whose samples resemble each other, so on a non-IID fleet read it as a lower
bound on the uncertainty; the device count is reported beside it for that reason.
"""

from __future__ import annotations

import math

__all__ = ["INTERVAL_KIND", "wilson_interval"]

#: what every report says of its intervals
INTERVAL_KIND = "95% Wilson score interval over the pooled held-out samples"

_Z95 = 1.959963984540054


def wilson_interval(correct: int, samples: int, z: float = _Z95) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``correct / samples`` (``(0, 1)`` for no samples)."""
    if samples <= 0:
        return 0.0, 1.0
    if not 0 <= correct <= samples:
        raise ValueError(f"correct must be in [0, {samples}], got {correct}")
    p = correct / samples
    z2 = z * z
    centre = (p + z2 / (2 * samples)) / (1 + z2 / samples)
    half = z * math.sqrt(p * (1 - p) / samples + z2 / (4 * samples * samples)) / (1 + z2 / samples)
    return max(0.0, centre - half), min(1.0, centre + half)

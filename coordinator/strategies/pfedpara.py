"""pFedPara (Hyeon-Woo et al., ICLR 2022, §3.3): ``W = W1 ⊙ (W2 + 1)``, only ``W1`` is shared.

The network is FedPara's with ``personal`` layers. Plans carry and updates return
only the shared tensors (``W1`` factors, biases, other layers); each device keeps its
``W2`` across rounds in its state directory (:mod:`edge_sdk.methods.pfedpara`), and an
update holding a ``W2`` tensor is rejected. Aggregation is FedPara's on the shared part.

Accuracy: ``global`` is the shared model alone (``W2 = 0``, so ``W = W1``) on the
held-out test data — not what any device runs; ``local`` is the personalised models'
accuracy that the devices measure on a fixed held-out part of their own data
(``holdout``, default 0.2 of each device's shard, never trained on), weighted by
held-out sample counts.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


from coordinator.core.received_update import ReceivedUpdate
from coordinator.strategies.fedpara import FedPara

__all__ = ["PFedPara"]


class PFedPara(FedPara):
    """FedPara with personal ``W2`` factors that stay on the devices."""

    name = "pfedpara"
    personal = True

    def aggregate(self, rnd: int, updates: list[ReceivedUpdate],
                  failures: Mapping[str, str] | None = None) -> dict[str, float]:
        metrics = super().aggregate(rnd, updates, failures)
        self._local = None
        held = [(u.update.metrics["local_acc"], u.update.metrics.get("local_n", 0.0)) for u in updates
                if "local_acc" in u.update.metrics]
        if held and sum(n for _, n in held) > 0:
            self._local = float(np.average([a for a, _ in held], weights=[n for _, n in held]))
            metrics["local_accuracy"] = self._local
        return metrics

    def reported_accuracy(self, rnd: int) -> dict[str, float]:
        """``local``: the devices' accuracy of their personalised models on their held-out data,
        sample-weighted, as reported with this round's updates (none: nothing reported)."""
        local, self._local = getattr(self, "_local", None), None  # this round's reports only
        return {} if local is None else {"local": local}

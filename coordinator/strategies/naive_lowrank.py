"""The naive low-rank baseline (``W = X Yᵀ``) at FedPara's parameter count.

Same round loop, options, γ budget, widths and aggregation as
:class:`coordinator.strategies.fedpara.FedPara`; only the layers differ
(:func:`edge_sdk.models.fedpara_zoo.naive_lowrank_spec`): at a given ``γ`` every layer
has the parameter count of the FedPara layer at that ``γ`` (exactly for linear layers,
to the nearest rank for convs), but its rank is bounded by ``2R`` instead of ``R²``.
``tanh`` does not apply.
"""

from __future__ import annotations

from coordinator.strategies.fedpara import FedPara

from edge_sdk.models.fedpara_zoo import naive_lowrank_spec

__all__ = ["LowRank"]


class LowRank(FedPara):
    """Naive low-rank factors travel instead of FedPara's."""

    name = "lowrank"

    def spec_for(self, gamma: float, width: float) -> dict:
        return naive_lowrank_spec(self.family, self.input_shape, self.num_classes, gamma, width=width,
                                  layer_gammas=dict(self.settings.layer_gammas), **self.zoo_kw)

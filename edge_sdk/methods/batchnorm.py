"""Static BatchNorm (sBN, Diao et al. 2021), shared by the width methods (HeteroFL, FLANC): exact
statistics of a device's data measured after training instead of momentum running averages."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["static_bn_stats", "BN_PREFIX", "STAT_SUFFIXES"]

BN_PREFIX = "bn/"
STAT_SUFFIXES = (".running_mean", ".running_var")

_BN = (nn.BatchNorm1d, nn.BatchNorm2d)


def static_bn_stats(model: nn.Module, x: torch.Tensor, batch_size: int = 256) -> int:
    """Set every tracking BatchNorm's running mean/var to the statistics of its input over ``x``.

    One pass over ``x`` with the BatchNorms normalising by batch statistics (as in
    training) and everything else in eval mode (scalers off); each BatchNorm's input is
    accumulated over all samples, so the mean and (unbiased) variance are exact for the
    whole set, whatever the batch split. Returns the number of BatchNorm layers set;
    the model's modes are restored.
    """
    norms = [m for m in model.modules() if isinstance(m, _BN) and m.track_running_stats]
    if not norms:
        return 0
    sums: dict[nn.Module, list] = {m: [0, 0.0, 0.0] for m in norms}  # count, sum, sum of squares

    def accumulate(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        v = inputs[0].detach().double()
        dims = [d for d in range(v.ndim) if d != 1]
        acc = sums[module]
        acc[0] += v.numel() // v.shape[1]
        acc[1] = acc[1] + v.sum(dim=dims)
        acc[2] = acc[2] + (v * v).sum(dim=dims)

    modes = {m: m.training for m in model.modules()}
    hooks = [m.register_forward_pre_hook(accumulate) for m in norms]
    try:
        model.eval()
        for m in norms:
            m.train()
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                model(x[i:i + batch_size])
            for m in norms:
                count, total, squares = sums[m]
                mean = total / count
                var = (squares / count - mean * mean).clamp_min(0) * count / max(count - 1, 1)
                m.running_mean.copy_(mean.to(m.running_mean.dtype))
                m.running_var.copy_(var.to(m.running_var.dtype))
    finally:
        for h in hooks:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return len(norms)

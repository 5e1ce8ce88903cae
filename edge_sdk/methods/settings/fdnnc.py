"""FDNNC's settings (:mod:`coordinator.strategies.fdnnc`; docs/methods/fdnnc.md) and what a plan asks
of one device (:class:`FdnncRound`, read by :mod:`edge_sdk.methods.fdnnc`)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_sdk.methods.settings.options import boolean, choice, int_list, integer, number, option
from edge_sdk.methods.settings.shared import (ProxSettings, RobustConfig, ServerOptConfig, prox_group, robust_group,
                                              server_group)

__all__ = ["FdnncSettings", "FdnncRound", "PATTERNS", "UPLOADS", "HALF_SPLITS", "UPLOAD_MODES"]

PATTERNS = ("both", "bfirst", "switch")
UPLOADS = ("full", "half")
HALF_SPLITS = ("devices", "rounds")
#: What a plan may ask a device to upload: everything, or with a low-rank model only its A or its B factors.
UPLOAD_MODES = ("full", "a", "b")


@dataclass(frozen=True)
class FdnncSettings:
    """FDNNC (``--option key=value``)."""

    pattern: str = option("both", choice(*PATTERNS), "both, bfirst (big devices first) or switch",
                          doc="`both`, `bfirst` or `switch`")
    upload: str = option("half", choice(*UPLOADS), "small devices upload both factors (full) or one, alternating",
                         doc="`half` (CEFO) or `full`")
    rank: int = option(32, integer(1), "rank of the low-rank FC layers", doc="rank `r` of every factorised FC layer")
    #: FC head widths (for mlp: its hidden layers; minirocket: none unless given)
    hidden: tuple[int, ...] = option((512, 256), int_list(1), "widths of the FC head (for mlp: its hidden layers; "
                                     "minirocket: none unless given)",
                                     doc="FC head widths (for `mlp`: its hidden layers; `minirocket`: none unless "
                                         "given)")
    big_gflops: float = option(10.0, number(0.0, 1e6), "a device is big if its measured GFLOPS ...",
                               doc="a device is big if its measured GFLOPS ...")
    big_ram_mb: int = option(2048, integer(0), "... and its RAM (MB) reach both thresholds",
                             doc="... and its RAM (MB) reach both thresholds")
    #: else: the most capable round(F * N) devices are big
    big_fraction: float | None = option(None, number(0.0, 1.0), "instead: the most capable round(F·N) devices are "
                                        "big", doc="make the `round(F·N)` most capable devices big instead")
    #: bfirst: rounds of big pre-training (None: half the rounds)
    big_rounds: int | None = option(None, integer(0), "bfirst: rounds of big-only training; default: half the rounds",
                                    doc="`bfirst`: rounds of big pre-training", doc_default="rounds // 2")
    freeze: bool = option(False, boolean, "half upload: keep the factor not uploaded fixed while training",
                          doc="`half`: freeze the factor not uploaded while training")
    half_split: str = option("devices", choice(*HALF_SPLITS), "half upload: split a round's small devices between "
                             "A and B (devices), or all send A, then all B (rounds)",
                             doc="`half`: split each round's small devices between `A` and `B` (`devices`), or "
                                 "every small device sends `A` in even rounds and `B` in odd ones (`rounds`)")
    both_weight: str = option("equal", choice("equal", "samples"), "BOTH: W = (ABᵀ + W)/2 (the paper) or weighted "
                              "by each group's samples",
                              doc="`samples`: weight `W` and `A Bᵀ` by the big and small groups' sample counts "
                                  "(+0.4–0.8 points at F = 0.2, BENCHMARKS.md)")
    robust: RobustConfig = robust_group()
    server: ServerOptConfig = server_group()
    prox: ProxSettings = prox_group()


@dataclass(frozen=True)
class FdnncRound:
    """What an FDNNC plan asks of one device: what to upload, and whether to keep the factor it does
    not upload fixed while training (so the uploaded one is trained against the server's)."""

    upload: str = option("full", choice(*UPLOAD_MODES), device=True)
    freeze: bool = option(False, boolean, device=True)

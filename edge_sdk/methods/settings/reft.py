"""REFT's settings (:mod:`coordinator.strategies.reft`; docs/methods/reft.md) and what a plan asks
of one device (:class:`ReftRound`); :mod:`edge_sdk.methods.reft` reads both."""

from __future__ import annotations

from dataclasses import dataclass, replace

from edge_sdk.methods.settings.options import boolean, choice, group, integer, number, option
from edge_sdk.methods.settings.pruning import PruningSettings
from edge_sdk.train_config import TrainConfig
from edge_sdk.methods.settings.shared import DEFAULT_CLIP, ProxSettings, clip_factor, clip_option

__all__ = ["ReftSettings", "ReftRound", "LOGITS_DTYPES", "PUBLIC_DTYPES"]

LOGITS_DTYPES = ("float16", "int8")
PUBLIC_DTYPES = ("uint8", "float16")


@dataclass(frozen=True)
class ReftSettings(PruningSettings):
    """REFT (``--option key=value``): the pruning settings, distillation, the devices' training."""

    temperature: float = option(3.0, number(0.05, 100), "distillation temperature")
    distill_lr: float = option(1e-3, number(1e-7, 1.0), "distillation learning rate (Adam)")
    distill_epochs: int = option(150, integer(1, 100_000), "distillation epochs over the public data")
    distill_batch: int = option(64, integer(1, 65_536), "distillation batch size")
    logits_dtype: str = option("float16", choice(*LOGITS_DTYPES), "how devices send their logits", device=True,
                               doc="how devices send their logits: `float16`, or `int8` (per-row scale)")
    public_dtype: str = option("auto", choice("auto", *PUBLIC_DTYPES), "how the public inputs are sent to devices "
                               "(auto: float16 for series, else uint8)",
                               doc="how the public inputs are sent to devices: `uint8` (one affine map per channel "
                                   "over the whole set) or `float16`; `auto`: `float16` for series whose values "
                                   "float16 holds (their amplitudes differ by orders of magnitude between "
                                   "appliances: PLAID with uint8 0.434 against 0.564), `uint8` otherwise")
    #: use a seeded random subset of this many public inputs (None: all)
    public_samples: int | None = option(None, integer(1, 10_000_000), "a seeded random subset of this many public "
                                        "inputs; default: all",
                                        doc="use a seeded random subset of this many public inputs (a real fleet's "
                                            "`public_dataset` is a whole training split: 60,000 MNIST digits would "
                                            "be 47 MB per device)", doc_default="all")
    oneshot: bool = option(True, boolean, "distil once after one round of local training (the paper)",
                           doc="distil once after one round of local training (the paper); `false`: further rounds "
                               "send the distilled model back, pruned per device")
    #: devices also upload weights so each level's accuracy is reported
    device_eval: bool = option(False, boolean, "devices also upload weights so each level's accuracy is reported",
                               device=True, wire="upload_weights",
                               doc="devices also upload their trained weights so the report has each level's "
                                   "accuracy (`p0.9`, …) next to `global`; this costs upload bytes")
    #: pruned models from a random init stall under SGD lr 0.05
    local_optimizer: str = option("adam", choice("adam", "sgd"), "local optimizer of the pruned models")
    local_lr: float = option(0.003, number(1e-7, 10.0), "local learning rate")
    #: None: the federation's
    local_epochs: int | None = option(None, integer(1, 10_000), "local epochs; default: the run's --local-epochs",
                                      doc_default="the run's")
    #: teacher: importance-weighted mean, or weighted median (robust)
    aggregate: str = option("mean", choice("mean", "median"), "teacher: importance-weighted mean of the logits, "
                            "or weighted median (robust)",
                            doc="`median`: the teacher is the importance-weighted median of per-sample centred "
                                "logits, robust to a device sending poisoned logits "
                                "([robust_aggregation.md](../robust_aggregation.md))")
    #: the teacher's screen: a device's logits longer than Kx the longest other device's are scaled back
    #: (``auto``: 1x; an absolute bound is refused: logit scales differ by model); None: off
    clip: str | None = option(DEFAULT_CLIP, clip_option, "scale back a device's logits longer than Kx the longest "
                              "other device's (auto: 1x); none: off", none="none",
                              doc="the teacher's screen: a device's logits longer than K times the longest of the "
                                  "other devices' logits are scaled back, and its importance with them (`none`, "
                                  "`auto` = `1x`, or `Kx`); not the median, as weight averaging uses: honest "
                                  "teachers' logits differ in length by 100x")
    #: of a class's importance, per device, once 3 or more hold the class
    max_share: float = option(0.5, number(0.0, 1.0), "most of a round's weight one device keeps once 3+ report "
                              "(1: no cap)", doc="once three or more devices hold a class, none keeps more than "
                                                 "`max_share` of its importance")
    prox: ProxSettings = group(ProxSettings, row="FedProx's proximal term in the devices' local training of their "
                               "pruned models (μ/2·‖w − w_received‖²); server optimizers (`server_opt`) are refused: "
                               "REFT averages no weights")

    def __post_init__(self) -> None:
        if self.clip is not None and clip_factor(self.clip) is None:
            raise ValueError(f"reft: option clip: the teacher takes none, auto or a multiple such as 3x, "
                             f"got {self.clip!r}")

    def own_lr(self) -> str:
        """The learning rate devices train with instead of the run's, said to the user."""
        return f"its own local_lr={self.local_lr:g} (--option local_lr=...)"

    def local_train(self, base: TrainConfig) -> TrainConfig:
        """The run's training settings with REFT's local optimizer, lr and epochs."""
        epochs = base.epochs if self.local_epochs is None else self.local_epochs
        return replace(base, optimizer=self.local_optimizer, lr=self.local_lr, epochs=epochs)


@dataclass(frozen=True)
class ReftRound:
    """What a REFT plan tells one device besides its settings: the digest of the public set it
    computes logits on (the set itself travels in its first plan only)."""

    public_digest: str = option("", device=True)

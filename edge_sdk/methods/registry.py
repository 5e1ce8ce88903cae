"""The one registry of federated methods, without torch.

Each method is one :class:`Method`: its name (what ``--method`` and a plan's ``method`` say), its
settings dataclass (:mod:`edge_sdk.methods.settings`), its docs page, the device part its plans
name, and lazy ``"module:attribute"`` entries for what runs it — the device's training function,
the model a device is served where that is not the plan's own, and the coordinator's strategy
class. Everything else is derived from here: :data:`edge_sdk.methods.DEVICE_METHODS` (what a
device can train, its capabilities), the served models (:mod:`edge_sdk.evaluation`),
:data:`coordinator.strategies.STRATEGIES`, ``--option help`` and the docs' options tables.
Importing this module imports no torch: an entry is imported when it is first used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from edge_sdk.methods.settings.fdnnc import FdnncSettings
from edge_sdk.methods.settings.fedavg import FedAvgSettings
from edge_sdk.methods.settings.fedpara import FedParaSettings, LowRankSettings, PFedParaSettings
from edge_sdk.methods.settings.fedprox import FedProxSettings
from edge_sdk.methods.settings.flanc import FlancSettings
from edge_sdk.methods.settings.heterofl import HeteroFLSettings
from edge_sdk.methods.settings.options import help_text
from edge_sdk.methods.settings.reft import ReftSettings
from edge_sdk.methods.settings.static_prune import StaticPruneSettings

__all__ = ["Method", "METHODS", "find_method", "load_entry"]


def load_entry(entry: str) -> Any:
    """What a ``"module:attribute"`` entry names, imported now."""
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Method:
    """One federated method: its name, settings and docs page, and where its parts live."""

    name: str
    settings: type
    doc_page: str
    #: ``"module:Class"`` of its coordinator half (a ``coordinator.strategies`` class)
    strategy: str
    #: ``"module:function"`` its devices run on a plan (None: it trains with ``device_part``'s)
    train: str | None
    #: the device part its plans name (default: its own name)
    device_part: str = ""
    #: ``"module:function"`` building the model a device is served from a plan, where that is not
    #: the plan's model (pFedPara: the device's personal half with the global one)
    served: str | None = None

    def __post_init__(self) -> None:
        if not self.device_part:
            object.__setattr__(self, "device_part", self.name)

    @property
    def doc_path(self) -> str:
        """The page, relative to the repository: ``docs/methods/<page>.md``."""
        return f"docs/methods/{self.doc_page}.md"

    def help(self) -> str:
        """The table ``--option help`` prints."""
        return help_text(self.settings, self.name, self.doc_path)



def _method(name: str, settings: type, module: str, strategy: str, train: str | None = None, *,
            doc_page: str = "", device_part: str = "", served: str | None = None) -> Method:
    return Method(name, settings, doc_page or name, f"coordinator.strategies.{module}:{strategy}",
                  train, device_part, served)


#: Every method, by the name ``--method`` and a plan's ``method`` use.
METHODS: dict[str, Method] = {m.name: m for m in (
    _method("fedavg", FedAvgSettings, "fedavg", "FedAvg", "edge_sdk.methods.fedavg:train_fedavg"),
    _method("fedprox", FedProxSettings, "fedprox", "FedProx", "edge_sdk.methods.fedprox:train_fedprox"),
    _method("flanc", FlancSettings, "flanc", "Flanc", "edge_sdk.methods.flanc:train_flanc"),
    _method("heterofl", HeteroFLSettings, "heterofl", "HeteroFL", "edge_sdk.methods.heterofl:train_heterofl"),
    _method("fdnnc", FdnncSettings, "fdnnc", "Fdnnc", "edge_sdk.methods.fdnnc:train_fdnnc"),
    _method("fedpara", FedParaSettings, "fedpara", "FedPara", "edge_sdk.methods.fedpara:train_fedpara"),
    _method("pfedpara", PFedParaSettings, "pfedpara", "PFedPara", "edge_sdk.methods.pfedpara:train_pfedpara",
            doc_page="fedpara", served="edge_sdk.methods.pfedpara:personal_model"),
    _method("lowrank", LowRankSettings, "naive_lowrank", "LowRank", "edge_sdk.methods.fedpara:train_fedpara",
            doc_page="fedpara"),
    _method("reft", ReftSettings, "reft", "Reft", "edge_sdk.methods.reft:train_reft"),
    _method("static-prune", StaticPruneSettings, "static_prune", "StaticPrune", device_part="fedavg"),
)}


def find_method(name: str) -> Method:
    """The method ``name``; ValueError lists the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None

"""Device parts of the federated methods, looked up by the method name a plan carries.

Importing this package does not import torch: :data:`DEVICE_METHODS` holds each device part of the
registry (:mod:`edge_sdk.methods.registry`) as ``"module:function"`` and imports it when it is
first looked up, and ``LocalData``,
``DeviceContext`` and ``DeviceMethod`` (:mod:`edge_sdk.methods.base`) are imported on first use,
so the methods' settings (:mod:`edge_sdk.methods.settings`) and the CLI's ``--option help`` need
no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, MutableMapping

from edge_sdk.methods.registry import METHODS, load_entry

if TYPE_CHECKING:
    from edge_sdk.methods.base import DeviceContext, DeviceMethod, LocalData

__all__ = ["DeviceContext", "DeviceMethod", "LocalData", "DEVICE_METHODS", "device_method"]


class _DeviceMethods(MutableMapping[str, "DeviceMethod"]):
    """Method name -> its device part; a ``"module:function"`` entry is imported when looked up."""

    def __init__(self, entries: dict[str, "str | Callable[..., Any]"]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> "DeviceMethod":
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = load_entry(entry)
        return entry  # type: ignore[return-value]

    def __setitem__(self, name: str, method: "DeviceMethod") -> None:
        self._entries[name] = method

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"DEVICE_METHODS({sorted(self._entries)})"


#: device part (a plan's ``method``) -> the function a device runs on such a plan: every method of
#: the registry with a device part of its own (static pruning's plans name FedAvg's).
DEVICE_METHODS: MutableMapping[str, "DeviceMethod"] = _DeviceMethods(
    {m.device_part: m.train for m in METHODS.values() if m.train is not None})


def device_method(name: str) -> "DeviceMethod":
    """The device part of method `name`; KeyError names the ones this SDK knows."""
    try:
        return DEVICE_METHODS[name]
    except KeyError:
        raise KeyError(f"this device does not support method {name!r}; "
                       f"it knows {sorted(DEVICE_METHODS)}") from None


def __getattr__(name: str) -> Any:
    if name in ("DeviceContext", "DeviceMethod", "LocalData"):
        from edge_sdk.methods import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

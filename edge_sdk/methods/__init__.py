"""Device parts of the federated methods, looked up by the method name a plan carries."""

from __future__ import annotations

from edge_sdk.methods.base import DeviceContext, DeviceMethod, LocalData
from edge_sdk.methods.fdnnc import train_fdnnc
from edge_sdk.methods.fedavg import train_fedavg
from edge_sdk.methods.fedprox import train_fedprox
from edge_sdk.methods.flanc import train_flanc
from edge_sdk.methods.heterofl import train_heterofl
from edge_sdk.methods.fedpara import train_fedpara
from edge_sdk.methods.pfedpara import train_pfedpara
from edge_sdk.methods.reft import train_reft

__all__ = ["DeviceContext", "DeviceMethod", "LocalData", "DEVICE_METHODS", "device_method"]

#: method name -> the function a device runs on a plan of that method.
DEVICE_METHODS: dict[str, DeviceMethod] = {
    "fedavg": train_fedavg,
    "fedprox": train_fedprox,
    "flanc": train_flanc,
    "heterofl": train_heterofl,
    "fdnnc": train_fdnnc,
    "fedpara": train_fedpara,
    "pfedpara": train_pfedpara,
    "lowrank": train_fedpara,
    "reft": train_reft,
}


def device_method(name: str) -> DeviceMethod:
    """The device part of method `name`; KeyError names the ones this SDK knows."""
    try:
        return DEVICE_METHODS[name]
    except KeyError:
        raise KeyError(f"this device does not support method {name!r}; "
                       f"it knows {sorted(DEVICE_METHODS)}") from None

"""Names that the model zoo and the methods' settings share, torch-free: the settings (and
``--option help``) need them without importing torch, and the models must not import the methods."""

from __future__ import annotations

__all__ = ["COEFF_INITS", "MODEL_FAMILY_NAMES", "width_label"]

#: the zoo's model families (`edge_sdk.models.zoo.MODEL_FAMILIES`, tests/edge_sdk/test_zoo.py ties
#: them), for checking a command's ``--model`` before torch is imported
MODEL_FAMILY_NAMES = ("cnn4", "cnn1d", "flanc_cnn", "resnet_small", "mlp")

#: FLANC's initial coefficients: ``he`` (He-normal), or ``torch`` (PyTorch's default for a 1×1 conv)
COEFF_INITS = ("he", "torch")


def width_label(width: float) -> str:
    """The label of width ``p``: ``"0.25"``, ``"0.5"``, ``"1.0"``."""
    return str(float(width))

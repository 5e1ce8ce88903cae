"""Names that the model zoo and the methods' settings share, torch-free: the settings (and
``--option help``) need them without importing torch, and the models must not import the methods."""

from __future__ import annotations

__all__ = ["COEFF_INITS", "width_label"]

#: FLANC's initial coefficients: ``he`` (He-normal), or ``torch`` (PyTorch's default for a 1×1 conv)
COEFF_INITS = ("he", "torch")


def width_label(width: float) -> str:
    """The label of width ``p``: ``"0.25"``, ``"0.5"``, ``"1.0"``."""
    return str(float(width))

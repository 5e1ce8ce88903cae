"""Names that the model zoo and the methods' settings share, torch-free: the settings (and
``--option help``) need them without importing torch, and the models must not import the methods."""

from __future__ import annotations

__all__ = ["AUTO", "COEFF_INITS", "MINIROCKET_METHODS", "MODEL_FAMILY_NAMES", "default_family", "width_label"]

#: the zoo's model families (`edge_sdk.models.zoo.MODEL_FAMILIES`, tests/edge_sdk/test_zoo.py ties
#: them), for checking a command's ``--model`` before torch is imported
MODEL_FAMILY_NAMES = ("cnn4", "cnn1d", "flanc_cnn", "resnet_small", "mlp", "minirocket")

#: ``--model auto`` (the default): the family the input's shape calls for (`default_family`)
AUTO = "auto"

#: the methods that train a `minirocket` model: its transform is fixed, HeteroFL's widths keep a
#: share of its kernels (their features a prefix of the full width's), and so do REFT's pruning levels
#: (`edge_sdk.models.kernel_subset`), FedPara and FDNNC factorise its head folded by kernel
#: (`edge_sdk.models.folding`); the others reshape every layer
MINIROCKET_METHODS = ("fedavg", "fedprox", "heterofl", "fedpara", "pfedpara", "fdnnc", "reft")


def default_family(input_shape: tuple[int, ...], method: str) -> str:
    """The zoo family a job takes without ``--model``: ``minirocket`` for series ``(C, L)`` (BENCHMARKS.md
    "Series model family"; ``cnn1d`` for the methods that cannot train it), ``cnn4`` for images, ``mlp``
    for feature vectors."""
    if len(input_shape) == 2:
        return "minirocket" if method in MINIROCKET_METHODS else "cnn1d"
    return "cnn4" if len(input_shape) == 3 else "mlp"


#: FLANC's initial coefficients: ``he`` (He-normal), or ``torch`` (PyTorch's default for a 1×1 conv)
COEFF_INITS = ("he", "torch")


def width_label(width: float) -> str:
    """The label of width ``p``: ``"0.25"``, ``"0.5"``, ``"1.0"``."""
    return str(float(width))

"""Your own model as a file: a spec in the architecture-as-data format of :mod:`edge_sdk.models.spec`,
written as JSON or TOML, named ``model = "spec:FILE"`` (coordinator TOML) or ``--model spec:FILE``.

The file is untrusted input like any spec: read with a size bound, then strictly validated
(:func:`~edge_sdk.models.spec.validate_spec`: known layer types, shapes that chain, bounded layers,
parameters and activations); it must be of the job's task (input shape and classes). Every error is
one line that names the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from edge_sdk.models.spec import SpecError, validate_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6, Ubuntu 22.04): the same parser, as the tomli package
    import tomli as tomllib

__all__ = ["SPEC_PREFIX", "MAX_SPEC_FILE_BYTES", "is_spec_file", "load_spec_file"]

#: a model family name that starts so names a spec file
SPEC_PREFIX = "spec:"
#: a spec file larger than this is refused before it is parsed
MAX_SPEC_FILE_BYTES = 1 << 20


def is_spec_file(family: str) -> bool:
    """Whether ``family`` names a spec file (``spec:FILE``) rather than a model family of the zoo."""
    return family.startswith(SPEC_PREFIX)


def load_spec_file(family: str, input_shape: Sequence[int] | None = None, num_classes: int | None = None) -> dict:
    """The validated spec of ``spec:FILE`` (``.json``, or ``.toml``), checked to take ``input_shape``
    and give ``num_classes`` when those are given; ValueError (one line, naming the file) else."""
    path = Path(family[len(SPEC_PREFIX):] if is_spec_file(family) else family).expanduser()
    where = f"model spec file {path}"
    try:
        if path.stat().st_size > MAX_SPEC_FILE_BYTES:
            raise ValueError(f"{where}: larger than {MAX_SPEC_FILE_BYTES} bytes")
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            spec: Any = tomllib.loads(text)
        elif path.suffix == ".json":
            spec = json.loads(text)
        else:
            raise ValueError("must end in .json or .toml")
        validate_spec(spec)
    except (ValueError, SpecError, TypeError) as exc:  # JSONDecodeError, TOMLDecodeError are ValueErrors
        raise ValueError(f"{where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if input_shape is not None and tuple(spec["input_shape"]) != tuple(int(n) for n in input_shape):
        raise ValueError(f"{where}: input_shape {tuple(spec['input_shape'])} is not the task's {tuple(input_shape)}")
    if num_classes is not None and spec["num_classes"] != num_classes:
        raise ValueError(f"{where}: num_classes {spec['num_classes']} is not the task's {num_classes}")
    return spec

"""The ``.ts`` time-series classification format of the UCR/UEA archive (as sktime and aeon ship
it), parsed without pandas: a header of ``@key value`` lines, then ``@data`` and one case per
line — each channel's values comma-separated, channels separated by ``:``, the class label last.

Only what the archive's classification problems use is accepted (no timestamps, no regression
targets); anything else is a one-line `TsFormatError` naming the file and line. Missing values
(``?``) are allowed only where the header says ``@missing true`` and become NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TsFormatError", "TsData", "read_ts", "parse_ts"]

#: the most channels, cases and values per channel a file may hold (far above the archive's)
MAX_CHANNELS = 1024
MAX_CASES = 1_000_000
MAX_LENGTH = 1_000_000

_HEADER_KEYS = {"problemname", "timestamps", "missing", "univariate", "dimensions", "equallength",
                "serieslength", "classlabel", "data"}


class TsFormatError(ValueError):
    """A ``.ts`` file that this parser does not accept."""


@dataclass(frozen=True)
class TsData:
    """A ``.ts`` file's cases: ``series[i]`` is case i, float32 ``(channels, length_i)``;
    ``labels[i]`` its class index into ``classes`` (the header's order)."""

    name: str
    series: tuple[np.ndarray, ...]
    labels: np.ndarray
    classes: tuple[str, ...]
    equal_length: bool

    @property
    def channels(self) -> int:
        return int(self.series[0].shape[0])

    def lengths(self) -> np.ndarray:
        return np.array([s.shape[1] for s in self.series], np.int64)


def _flag(value: str, key: str, where: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise TsFormatError(f"{where}: @{key} must be true or false, got {value[:20]!r}")
    return value.lower() == "true"


def _channel(text: str, missing: bool, where: str, index: int) -> np.ndarray:
    values = text.split(",")
    if len(values) > MAX_LENGTH:
        raise TsFormatError(f"{where}: channel {index} has more than {MAX_LENGTH} values")
    out = np.empty(len(values), np.float32)
    for j, value in enumerate(values):
        value = value.strip()
        if value == "?" or value.lower() == "nan":
            if not missing:
                raise TsFormatError(f"{where}: a missing value ({value!r}) in channel {index}, "
                                    "but the header does not say @missing true")
            out[j] = math.nan
            continue
        try:
            number = float(value)
        except ValueError:
            raise TsFormatError(f"{where}: channel {index} value {j + 1} is not a number: {value[:20]!r}") from None
        if not math.isfinite(number):
            raise TsFormatError(f"{where}: channel {index} value {j + 1} is not finite: {value[:20]!r}")
        out[j] = number
    return out


def parse_ts(text: str, source: str = "<text>") -> TsData:
    """The cases of ``.ts`` text (``source`` names it in errors)."""
    header: dict[str, str] = {}
    series: list[np.ndarray] = []
    labels: list[int] = []
    classes: tuple[str, ...] = ()
    channels = 0
    in_data = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip().lstrip("\ufeff")
        where = f"{source} line {number}"
        if not line or line.startswith("#"):
            continue
        if not in_data:
            if not line.startswith("@"):
                raise TsFormatError(f"{where}: expected an @key line or @data before the cases, got {line[:30]!r}")
            key, _, value = line[1:].partition(" ")
            key, value = key.lower(), value.strip()
            if key not in _HEADER_KEYS:
                raise TsFormatError(f"{where}: unknown header @{key[:30]} (known: "
                                    f"{', '.join('@' + k for k in sorted(_HEADER_KEYS))})")
            if key in header:
                raise TsFormatError(f"{where}: @{key} given twice")
            header[key] = value
            if key == "timestamps" and _flag(value, key, where):
                raise TsFormatError(f"{where}: @timeStamps true is not supported (values only)")
            if key == "classlabel":
                words = value.split()
                if not words or not _flag(words[0], key, where) or len(words) < 2:
                    raise TsFormatError(f"{where}: a classification file needs '@classLabel true' and its labels")
                classes = tuple(words[1:])
                if len(set(classes)) != len(classes):
                    raise TsFormatError(f"{where}: @classLabel names a label twice")
            if key == "data":
                if not classes:
                    raise TsFormatError(f"{where}: @data before '@classLabel true ...' (only classification "
                                        "files are read)")
                in_data = True
            continue
        if len(series) >= MAX_CASES:
            raise TsFormatError(f"{where}: more than {MAX_CASES} cases")
        *fields, label = line.split(":")
        if not fields:
            raise TsFormatError(f"{where}: a case needs its values, ':' and its class label")
        if label.strip() not in classes:
            raise TsFormatError(f"{where}: class label {label.strip()[:30]!r} is not one the header declares "
                                f"({' '.join(classes)[:80]})")
        if channels and len(fields) != channels:
            raise TsFormatError(f"{where}: {len(fields)} channels, the cases before have {channels}")
        channels = len(fields)
        if channels > MAX_CHANNELS:
            raise TsFormatError(f"{where}: more than {MAX_CHANNELS} channels")
        missing = _flag(header.get("missing", "false"), "missing", where)
        case = [_channel(f, missing, where, i + 1) for i, f in enumerate(fields)]
        if len({len(c) for c in case}) != 1:
            raise TsFormatError(f"{where}: its channels differ in length ({', '.join(str(len(c)) for c in case)})")
        series.append(np.stack(case))
        labels.append(classes.index(label.strip()))
    if not in_data:
        raise TsFormatError(f"{source}: no @data line (is it a .ts file?)")
    if not series:
        raise TsFormatError(f"{source}: no cases after @data")
    equal = _flag(header.get("equallength", "true"), "equalLength", source)
    lengths = {s.shape[1] for s in series}
    if equal and len(lengths) != 1:
        first = series[0].shape[1]
        odd = next(i for i, s in enumerate(series) if s.shape[1] != first)
        raise TsFormatError(f"{source}: @equalLength true, but case {odd + 1} has {series[odd].shape[1]} values "
                            f"per channel and case 1 has {first}")
    if "serieslength" in header and equal:
        try:
            stated = int(header["serieslength"])
        except ValueError:
            raise TsFormatError(f"{source}: @seriesLength must be an integer") from None
        if lengths != {stated}:
            raise TsFormatError(f"{source}: @seriesLength {stated}, but the cases have {lengths.pop()} values")
    if "dimensions" in header and header["dimensions"].isdigit() and int(header["dimensions"]) != channels:
        raise TsFormatError(f"{source}: @dimensions {header['dimensions']}, but the cases have {channels} channels")
    return TsData(header.get("problemname", Path(source).stem)[:64], tuple(series),
                  np.array(labels, np.int64), classes, equal)


def read_ts(path: str | Path) -> TsData:
    """The cases of the ``.ts`` file ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such .ts file") from None
    except UnicodeDecodeError as exc:
        raise TsFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return parse_ts(text, str(path))

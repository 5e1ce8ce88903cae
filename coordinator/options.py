"""One way to read ``--option key=value`` settings, for every method and the shared option groups.

A parser takes ``(key, text)`` and returns the typed value or raises a one-line ValueError that
names the option (``option trim: must be in [0, 0.5), got '0.7'``). :func:`parse_keys` applies a
table of parsers to a method's options, rejecting unknown keys with the list of known ones.
Booleans read ``true/false``, ``yes/no``, ``on/off`` and ``1/0`` in any case, everywhere.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

__all__ = ["Parser", "boolean", "number", "integer", "choice", "int_list", "parse_keys", "unknown_keys"]

#: ``(key, text) -> value``; ValueError names the key.
Parser = Callable[[str, str], Any]

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def boolean(key: str, text: str) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0; any case)."""
    low = text.strip().lower()
    if low not in _TRUE + _FALSE:
        raise ValueError(f"option {key}: expected true|false, got {text!r}")
    return low in _TRUE


def number(lo: float, hi: float, *, open_hi: bool = False) -> Parser:
    """A finite number in ``[lo, hi]`` (``[lo, hi)`` with ``open_hi``)."""
    def parse(key: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"option {key}: {text!r} is not a number") from None
        if not math.isfinite(value) or not lo <= value <= hi or (open_hi and value == hi):
            raise ValueError(f"option {key}: must be in [{lo:g}, {hi:g}{')' if open_hi else ']'}, got {text!r}")
        return value
    return parse


def integer(lo: int, hi: int | None = None) -> Parser:
    """An integer ``>= lo`` (and ``<= hi`` when given)."""
    def parse(key: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"option {key}: {text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"option {key}: must be {bound}, got {value}")
        return value
    return parse


def choice(*choices: str) -> Parser:
    """One of ``choices`` (exact)."""
    def parse(key: str, text: str) -> str:
        if text not in choices:
            raise ValueError(f"option {key}: must be one of {'|'.join(choices)}, got {text!r}")
        return text
    return parse


def int_list(lo: int) -> Parser:
    """Comma-separated integers ``>= lo`` (e.g. ``512,256``; empty: none)."""
    one = integer(lo)

    def parse(key: str, text: str) -> tuple[int, ...]:
        return tuple(one(key, item.strip()) for item in text.split(",") if item.strip())
    return parse


def unknown_keys(method: str, options: Mapping[str, Any], known: set[str] | Mapping[str, Any]) -> None:
    """ValueError listing the known keys when ``options`` has any other."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{method}: unknown option(s) {unknown}; known: {sorted(known)}")


def parse_keys(method: str, options: Mapping[str, Any], parsers: Mapping[str, Parser]) -> dict[str, Any]:
    """Every option through its parser (text stripped); unknown keys and bad values raise a
    ValueError that starts with ``method``."""
    unknown_keys(method, options, parsers)
    try:
        return {key: parsers[key](key, str(text).strip()) for key, text in options.items()}
    except ValueError as exc:
        raise ValueError(f"{method}: {exc}") from None

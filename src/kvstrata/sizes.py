"""Parsing and formatting of byte sizes ("512mb", "16G", "1.5gb", "4096") the way Redis config files write them."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1024,
    "m": 1000**2,
    "mb": 1024**2,
    "g": 1000**3,
    "gb": 1024**3,
    "t": 1000**4,
    "tb": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes for a size written as Redis does: ``k``/``m``/``g`` are powers of 1000, ``kb``/``mb``/``gb`` of 1024.

    ``16G`` is read as 16 GiB too, since that is what people mean in flags and environment variables.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    m = _SIZE.match(text.lower())
    if not m:
        raise ValueError("argument must be a memory value")
    number, unit = m.groups()
    if unit not in _UNITS:
        raise ValueError("argument must be a memory value")
    scale = _UNITS[unit]
    # An upper-case single letter (16G, 512M) is the shell convention for binary units.
    if len(unit) == 1 and unit != "b" and text.strip()[-1].isupper():
        scale = _UNITS[unit + "b"]
    return int(number) * scale if "." not in number else int(float(number) * scale)


_MEMORY = re.compile(r"(\d+)(b|k|kb|m|mb|g|gb)?", re.ASCII | re.IGNORECASE)


def parse_memory(text: str) -> int:
    """Bytes for a size as Redis's memtoull reads it in a multi-word setting (client-output-buffer-limit):
    digits and an optional unit of any case (``1G`` is 1000^3 here), no sign, fraction or space."""
    m = _MEMORY.fullmatch(text)
    if m is None:
        raise ValueError("argument must be a memory value")
    return int(m[1]) * _UNITS[(m[2] or "").lower()]


def format_size(n: int) -> str:
    """Human size as INFO's ``*_human`` fields print it (e.g. ``1.50M``)."""
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{int(value)}B" if unit == "B" else f"{value:.2f}{unit}"
        value /= 1024
    return f"{n}B"

"""Sizes in bytes written as text, for configuration files and command lines alike:
``"1048576"``, ``"256MiB"``, ``"2 GiB"``, ``"512KB"`` (units are binary either way)."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["parse_size"]

_SIZE: Final = re.compile(r"\s*(\d+)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_UNITS: Final = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int | None:
    """The bytes ``text`` names, or None when it is not a size (the caller says why)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        return None
    return int(m.group(1)) * _UNITS[(m.group(2) or "")[:1].lower()]

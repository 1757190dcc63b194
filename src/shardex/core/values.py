"""The MISSING value of SQL++.

JSON has ``null``; SQL++ adds MISSING for a field that is absent. ``None`` is null;
``MISSING`` is this singleton. It never appears inside stored documents, only as the result
of evaluating a path that does not exist (and it collates below null in index keys).
"""

from __future__ import annotations

from typing import Any, Final


class _Missing:
    __slots__ = ()
    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        # Pickles (Spark ships closures to workers) must come back as the same singleton.
        return "MISSING"


MISSING: Final = _Missing()

JsonValue = Any  # None | bool | int | float | str | list | dict, or MISSING where allowed


def is_missing(value: object) -> bool:
    return value is MISSING

"""The checkers of a node's configuration values: each takes a key and a raw value (from
TOML or a flag) and returns it typed, or raises ``ConfigError`` naming the key, the value
and a hint."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from shardex.core.sizes import parse_size
from shardex.errors import ConfigError
from shardex.net.transport import split_address

__all__ = [
    "as_bool",
    "as_bytes",
    "as_float",
    "as_host",
    "as_int",
    "as_str_list",
    "config_error",
    "resolve_path",
    "validate_address",
]

HOST_RE = re.compile(r"[A-Za-z0-9_.:%-]{1,253}")


def config_error(key: str, value: Any, problem: str, hint: str) -> ConfigError:
    shown = "<hidden>" if key == "secret" else repr(value)
    return ConfigError(
        f"config key {key!r}: {problem} (got {shown}); {hint}",
        details={"key": key, "value": None if key == "secret" else value, "hint": hint},
    )


def as_int(key: str, value: Any, lo: int, hi: int, hint: str) -> int:
    # bool is an int subclass: ``port = true`` must not quietly become port 1.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise config_error(key, value, "not an integer", hint)
    if not lo <= value <= hi:
        raise config_error(key, value, f"out of range [{lo}, {hi}]", hint)
    return value


def as_float(key: str, value: Any, hint: str) -> float:
    if isinstance(value, bool):
        raise config_error(key, value, "not a number", hint)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise config_error(key, value, "not a number", hint) from None
    if not isinstance(value, int | float):
        raise config_error(key, value, "not a number", hint)
    if not value > 0 or value != value or value == float("inf"):
        raise config_error(key, value, "must be a positive finite number of seconds", hint)
    return float(value)


def as_str_list(key: str, value: Any, hint: str) -> list[str]:
    """A TOML list of strings, or one comma-separated string (the command line form)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise config_error(key, value, "not a string or a list of strings", hint)


def validate_address(key: str, value: str, hint: str) -> str:
    try:
        host, port = split_address(value)
    except ConfigError:
        raise config_error(key, value, "not a host:port address", hint) from None
    if port == 0:
        raise config_error(key, value, "port 0 cannot be a seed", hint)
    return f"{host}:{port}"


def resolve_path(value: Any, key: str, base: Path | None) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise config_error(key, value, "not a path", "give a directory or file path")
    path = Path(value).expanduser()
    # Paths in a config file are relative to that file, so a cluster directory can be moved.
    if not path.is_absolute() and base is not None:
        path = base / path
    return path.absolute()


def as_bytes(key: str, value: Any, lo: int, hint: str) -> int:
    """A size: an integer of bytes, or text such as "256MiB" / "2 GiB" (binary units)."""
    if isinstance(value, str):
        size = parse_size(value)
        if size is None:
            raise config_error(key, value, "not a size", hint)
        value = size
    return as_int(key, value, lo, 1 << 50, hint)


def as_host(key: str, value: Any, hint: str) -> str:
    if not isinstance(value, str) or not HOST_RE.fullmatch(value):
        raise config_error(key, value, "not a host name or IP address", hint)
    return value


def as_bool(key: str, value: Any, hint: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise config_error(key, value, "not a boolean", hint)

"""Atomic file writes: a temp file, fsync, rename, fsync of the directory.

A reader (or a node restarting after a crash) sees the old content or the new, never a torn
file; used for node state, the coordinator's state and the cluster directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    # The rename is only durable once the directory entry is.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, obj: Any, mode: int = 0o644) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), mode)


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the leaf readable by its owner only.

    An existing directory keeps its mode: ``require_private`` then says whether it will do."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def require_private(path: Path, key: str) -> None:
    """Refuse a secret, key file or data dir that other users may read (as PostgreSQL does).

    The cluster secret authenticates every node and client, and a data dir holds every
    document: a group- or world-accessible one would hand both to any local account."""
    from shardex.errors import ConfigError

    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return  # a missing path is reported by whoever reads it, with its own hint
    if mode & 0o077:
        wanted = 0o700 if path.is_dir() else 0o600
        hint = f"chmod {wanted:o} {path}"
        raise ConfigError(
            f"config key {key!r}: {str(path)!r} has mode {mode:04o}: group or other users "
            f"may access it; a node refuses to start until only its owner can ({hint})",
            details={"key": key, "value": str(path), "mode": f"{mode:04o}", "hint": hint},
        )


def read_private_text(path: Path, key: str, what: str) -> str:
    """A one-line secret file (a node secret, Spark's shared secret), stripped: refused when
    others may read it (``require_private``), when it cannot be read, or when it is empty."""
    from shardex.errors import ConfigError

    require_private(path, key)
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(
            f"config key {key!r}: cannot read the {what} file {str(path)!r} ({reason})",
            details={
                "key": key,
                "value": str(path),
                "hint": f"a file holding the {what}, mode 0600",
            },
        ) from None
    if not text:
        raise ConfigError(
            f"config key {key!r}: the {what} file {str(path)!r} is empty",
            details={"key": key, "value": str(path), "hint": "e.g. openssl rand -hex 32 > FILE"},
        )
    return text

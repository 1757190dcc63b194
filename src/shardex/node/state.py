"""What a node keeps in its data dir: identity, last member list, pid and the instance lock.

Layout of ``<data-dir>``::

    node.json      identity: {"format", "name", "member_id", "created_at"}; written once
    members.json   last known member list: {"format", "version", "saved_at", "members"}
    node.pid       pid of the running process (removed on clean stop)
    node.lock      flock'ed for the process lifetime; the kernel drops it at kill -9,
                   so "is a node running on this dir" never trusts a stale pid file
    node.log       the node's log

Every JSON file is written atomically (temp file, fsync, rename, fsync of the directory): a
crash leaves the old or the new version, never a torn one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from shardex.errors import ConfigError, StorageError
from shardex.manager.membership import MemberInfo

IDENTITY_FILE = "node.json"
MEMBERS_FILE = "members.json"
PID_FILE = "node.pid"
LOCK_FILE = "node.lock"
LOG_FILE = "node.log"
FORMAT = 1


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StorageError(
            f"cannot read {path}: {e}",
            details={"path": str(path), "hint": "restore or remove the file"},
        ) from e


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class NodeIdentity(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    member_id: str
    created_at: str


def load_or_create_identity(data_dir: Path, name: str) -> tuple[NodeIdentity, bool]:
    """The persisted identity, or a new one (uuid4) on first start. Returns (identity, new).

    A data dir belongs to one node name for ever: starting it under another name is a
    misconfiguration (two nodes pointed at one dir), so it is refused rather than renamed."""
    path = data_dir / IDENTITY_FILE
    raw = _read_json(path)
    if raw is not None:
        try:
            ident = msgspec.convert(
                {k: raw[k] for k in ("name", "member_id", "created_at")}, NodeIdentity
            )
        except (KeyError, TypeError, msgspec.ValidationError) as e:
            raise StorageError(
                f"{path} is not a valid node identity: {e}", details={"path": str(path)}
            ) from e
        if ident.name != name:
            raise ConfigError(
                f"data dir {data_dir} belongs to node {ident.name!r}, not {name!r}",
                details={
                    "key": "name",
                    "value": name,
                    "hint": f"use --name {ident.name} or another --data-dir",
                },
            )
        return ident, False
    ident = NodeIdentity(name=name, member_id=str(uuid.uuid4()), created_at=_now_iso())
    atomic_write_json(path, {"format": FORMAT, **msgspec.to_builtins(ident)})
    return ident, True


class FileMemberStore:
    """``MemberStore`` over ``<data-dir>/members.json``."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / MEMBERS_FILE

    def load(self) -> list[MemberInfo] | None:
        raw = _read_json(self.path)
        if raw is None:
            return None
        try:
            return msgspec.convert(raw["members"], list[MemberInfo])
        except (KeyError, TypeError, msgspec.ValidationError) as e:
            raise StorageError(
                f"{self.path} is not a valid member list: {e}",
                details={"path": str(self.path), "hint": "remove it; the node re-learns it"},
            ) from e

    def save(self, members: list[MemberInfo]) -> None:
        atomic_write_json(
            self.path,
            {
                "format": FORMAT,
                "version": sum(m.incarnation for m in members),
                "saved_at": _now_iso(),
                "members": msgspec.to_builtins(members),
            },
        )


class InstanceLock:
    """An exclusive ``flock`` on ``<data-dir>/node.lock`` held while the node runs."""

    def __init__(self, data_dir: Path, *, what: str = "node") -> None:
        self.path = data_dir / LOCK_FILE
        self.what = what  # named in the "already running" error
        self._fd: int | None = None

    def acquire(self, wait: float = 1.0) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        # A status probe takes a shared lock for microseconds; retry briefly so a start that
        # races with a probe does not fail with "already running".
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    pid = read_pid(self.path.parent)
                    raise ConfigError(
                        f"another {self.what} process (pid {pid}) is running on {self.path.parent}",
                        details={
                            "key": "data_dir",
                            "value": str(self.path.parent),
                            "hint": "stop it first, or use another --data-dir",
                        },
                    ) from None
                time.sleep(0.05)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def is_locked(data_dir: Path) -> bool:
    """True if a live process holds the node lock of ``data_dir`` (i.e. a node runs there)."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our shared lock, if we got it
    return False


def write_pid(data_dir: Path) -> None:
    atomic_write_bytes(data_dir / PID_FILE, f"{os.getpid()}\n".encode())


def read_pid(data_dir: Path) -> int | None:
    try:
        text = (data_dir / PID_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def remove_pid(data_dir: Path) -> None:
    path = data_dir / PID_FILE
    # Only our own pid file: a newer process may have replaced it.
    if read_pid(data_dir) == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an unreaped child still answers kill 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # The state letter follows the parenthesised command name, which may contain spaces.
    return stat.rpartition(")")[2].split()[:1] != ["Z"]

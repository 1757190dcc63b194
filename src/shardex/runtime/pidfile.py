"""A process's pid file and its instance lock (``flock``) in its data dir: how ``shardex
cluster status`` and restarts tell a running process from a dead one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from shardex.errors import ConfigError
from shardex.runtime.files import atomic_write_bytes

PID_FILE = "node.pid"


LOCK_FILE = "node.lock"


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

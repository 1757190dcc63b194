"""Child processes of tests and benchmarks: their environment, and polling for a condition."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

CLI = [sys.executable, "-m", "shardex.cli.main"]


def proc_env() -> dict[str, str]:
    """Environment for CLI and node processes started by tests.

    Bytecode caching is turned back on, into a directory outside the source tree: every test
    starts a dozen interpreters (CLI, nodes) and recompiling shardex, typer and rich from
    source each time costs about a CPU-second per process."""
    env = dict(os.environ)
    env.pop("SHARDEX_SECRET", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "shardex-pycache"))
    return env


def wait_for(
    cond: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> tuple[Any, float]:
    """Poll ``cond`` until truthy; returns (value, seconds waited). Fails at the deadline."""
    start = time.monotonic()
    deadline = start + timeout
    last: Any = None
    while True:
        last = cond()
        if last:
            return last, time.monotonic() - start
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout}s (last: {last!r})")
        time.sleep(interval)

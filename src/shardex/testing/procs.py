"""Child processes of tests and benchmarks: their environment, and polling for a condition."""

from __future__ import annotations

import asyncio
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


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    """``wait_for`` on the running loop: poll ``cond`` between the loop's other work until it
    holds; fail the test past ``timeout`` seconds (never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() >= deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.002)

"""``kill -USR1`` on a node: every thread's stack (from the signal) and every asyncio task's
coroutine chain (from the loop) land in files of the data directory."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from shardex.node.debug_dump import install_debug_dump


async def test_sigusr1_dumps_threads_and_tasks(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    parked = asyncio.Event()

    async def parked_here() -> None:
        await parked.wait()

    task = asyncio.create_task(parked_here(), name="parked-task")
    uninstall = install_debug_dump(loop, tmp_path)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = loop.time() + 10.0
        while not list(tmp_path.glob("dump-*.txt")):
            assert loop.time() < deadline, "no task dump within 10 s"
            await asyncio.sleep(0.02)
    finally:
        uninstall()
        parked.set()
        await task
    tasks = next(tmp_path.glob("dump-*.txt")).read_text()
    assert "parked-task" in tasks and "parked_here" in tasks
    threads = next(tmp_path.glob("threads-*.txt")).read_text()
    assert "Current thread" in threads or "Thread 0x" in threads

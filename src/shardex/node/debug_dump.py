"""``kill -USR1 <pid>``: a running node writes where every thread and asyncio task is.

For a node that seems stuck (a scan that never answers, a drop that never ends). Threads
are dumped by ``faulthandler`` from the signal itself, so a blocked event loop still shows
them (also threads blocked in C, e.g. RocksDB), appended to ``<data dir>/threads-<pid>.txt``;
then, on the loop, every asyncio task and the coroutine chain it is suspended in goes to
``<data dir>/dump-<pid>-<n>.txt`` (``node.log`` names the file).
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["install_debug_dump"]

log = logging.getLogger(__name__)

_counter = itertools.count(1)


def _dump_tasks(out: IO[str]) -> None:
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    out.write(f"--- {len(tasks)} asyncio task(s)\n")
    for t in tasks:
        out.write(f"\n{t!r}\n")
        t.print_stack(limit=30, file=out)


def install_debug_dump(loop: asyncio.AbstractEventLoop, data_dir: Path) -> Callable[[], None]:
    """SIGUSR1 dumps threads (from the signal itself, so a blocked loop still answers) and
    the loop's tasks. Returns the function that uninstalls it."""
    threads = open(data_dir / f"threads-{os.getpid()}.txt", "a", encoding="utf-8")  # noqa: SIM115

    def on_usr1() -> None:
        path = data_dir / f"dump-{os.getpid()}-{next(_counter)}.txt"
        with open(path, "w", encoding="utf-8") as out:
            _dump_tasks(out)
        log.info("SIGUSR1: tasks in %s, threads in %s", path, threads.name)

    # The loop's handler first: faulthandler's C handler then runs before it (``chain``).
    loop.add_signal_handler(signal.SIGUSR1, on_usr1)
    faulthandler.register(signal.SIGUSR1, file=threads, all_threads=True, chain=True)

    def uninstall() -> None:
        faulthandler.unregister(signal.SIGUSR1)
        loop.remove_signal_handler(signal.SIGUSR1)
        threads.close()

    return uninstall

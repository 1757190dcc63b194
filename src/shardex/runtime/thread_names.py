"""OS-level names for a node's worker threads, so per-thread CPU can be told apart.

CPython 3.11 names its threads only inside Python (``threading.Thread.name``); the kernel
sees every thread under the process's name, so ``top -H``, ``perf`` and ``/proc/<pid>/task/
<tid>/comm`` (what ``bench.diagnostics.pipeline_cpu`` reads to split a node's CPU into its
data write path, indexer and scan pools) cannot tell them apart. ``os_thread_namer(name)`` is a
``ThreadPoolExecutor`` initializer that gives each pool thread ``name`` at the OS level.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

__all__ = ["OS_NAME_MAX", "name_os_thread", "os_thread_namer"]

log = logging.getLogger(__name__)

OS_NAME_MAX = 15  # Linux keeps 16 bytes, the NUL included
_PR_SET_NAME = 15


def _load_prctl() -> Callable[..., int] | None:
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not Linux: names stay as they are
        return None


_prctl = _load_prctl()


def name_os_thread(name: str) -> bool:
    """Name the calling thread ``name`` (cut to ``OS_NAME_MAX`` bytes) for the kernel.
    Returns False where the platform has no ``prctl`` (the name is only a diagnostic)."""
    if not name:
        raise ValueError("an OS thread name must not be empty")
    if _prctl is None:
        return False
    raw = name.encode("utf-8")[:OS_NAME_MAX]
    return _prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0


def os_thread_namer(name: str) -> Callable[[], None]:
    """A ``ThreadPoolExecutor(initializer=...)`` that names each of its threads ``name``."""
    if not name:
        raise ValueError("an OS thread name must not be empty")

    def initializer() -> None:
        if not name_os_thread(name):
            log.debug("OS thread names unsupported here; %s stays unnamed", name)

    return initializer

"""cProfile inside the node processes of a bench cluster (``scan_profile run --profile-nodes``).

The nodes are started by ``shardex cluster start`` (``python -m shardex.cli.node``), which this
bench does not control, so the hook comes in through the environment they inherit: a
``sitecustomize`` module on ``PYTHONPATH`` that, in a ``shardex.cli.node`` process and only when
``SHARDEX_NODE_PROFILE_DIR`` is set, installs two real-time signal handlers: the first starts
a cProfile of the event loop's thread, the second stops it and writes
``<dir>/node-<pid>.prof``. Real-time signals, because a node already uses SIGUSR1 (its
thread and task dump). It shadows any other ``sitecustomize`` of the interpreter for those
processes. cProfile measures wall time (a send that wakes another process counts the time the
scheduler gave that process): on a loaded machine read call counts and the differences between
two runs, not absolute times. ``SHARDEX_NODE_PROFILE_CPU=1`` in the environment times the loop
thread's CPU instead (``time.thread_time``; slower to profile, but what a call costs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["ENV_CPU", "ENV_DIR", "node_profiling", "start_profiles", "stop_profiles"]

ENV_DIR = "SHARDEX_NODE_PROFILE_DIR"
ENV_CPU = "SHARDEX_NODE_PROFILE_CPU"
START = signal.SIGRTMIN + 3
STOP = signal.SIGRTMIN + 4

_SITECUSTOMIZE = f'''\
"""Written by bench.diagnostics.node_profile: profiles a shardex node between two signals."""
import os
import signal
import sys

_out = os.environ.get("{ENV_DIR}")
if _out and "shardex.cli.node" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    import cProfile

    if os.environ.get("{ENV_CPU}"):
        import time

        _prof = cProfile.Profile(time.thread_time)
    else:
        _prof = cProfile.Profile()

    def _stop(*_):
        _prof.disable()
        _prof.dump_stats(os.path.join(_out, f"node-{{os.getpid()}}.prof"))
        _prof.clear()

    signal.signal(signal.SIGRTMIN + 3, lambda *_: _prof.enable())
    signal.signal(signal.SIGRTMIN + 4, _stop)
'''


@contextlib.contextmanager
def node_profiling(out: Path) -> Iterator[None]:
    """Node processes started inside this block can be profiled into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", ENV_DIR)}
    with tempfile.TemporaryDirectory(prefix="shardex-nodeprof-") as site:
        (Path(site) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = site if not path else f"{site}{os.pathsep}{path}"
        os.environ[ENV_DIR] = str(out.resolve())
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def start_profiles(pids: Sequence[int]) -> None:
    for pid in pids:
        os.kill(pid, START)


def stop_profiles(pids: Sequence[int], out: Path, timeout: float = 10.0) -> list[Path]:
    """Stop the profiles and wait until every node wrote its file; returns the files."""
    files = [out / f"node-{pid}.prof" for pid in pids]
    for f in files:
        f.unlink(missing_ok=True)
    for pid in pids:
        os.kill(pid, STOP)
    deadline = time.monotonic() + timeout
    while not all(f.exists() and f.stat().st_size > 0 for f in files):
        if time.monotonic() > deadline:
            raise RuntimeError(f"node profiles not written within {timeout}s: {files}")
        time.sleep(0.05)
    return files

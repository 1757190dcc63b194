"""CPU time of processes from ``/proc`` (Linux): a process's own (every thread's user +
system time, ``/proc/<pid>/stat``), or a process and its live children (a PostgreSQL
postmaster and its backends, walsender, walreceiver). 10 ms ticks: read it over windows of
at least a few seconds."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["process_cpu", "tree_cpu"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields after ``comm`` of ``/proc/<pid>/stat`` (comm may hold spaces), or None
    when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _cpu(fields: list[str]) -> float:
    # After comm: state(0) ppid(1) ... utime(11) stime(12), in clock ticks.
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu(pids: Iterable[int]) -> float:
    """Seconds of CPU used so far by ``pids`` (gone ones count 0)."""
    total = 0.0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            total += _cpu(fields)
    return total


def tree_cpu(roots: Iterable[int]) -> float:
    """Seconds of CPU used so far by each of ``roots`` and its live direct children (a
    child that exited takes its time with it: keep the children alive across a window)."""
    wanted = set(roots)
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is not None and (int(entry) in wanted or int(fields[1]) in wanted):
            total += _cpu(fields)
    return total

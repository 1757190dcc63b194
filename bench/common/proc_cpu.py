"""CPU time of processes from ``/proc`` (Linux): a process's own (every thread's user +
system time, ``/proc/<pid>/stat``), or a process and its children, live or reaped (a
PostgreSQL postmaster and its backends, walsender, walreceiver, and the parallel query
workers and autovacuum workers that come and go). 10 ms ticks: read it over windows of at
least a few seconds."""

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


def _reaped_cpu(fields: list[str]) -> float:
    # cutime(13) cstime(14): the children the process has waited for (a child's time moves
    # there when its parent reaps it).
    return (int(fields[13]) + int(fields[14])) / _TICK


def process_cpu(pids: Iterable[int]) -> float:
    """Seconds of CPU used so far by ``pids`` (gone ones count 0)."""
    total = 0.0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            total += _cpu(fields)
    return total


def tree_cpu(roots: Iterable[int]) -> float:
    """Seconds of CPU used so far by each of ``roots`` and its direct children: the live
    ones' own, and the exited ones' once the root has reaped them (a child exited but not
    yet reaped counts nothing until then; a window's difference is right once it is)."""
    wanted = set(roots)
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None:
            continue
        if int(entry) in wanted:
            total += _cpu(fields) + _reaped_cpu(fields)
        elif int(fields[1]) in wanted:
            total += _cpu(fields)
    return total

"""What the stream readers measure about Spark's calls into them (the ``stats_path`` file).

Spark runs a streaming Python source in a runner process of its own and calls it over a
socket, once per method call: per micro-batch ``latestOffset`` and ``reportLatestOffset``
(Spark's "latestOffset" phase), ``commit`` of the previous batch (inside "walCommit") and
``partitions`` (inside "queryPlanning"). Spark's ``durationMs`` gives each phase as a whole;
this records the part spent in our code per call, and the time between the end of
``latestOffset`` and the start of ``reportLatestOffset``: nothing of ours runs in between,
so that gap is one bare JVM -> runner round trip (the JVM reading the reply, sending the next
call, this process waking up), the unit every call pays on top of its own work.
"""

from __future__ import annotations

import collections
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SAMPLES = 512  # recent samples kept per call, for medians


class SourceCallStats:
    """Counters (``counts``: the keys older tools read) plus per-call timings."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {"latest_calls": 0, "rpc_calls": 0, "rpc_seconds": 0.0}
        self._samples: dict[str, collections.deque[float]] = {}
        self._calls: collections.Counter[str] = collections.Counter()
        self._last_end: dict[str, float] = {}
        self._written = 0.0
        # Set by latestOffset: the trigger found nothing new. Its calls are sampled apart
        # ("... idle"): idle polls are many and cheap, and would drown a batch's figures.
        self.idle = False

    def __getitem__(self, key: str) -> float:
        return self.counts[key]

    def __setitem__(self, key: str, value: float) -> None:
        self.counts[key] = value

    def sample(self, name: str, seconds: float) -> None:
        q = self._samples.get(name)
        if q is None:
            q = self._samples[name] = collections.deque(maxlen=SAMPLES)
        q.append(seconds)

    @contextlib.contextmanager
    def call(self, name: str, gap_after: str | None = None) -> Iterator[None]:
        """Time one call from Spark. ``gap_after``: also record the time since the call of
        that name ended (``<gap_after>-><name>`` in the samples)."""
        t0 = time.perf_counter()
        last = None if gap_after is None else self._last_end.pop(gap_after, None)
        try:
            yield
        finally:
            t1 = time.perf_counter()
            suffix = " idle" if self.idle else ""
            if last is not None:
                self.sample(f"{gap_after}->{name}{suffix}", t0 - last)
            self._calls[name + suffix] += 1
            self.sample(name + suffix, t1 - t0)
            self._last_end[name] = t1

    def snapshot(self) -> dict[str, Any]:
        """Counters, calls per name and the median ms of every sampled name."""
        out: dict[str, Any] = dict(self.counts)
        out["calls"] = dict(self._calls)
        out["median_ms"] = {
            k: round(statistics.median(q) * 1e3, 3) for k, q in self._samples.items() if q
        }
        out["samples"] = {k: len(q) for k, q in self._samples.items()}
        return out

    def write(self, path: str | None, force: bool = False) -> None:
        """Write the snapshot to ``path`` (atomically), at most once a second unless forced."""
        now = time.monotonic()
        if path is None or (not force and now - self._written < 1.0):
            return
        self._written = now
        with contextlib.suppress(OSError):
            tmp = Path(path + ".tmp")
            tmp.write_text(json.dumps(self.snapshot()))
            tmp.replace(path)

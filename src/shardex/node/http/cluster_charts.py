"""The console's charts of the whole cluster (``GET /api/charts``): the serving node gathers
every member's ``MetricsSample`` (its own in-process, the others' over the node-to-node RPC,
all at once under a short bound), keeps the snapshots of the last minutes, and turns each
two consecutive snapshots into per-node and cluster-wide points.

Sampling happens when asked (a console polling the charts), at most once per ``every``
seconds whatever the number of consoles: a cluster nobody looks at pays nothing. The
history is this node's (another node's console starts its own); a node that does not answer
in time is listed as unreachable and has no point at that moment (its line has a gap), the
total then being of the nodes that answered.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from shardex.api.node import MetricsSample, MetricsSampleRequest
from shardex.net.messages import Message

__all__ = ["TOTAL", "ClusterCharts", "Snapshot", "points"]

SPAN: Final = 300.0  # seconds of history kept and drawn
EVERY: Final = 2.0  # seconds between samples, at most one per this whatever the consoles
ASK_TIMEOUT: Final = 1.5  # seconds a peer gets to answer (a slow one leaves a gap)
TOTAL: Final = "total"  # the series of the whole cluster
# chart -> how its per-node values are computed from two snapshots (see ``points``)
CHARTS: Final = ("kv_ops", "sql_statements", "freshness", "scan_latency_ms")

Ask = Callable[[str, Message, float], Awaitable[Message]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster at one moment as this node gathered it: ``at`` (wall seconds, this
    node's clock), each answering node's sample, and the nodes that did not answer."""

    at: float
    samples: dict[str, MetricsSample]
    unreachable: tuple[str, ...] = ()


def points(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """chart -> series (node name or ``TOTAL``) -> value at ``after``:

    - ``kv_ops`` and ``sql_statements``: each node's counter's increase per second between
      the two snapshots (a node that restarted counts from zero); the total, their sum;
    - ``scan_latency_ms``: each node's mean time to the first reply of the scans it timed
      in between; the total, all those scans' mean (no scan: no point);
    - ``freshness``: the seqnos the node's most lagging index is behind; the total, the
      most lagging index's lag summed over the nodes (each partition is active on one node).

    A node only in one of the two snapshots has no rate or latency point (its line starts
    at the next one); its freshness is a gauge and needs only ``after``."""
    dt = after.at - before.at
    out: dict[str, dict[str, float]] = {c: {} for c in CHARTS}
    if dt <= 0:
        return out
    scan_sum = scan_count = 0.0
    for name, now in sorted(after.samples.items()):
        was = before.samples.get(name)
        if was is None:
            continue
        for chart in ("kv_ops", "sql_statements"):
            grown = getattr(now, chart) - getattr(was, chart)
            rate = (grown if grown >= 0 else getattr(now, chart)) / dt  # < 0: restarted
            out[chart][name] = rate
            out[chart][TOTAL] = out[chart].get(TOTAL, 0.0) + rate
        n = now.scans - was.scans
        if n > 0:
            spent = now.scan_seconds - was.scan_seconds
            out["scan_latency_ms"][name] = spent / n * 1000
            scan_sum += spent
            scan_count += n
    if scan_count > 0:
        out["scan_latency_ms"][TOTAL] = scan_sum / scan_count * 1000
    by_index: dict[str, float] = {}
    for name, now in sorted(after.samples.items()):
        if now.freshness:
            out["freshness"][name] = max(now.freshness.values())
            for index, lag in now.freshness.items():
                by_index[index] = by_index.get(index, 0.0) + lag
    if by_index:
        out["freshness"][TOTAL] = max(by_index.values())
    return out


class ClusterCharts:
    """The serving node's history of the cluster's samples and the charts drawn from it.

    ``own`` reads this node's sample in-process; ``peers`` names the other members to ask
    (name, RPC address); ``ask`` sends them a ``MetricsSampleRequest`` (the node's pool)."""

    def __init__(
        self,
        own: Callable[[], MetricsSample],
        peers: Callable[[], list[tuple[str, str]]],
        ask: Ask,
        *,
        span: float = SPAN,
        every: float = EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._own = own
        self._peers = peers
        self._ask = ask
        self.span = span
        self.every = every
        self._clock = clock
        self.history: collections.deque[Snapshot] = collections.deque()
        self._sampling: asyncio.Future[Snapshot] | None = None

    async def gather(self) -> Snapshot:
        """Every member's sample now: this node's and each peer's, asked all at once."""
        peers = self._peers()
        at = self._clock()
        mine = self._own()
        answers = await asyncio.gather(
            *(self._ask_one(address) for _name, address in peers), return_exceptions=True
        )
        samples = {mine.node: mine}
        unreachable = []
        for (name, _address), got in zip(peers, answers, strict=True):
            if isinstance(got, MetricsSample):
                samples[got.node] = got
            else:
                unreachable.append(name)
        return Snapshot(at, samples, tuple(unreachable))

    async def _ask_one(self, address: str) -> Message:
        return await self._ask(address, MetricsSampleRequest(), ASK_TIMEOUT)

    async def sample(self) -> Snapshot:
        """The newest snapshot, gathered anew when the last one is older than ``every``
        (most of it: polls at ``every`` land on either side of the mark); concurrent callers
        share one gathering."""
        now = self._clock()
        if self.history and now - self.history[-1].at < self.every * 0.75:
            return self.history[-1]
        if self._sampling is None:
            self._sampling = asyncio.ensure_future(self.gather())
            try:
                snap = await asyncio.shield(self._sampling)
            finally:
                self._sampling = None
            self.history.append(snap)
            while self.history and self.history[0].at < snap.at - self.span:
                self.history.popleft()
            return snap
        return await asyncio.shield(self._sampling)

    async def charts(self) -> dict[str, Any]:
        """What ``GET /api/charts`` answers: every chart's series as ``[[ms, value], ...]``
        over the history, the nodes of the latest snapshot and the latest samples."""
        last = await self.sample()
        series: dict[str, dict[str, list[list[float]]]] = {c: {} for c in CHARTS}
        snaps = list(self.history)
        for before, after in itertools.pairwise(snaps):
            for chart, values in points(before, after).items():
                for name, v in values.items():
                    series[chart].setdefault(name, []).append([round(after.at * 1000), v])
        return {
            "now": round(self._clock() * 1000),
            "span_seconds": self.span,
            "every_seconds": self.every,
            "nodes": sorted(last.samples),
            "unreachable": list(last.unreachable),
            "samples": {
                name: {
                    "kv_ops": s.kv_ops,
                    "sql_statements": s.sql_statements,
                    "scans": s.scans,
                    "scan_seconds": s.scan_seconds,
                    "freshness": s.freshness,
                }
                for name, s in sorted(last.samples.items())
            },
            "charts": {
                chart: {n: lines[n] for n in sorted(lines, key=lambda n: (n == TOTAL, n))}
                for chart, lines in series.items()
            },
        }

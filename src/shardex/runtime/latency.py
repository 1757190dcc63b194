"""Latency histograms cheap enough for a hot path: one observation is a ``bisect`` into
fixed bucket bounds, one list increment and one float add (no lock, no label lookup beyond
one dict read).

Services keep their own ``Latencies`` (the data service per KV operation, the scan
coordinator per consistency, ...) and observe into them on the event loop thread only: no
lock is taken, so two threads observing into the same histogram could lose a count. The
node's metrics endpoint (``shardex.node.metrics``) reads them at scrape time and exposes
them as Prometheus histograms; nothing here knows of Prometheus.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterator
from typing import Final, Generic, TypeVar

__all__ = ["DEFAULT_BOUNDS", "Histogram", "Latencies"]

K = TypeVar("K", bound=Hashable)

# Upper bounds in seconds (Prometheus' ``le``): 50 us to 10 s, about 2.5x apart. A KV get on
# the loop is tens of microseconds, an fsynced write milliseconds, a SQL statement anything.
DEFAULT_BOUNDS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)


class Histogram:
    """Counts per bucket (``counts[i]``: observations ``<= bounds[i]`` and above the bound
    before; the last slot: above every bound) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = DEFAULT_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ``inf`` last: Prometheus' buckets."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class Latencies(Generic[K]):
    """One ``Histogram`` per key (an operation kind, a consistency, an outcome, or a tuple
    of them), made on its first observation."""

    __slots__ = ("_bounds", "_by")

    def __init__(self, bounds: tuple[float, ...] = DEFAULT_BOUNDS) -> None:
        self._bounds = bounds
        self._by: dict[K, Histogram] = {}

    def observe(self, key: K, seconds: float) -> None:
        h = self._by.get(key)
        if h is None:
            h = self._by[key] = Histogram(self._bounds)
        h.counts[bisect_left(h.bounds, seconds)] += 1
        h.total += seconds

    def get(self, key: K) -> Histogram | None:
        return self._by.get(key)

    def items(self) -> Iterator[tuple[K, Histogram]]:
        """(key, histogram) pairs; a copy of the map, safe beside observers."""
        return iter(list(self._by.items()))

    def merged(self, group: Callable[[K], str]) -> dict[str, Histogram]:
        """The histograms summed by ``group(key)`` (a scrape's view of one label of a
        tuple key)."""
        out: dict[str, Histogram] = {}
        for key, h in self.items():
            m = out.get(g := group(key))
            if m is None:
                m = out[g] = Histogram(h.bounds)
            m.counts = [a + b for a, b in zip(m.counts, h.counts, strict=True)]
            m.total += h.total
        return out

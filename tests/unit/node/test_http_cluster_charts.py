"""The console's cluster-wide charts (``cluster_charts.py``): the serving node gathers its
own sample and every peer's, and each two snapshots become per-node points and a total that
is the sum (rates, freshness) or the pooled mean (scan latency) of every node's numbers."""

from __future__ import annotations

import asyncio

import pytest

from shardex.api.node import MetricsSample, MetricsSampleRequest
from shardex.errors import NodeUnavailable
from shardex.net.messages import Message
from shardex.node.http.cluster_charts import TOTAL, ClusterCharts, Snapshot, points


def _sample(
    node: str, kv: float, sql: float = 0, spent: float = 0, scans: float = 0, **fresh: float
) -> MetricsSample:
    return MetricsSample(
        node=node, kv_ops=kv, sql_statements=sql, scan_seconds=spent, scans=scans, freshness=fresh
    )


def test_points_per_node_and_total() -> None:
    before = Snapshot(
        100.0,
        {
            "n1": _sample("n1", 10, 1, 0.5, 5),
            "n2": _sample("n2", 20, 0, 1.0, 10),
            "n3": _sample("n3", 30, 2, 0.0, 0),
        },
    )
    after = Snapshot(
        102.0,
        {
            "n1": _sample("n1", 30, 3, 0.5 + 0.004, 5 + 2, **{"k.a": 4, "k.b": 1}),
            "n2": _sample("n2", 60, 0, 1.0 + 0.018, 10 + 2, **{"k.a": 6}),
            "n3": _sample("n3", 36, 2, 0.0, 0, **{"k.b": 50}),
        },
    )
    got = points(before, after)
    assert got["kv_ops"] == {"n1": 10.0, "n2": 20.0, "n3": 3.0, TOTAL: 33.0}
    assert got["sql_statements"] == {"n1": 1.0, "n2": 0.0, "n3": 0.0, TOTAL: 1.0}
    # per node the mean of its own scans; the total pools every node's scans (no scan: none)
    assert got["scan_latency_ms"] == pytest.approx({"n1": 2.0, "n2": 9.0, TOTAL: 5.5})
    # a node's most lagging index; the cluster's: the most lagging index over every node
    assert got["freshness"] == {"n1": 4, "n2": 6, "n3": 50, TOTAL: 51}


def test_a_node_new_in_the_later_snapshot_or_restarted() -> None:
    before = Snapshot(0.0, {"n1": _sample("n1", 100)})
    after = Snapshot(1.0, {"n1": _sample("n1", 7), "n2": _sample("n2", 50, **{"k.i": 3})})
    got = points(before, after)
    assert got["kv_ops"] == {"n1": 7.0, TOTAL: 7.0}  # restarted: counts from zero
    assert got["freshness"] == {"n2": 3, TOTAL: 3}  # a gauge needs one snapshot
    assert points(after, after) == {c: {} for c in got}  # no time between: no point


class Peers:
    """Two peers answering the node-only request, one of them down."""

    def __init__(self) -> None:
        self.kv = {"a2": 5.0, "a3": 7.0}
        self.asked: list[tuple[str, str, float]] = []

    async def ask(self, address: str, msg: Message, timeout: float) -> Message:
        assert isinstance(msg, MetricsSampleRequest)
        self.asked.append((address, type(msg).__name__, timeout))
        if address == "a4":
            raise NodeUnavailable("down", details={})
        await asyncio.sleep(0)
        name = "n" + address[1:]
        return _sample(name, self.kv[address])


async def test_charts_gather_every_peer_and_sum_them() -> None:
    peers = Peers()
    clock = [1000.0]
    own = [1.0]
    charts = ClusterCharts(
        lambda: _sample("n1", own[0]),
        lambda: [("n2", "a2"), ("n3", "a3"), ("n4", "a4")],
        peers.ask,
        clock=lambda: clock[0],
    )
    first = await charts.charts()
    assert first["nodes"] == ["n1", "n2", "n3"] and first["unreachable"] == ["n4"]
    assert {n: s["kv_ops"] for n, s in first["samples"].items()} == {"n1": 1, "n2": 5, "n3": 7}
    assert sorted(a for a, _, _ in peers.asked) == ["a2", "a3", "a4"]
    clock[0] += 0.5  # within the sampling interval: the same snapshot, nobody asked again
    assert (await charts.charts())["samples"] == first["samples"] and len(peers.asked) == 3
    clock[0] += 1.5
    own[0], peers.kv["a2"], peers.kv["a3"] = 3.0, 9.0, 13.0
    got = (await charts.charts())["charts"]["kv_ops"]
    assert list(got) == ["n1", "n2", "n3", TOTAL]
    assert got == {
        "n1": [[1_002_000, 1.0]],
        "n2": [[1_002_000, 2.0]],
        "n3": [[1_002_000, 3.0]],
        TOTAL: [[1_002_000, 6.0]],
    }


async def test_history_keeps_the_span() -> None:
    clock = [0.0]
    charts = ClusterCharts(
        lambda: _sample("n1", clock[0]),
        lambda: [],
        Peers().ask,
        span=10,
        every=2,
        clock=lambda: clock[0],
    )
    for _ in range(20):
        await charts.sample()
        clock[0] += 2
    assert [s.at for s in charts.history] == [28.0, 30.0, 32.0, 34.0, 36.0, 38.0]
    assert [v for _, v in (await charts.charts())["charts"]["kv_ops"]["n1"]][-1] == 1.0

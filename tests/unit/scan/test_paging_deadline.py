"""A paginated scan's first page waits for stability under ONE deadline:
every topology retry of its ``WaitStability`` gets only the time that is left, so partitions
moving under it cannot stretch the wait to attempts x timeout."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from shardex.api.scan import AT_PLUS, STABILITY_NONE, StabilityAt, WaitStability
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index import make_definition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.scan.paging_store_proxy import RPC_MARGIN, PagingService
from shardex.scan.paging_store_spec import PageScan

DEFN = make_definition(
    id="ix", name="by_k", keyspace="ks", keys=["k"], partition_by=["k"], num_partition=2
)
REC = IndexRecord(definition=DEFN, state=ACTIVE)
AT = Timestamp({0: (5, 1)})
SPENT = 4.0  # seconds each owner waits before its partition moves away


class _Cluster:
    """Indexers whose partition moves on while they wait: each ``WaitStability`` takes
    ``SPENT`` seconds of the (virtual) loop clock, then the owner refuses with a retryable
    STALE_TOPOLOGY; the master then names the next owner (the index's slices all on one node,
    so each attempt is one request)."""

    def __init__(self, now: list[float], moves: int) -> None:
        self.now = now
        self.moves = moves
        self.topo = Topology(seq_num=1, assignment={0: "n1", 1: "n1"})
        self.asked: list[tuple[float, float]] = []  # (WaitStability.timeout, RPC timeout)

    async def request(self, address: str, req: Any, timeout: float, expect: Any) -> Any:
        assert isinstance(req, WaitStability)
        self.asked.append((req.timeout, timeout))
        self.now[0] += SPENT
        if self.moves > 0:
            self.moves -= 1
            owner = f"n{self.topo.seq_num + 1}"
            self.topo = Topology(seq_num=self.topo.seq_num + 1, assignment={0: owner, 1: owner})
            raise ShardexError("moved", code=ErrorCode.STALE_TOPOLOGY, details={"retryable": True})
        return StabilityAt(node=address.split(":")[0], ts=dict(AT.to_wire()))

    async def resolve(self, keyspace: str, index: str, fresh: bool = False) -> Any:
        return REC, self.topo


async def _no_owners(keyspace: str) -> dict[str, list[int]]:
    return {}  # no data topology: the at_plus tokens are taken as they are


def _service(cluster: _Cluster) -> Any:
    return SimpleNamespace(
        pool=cluster,
        view=SimpleNamespace(address=lambda node: f"{node}:1", data_owners=_no_owners),
        scan=SimpleNamespace(resolve=cluster.resolve),
    )


def _page(timeout: float) -> PageScan:
    return PageScan(
        keyspace="ks", index="by_k", page_size=10, consistency=AT_PLUS,
        at=dict(AT.to_wire()), timeout=timeout,
    )  # fmt: skip


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The running loop's clock, moved only by the fake indexers (nothing here sleeps)."""
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    return now


async def test_each_retry_waits_only_for_what_is_left_of_the_timeout(clock: list[float]) -> None:
    cluster = _Cluster(clock, moves=2)
    start = clock[0]
    pin, lease, used = await PagingService._first_snapshot(
        _service(cluster), _page(10.0), REC, cluster.topo, STABILITY_NONE
    )
    assert (pin, lease, used.seq_num) == (None, "", 3)
    # Two attempts refused after 4 s each: the third waits the 2 s left, not 10 again.
    assert [w for w, _ in cluster.asked] == [10.0, 6.0, 2.0]
    assert all(rpc == w + RPC_MARGIN for w, rpc in cluster.asked)
    assert clock[0] - start == 3 * SPENT


async def test_no_retry_starts_once_the_deadline_passed(clock: list[float]) -> None:
    cluster = _Cluster(clock, moves=2)
    with pytest.raises(ShardexError) as err:
        await PagingService._first_snapshot(
            _service(cluster), _page(8.0), REC, cluster.topo, STABILITY_NONE
        )
    assert err.value.code is ErrorCode.SCAN_TIMEOUT and err.value.details["timeout"] == 8.0
    assert [w for w, _ in cluster.asked] == [8.0, 4.0]  # no third ask

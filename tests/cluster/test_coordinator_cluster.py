"""The coordinator with real node processes: kill -9 the master, a replica takes over under a
new term, and the killed node comes back as a replica with the new master's state."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import running_cluster

from shardex.errors import ShardexError
from shardex.manager.coordinator import StateReply, StateRequest
from shardex.net import TcpTransport, connect
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster


def views(cluster: LocalCluster, nodes: list[int]) -> dict[int, StateReply | None]:
    """Every node's own answer (its replicated copy and the master it knows)."""

    async def ask(i: int) -> StateReply | None:
        try:
            conn = await connect(
                TcpTransport(), cluster.address(i), cluster.secret(), name="test", timeout=2
            )
        except ShardexError:
            return None
        try:
            return await conn.request(StateRequest(sections=[]), 2.0, expect=StateReply)
        except ShardexError:
            return None
        finally:
            await conn.close()

    async def all_views() -> dict[int, StateReply | None]:
        replies = await asyncio.gather(*(ask(i) for i in nodes))
        return dict(zip(nodes, replies, strict=True))

    return asyncio.run(all_views())


def agreed(cluster: LocalCluster, nodes: list[int]) -> tuple[str, int, int] | None:
    """(master, epoch, cas) if every node answers with one master and one state version."""
    vs = views(cluster, nodes)
    if any(v is None for v in vs.values()):
        return None
    seen = {(v.master, v.state.epoch, v.state.cas) for v in vs.values() if v is not None}
    masters = [i for i, v in vs.items() if v is not None and v.is_master]
    if len(seen) != 1 or len(masters) != 1:
        return None
    (master, epoch, cas) = seen.pop()
    return (master, epoch, cas) if master is not None else None


def test_kill9_master_fails_over_and_rejoins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path / "c") as cluster:
        everyone = [1, 2, 3]
        (master, epoch, cas), _ = wait_for(lambda: agreed(cluster, everyone), 20, what="master")
        victim = int(master.removeprefix("node"))
        pid = cluster.pid(victim)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 5, what="master gone")

        rest = [i for i in everyone if i != victim]
        (new_master, new_epoch, new_cas), took = wait_for(
            lambda: agreed(cluster, rest), 20, what="failover"
        )
        assert new_master != master and new_epoch > epoch and new_cas > cas
        assert took < 10, f"failover took {took:.1f}s"

        cluster.start()  # restarts the killed node

        def rejoined() -> tuple[str, int, int] | None:
            a = agreed(cluster, everyone)
            return a if a is not None and a[2] >= new_cas else None

        (final_master, _, _), _ = wait_for(rejoined, 20, what="rejoin")
        assert final_master == new_master  # the returning node does not take mastership back

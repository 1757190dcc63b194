"""Ejecting a manager node of a 3-manager cluster: its vote leaves the coordinator's
committed voters in the eject's final commit, DDL keeps committing with the two left, and
then a majority of those two is both of them: with one of them killed, nothing commits (the
ejected node never counts again)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import kill9, running_cluster

from shardex.client import connect_local
from shardex.client.probe import committed_voters
from shardex.errors import ShardexError

pytestmark = pytest.mark.cluster


def voters(cluster: LocalCluster, node: int) -> set[str] | None:
    return asyncio.run(committed_voters(cluster.address(node), cluster.secret(), timeout=2.0))


def test_eject_a_manager_then_two_voters_need_both(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "c", nodes=3) as cluster:
        assert voters(cluster, 1) == {"node1", "node2", "node3"}
        with connect_local(cluster.path, name="admin", request_timeout=10) as admin:
            admin.create_keyspace("before", 4, num_replicas=1)
            result = admin.rebalance(eject=["node3"])
            assert result.state == "done", result
            wait_for(lambda: voters(cluster, 1) == {"node1", "node2"}, 30, what="two voters")
            # the master tombstones it after the commit that removed its vote; gossip
            # carries that to the node the client talks to
            wait_for(
                lambda: "node3" not in {m.name for m in admin.cluster_status().members},
                30,
                what="node3 out of the member list",
            )
            admin.create_keyspace("after", 4, num_replicas=1)  # two voters commit
            names = {k.name for k in admin.list_keyspaces()}
            assert {"before", "after"} <= names
        # node3 is still running (ejected, not stopped) yet never counts: kill node2, and
        # node1 with node3 make no majority of the voters {node1, node2}
        kill9(cluster, 2)
        with (
            connect_local(cluster.path, name="late", request_timeout=5) as late,
            pytest.raises(ShardexError),
        ):
            late.create_keyspace("never", 4, num_replicas=0)

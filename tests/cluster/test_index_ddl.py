"""Index DDL on 3 node processes: create / list / drop through the client and the CLI, then
``kill -9`` of the coordinator master right after a CREATE INDEX is sent. The client gets
success or a clear failure; after the failover every node lists the same indexes and states;
the killed node, restarted, resynchronises its state and its slices."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import running_cluster

from shardex.api.index import ListSlices, SliceList
from shardex.client import connect
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.coordinator import StateReply, StateRequest
from shardex.net import TcpTransport
from shardex.net import connect as rpc_connect
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster


async def _ask(cluster: LocalCluster, i: int, msg: Any, expect: type) -> Any:
    try:
        conn = await rpc_connect(
            TcpTransport(), cluster.address(i), cluster.secret(), name="test", timeout=2
        )
    except ShardexError:
        return None
    try:
        return await conn.request(msg, 5.0, expect=expect)
    except ShardexError:
        return None
    finally:
        await conn.close()


def node_views(cluster: LocalCluster, nodes: list[int]) -> dict[int, Any]:
    """Each node's own answer: its replica's indexes (not the master's), and its slices."""

    async def one(i: int) -> Any:
        state = await _ask(
            cluster, i, StateRequest(sections=["indexes", "index_topologies"]), StateReply
        )
        slices = await _ask(cluster, i, ListSlices(), SliceList)
        if state is None or slices is None:
            return None
        listed = sorted((r.keyspace, r.name, r.state, r.id) for r in state.state.indexes.values())
        topo = {i: h[-1].assignment for i, h in state.state.index_topologies.items() if h}
        return {
            "master": state.master,
            "cas": state.state.cas,
            "indexes": listed,
            "topologies": topo,
            "slices": sorted((s.index_id, s.partition) for s in slices.slices),
        }

    async def all_views() -> dict[int, Any]:
        return dict(zip(nodes, await asyncio.gather(*(one(i) for i in nodes)), strict=True))

    return asyncio.run(all_views())


def agreed(cluster: LocalCluster, nodes: list[int]) -> dict[str, Any] | None:
    """One master, one state version and the same indexes on every node in ``nodes``, and
    every node holds exactly the slices the topologies give it (reconciled)."""
    views = node_views(cluster, nodes)
    if any(v is None for v in views.values()):
        return None
    first = views[nodes[0]]
    if (
        any(
            (v["master"], v["cas"], v["indexes"])
            != (first["master"], first["cas"], first["indexes"])
            for v in views.values()
        )
        or first["master"] is None
    ):
        return None
    for i, v in views.items():
        mine = sorted(
            (index_id, p)
            for index_id, assignment in v["topologies"].items()
            for p, node in assignment.items()
            if node == f"node{i}"
        )
        if v["slices"] != mine:
            return None
    return first


def test_index_ddl_and_kill9_master_during_create(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path / "c") as cluster:
        everyone = [1, 2, 3]
        addresses = [cluster.address(i) for i in everyone]
        with connect(addresses, secret=cluster.secret(), request_timeout=30) as c:
            c.create_keyspace("users", 8)
            ix = c.execute_ddl(
                "CREATE INDEX by_age ON users(age DESC) WHERE age > 18 "
                'PARTITION BY HASH(META().id) WITH {"num_partition": 3}'
            )
            assert isinstance(ix, dict)
            assert ix["state"] == "BUILDING" and ix["nodes"] == ["node1", "node2", "node3"]
            assert ix["keys"] == ["age DESC"] and ix["cas"] > 0
            c.create_index("users", "by_name", ["name"], defer_build=True, nodes=["node2"])
            with pytest.raises(ShardexError) as err:
                c.execute_ddl("CREATE INDEX by_name ON users(name)")
            assert err.value.code is ErrorCode.INDEX_EXISTS
            with pytest.raises(ShardexError) as err:
                c.execute_ddl("CREATE INDEX bad ON users(age +)")
            assert err.value.code is ErrorCode.SQL_SYNTAX and err.value.details["column"] == 32
            view, _ = wait_for(lambda: agreed(cluster, everyone), 20, what="agreement")
            assert [(k, n, s) for k, n, s, _ in view["indexes"]] == [
                ("users", "by_age", "BUILDING"),
                ("users", "by_name", "READY"),
            ]
            # The CLI sees the same.
            listed = json.loads(
                run_cli("index", "list", "--dir", str(cluster.path), "--json").stdout
            )
            assert [(r["name"], r["state"]) for r in listed] == [
                ("by_age", "BUILDING"),
                ("by_name", "READY"),
            ]
            run_cli("ddl", "--dir", str(cluster.path), "BUILD INDEX ON users(by_name)")
            assert (
                c.wait_for_index("users", "by_name", "BUILDING", timeout=10)["state"] == "BUILDING"
            )
            dropped = c.drop_index("users", "by_name")
            assert dropped["pending_nodes"] == []
            wait_for(lambda: agreed(cluster, everyone), 20, what="drop settled")

            # kill -9 the master right after a CREATE INDEX is sent through it.
            master = view["master"]
            victim = int(master.removeprefix("node"))
            pid = cluster.pid(victim)
            assert pid is not None
        order = [cluster.address(victim)] + [a for a in addresses if a != cluster.address(victim)]
        outcome: list[Any] = []
        with connect(order, secret=cluster.secret(), request_timeout=30) as c:
            assert c.connected_address == cluster.address(victim)

            def create() -> None:
                try:
                    outcome.append(
                        c.create_index(
                            "users",
                            "by_city",
                            ["address.city"],
                            partition_by=["META().id"],
                            num_partition=2,
                        )
                    )
                except ShardexError as exc:
                    outcome.append(exc)

            t = threading.Thread(target=create)
            started = time.monotonic()
            t.start()
            time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not pid_alive(pid), 5, what="master gone")
            t.join(90)
            assert not t.is_alive() and outcome
            took = time.monotonic() - started
            result = outcome[0]
            if isinstance(result, ShardexError):  # a clear failure: the index is not there
                assert result.code in (ErrorCode.NODE_UNAVAILABLE, ErrorCode.TIMEOUT), result
                assert result.message
            else:
                assert result["name"] == "by_city" and result["state"] == "BUILDING"
            rest = [i for i in everyone if i != victim]
            after, _ = wait_for(lambda: agreed(cluster, rest), 30, what="failover")
            assert after["master"] != master
            names = [n for _, n, _, _ in after["indexes"]]
            assert names.count("by_city") == (0 if isinstance(result, ShardexError) else 1)
            assert all(s == "BUILDING" for _, _, s, _ in after["indexes"])
            print(f"create during kill -9: {type(result).__name__} after {took:.1f}s")

        cluster.start()  # restarts the killed node: it resynchronises state and slices

        def rejoined() -> dict[str, Any] | None:
            a = agreed(cluster, everyone)
            return a if a is not None and a["cas"] >= after["cas"] else None

        final, _ = wait_for(rejoined, 30, what="rejoin")
        assert final["indexes"] == after["indexes"]

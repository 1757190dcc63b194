"""Index replicas on a real 3-node cluster with the Spark pipeline: an index with
``num_replica`` 1 is built into both copies, an indexer that is not the coordinator master is
killed with SIGKILL, and then the pipeline keeps publishing the index without it (its copies
leave the topology) while scans through node1 read the surviving copies: writes made after
the kill are seen at_plus, and every scan equals the oracle. Slow: a cluster, an initial
build and rounds on a loaded 2-core box."""

from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import wait_for
from data_helpers import docids_in, running_cluster

from shardex.client import connect, connect_local
from shardex.core.keycodec import decode_entry
from shardex.errors import ShardexError
from shardex.index.oracle import expected_entries
from shardex.meta.index_state import find_index, latest_index_topology
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state
from shardex.runtime.pidfile import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "replicated"
INDEX = "by_age"
DOCS = 3_000
PARTITIONS = 8


def document(i: int) -> dict[str, Any]:
    return {"name": f"n{i % 97}", "age": (i * 7919) % 90}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_indexer_leaves_the_replicated_index_scannable_and_stable(
    spark: SparkSession, tmp_path: Any
) -> None:
    path = tmp_path / "cluster"
    with running_cluster(path, nodes=3) as cluster, connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        docs = {f"d{i:06d}": document(i) for i in range(DOCS)}
        client.keyspace(KEYSPACE).upsert_many(docs.items())
        ix = client.execute_ddl(
            f"CREATE INDEX {INDEX} ON {KEYSPACE}(age, name) PARTITION BY HASH(META().id) "
            'WITH {"num_partition": 3, "num_replica": 1}'
        )
        assert isinstance(ix, dict) and ix["num_replica"] == 1
        assert ix["nodes"] == ["node1", "node2", "node3"]
        with connect_local(path, name="driver", as_node=True) as driver_client:
            driver = PipelineDriver(
                spark, driver_client, {"cluster_dir": str(path)}, tmp_path / "ckpt", poll=0.3
            )
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                client.wait_for_index(KEYSPACE, INDEX, timeout=300)
                state = index_state(client)
                rec = find_index(state.indexes, KEYSPACE, INDEX)
                assert rec is not None and rec.num_replica == 1
                topo = latest_index_topology(state.index_topologies, rec.id)
                assert topo is not None and all(len(topo.chain(p)) == 2 for p in range(3))

                def oracle() -> list[tuple[list[Any], str]]:
                    entries = sorted(e for _, e in expected_entries(rec.definition, docs))
                    return [tuple(decode_entry(e, rec.definition.desc)) for e in entries]  # type: ignore[misc]

                def scan(c: Any, **kw: Any) -> list[tuple[list[Any], str]]:
                    return [tuple((r["key"], r["docid"])) for r in c.scan(KEYSPACE, INDEX, **kw)]  # type: ignore[misc]

                assert scan(client) == oracle()
                victim = next(n for n in ("node3", "node2") if n != state.master)
                i = int(victim.removeprefix("node"))
                held = topo.copies_of(victim)
                assert held
                pid = cluster.pid(i)
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda: not pid_alive(pid), 10, 0.05, f"{victim} to die")

                # Writes to data partitions whose active is alive, after the kill.
                owners = {
                    k.name: k.assignment for k in client.list_keyspaces() if k.name == KEYSPACE
                }[KEYSPACE]
                alive = [p for p, n in owners.items() if n != victim]
                results = []
                for p in alive[:3]:
                    for d in docids_in(p, PARTITIONS, 5, f"late{p}-"):
                        docs[d] = {"name": "late", "age": 42}
                        results.append(client.keyspace(KEYSPACE).upsert(d, docs[d]))
                with connect(cluster.address(1), secret=cluster.secret(), name="s") as c:
                    last: list[str] = []

                    def sees_the_writes() -> bool:
                        try:
                            got = scan(c, consistency="at_plus", at=results, timeout=10)
                        except ShardexError as exc:  # rounds still settling without the node
                            last[:] = [f"{exc.code.name}: {exc.message}"]
                            return False
                        assert got == oracle()
                        return True

                    try:
                        wait_for(sees_the_writes, 240, 0.5, "at_plus scans past the kill")
                    except AssertionError as exc:
                        raise AssertionError(f"{exc}; last scan error: {last}") from None
                    assert scan(c) == oracle()  # not_bounded, from the surviving copies

                def copies_gone() -> bool:
                    now = latest_index_topology(index_state(client).index_topologies, rec.id)
                    return now is not None and victim not in now.copy_nodes()

                # The scans above may be served by live copies' snapshots before the
                # timekeeper has published without the victim: its copies leave the topology
                # by the next published round.
                wait_for(copies_gone, 120, 0.5, f"{victim}'s copies to leave the topology")
                now = latest_index_topology(index_state(client).index_topologies, rec.id)
                assert now is not None and sorted(now.assignment) == [0, 1, 2]
            finally:
                driver.stop()
                thread.join(timeout=60)

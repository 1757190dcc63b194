"""Reads of a replicated index fail over between copies when an indexer is killed in the
middle of them, on a real 3-node cluster with the Spark pipeline.

An index with ``num_replica`` 1 is built; through node1 (the scan coordinator, the paging
proxy and the SQL initiator) the test opens two large streaming scans (ordered and
unordered) and reads their first row, reads the first page of a pinned paged scan, and
then kills an indexer that is not the coordinator master with SIGKILL. The rest of each
stream, every later page and SQL queries over the index must then equal the oracle: the
streams continue on the dead indexer's other copies after the last entry read
(``scan/failover.py``), the pages read its partitions there (``scan/paging_copies.py``), and
a SQL leaf that lands on it runs again elsewhere (``sql/exec/failover.py``). The kill lands
mid-stream by construction: each indexer holds thousands of entries of its primaries and a
slice stream runs at most a few blocks ahead of a reader that took one row, and node1 logs
each take-over (checked at the end). An ordered covering SQL statement read past its first
row resumes after the rows it sent.

Slow: a cluster, an initial build of 60k documents and rounds on a loaded 2-core box."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import wait_for
from data_helpers import docids_in, running_cluster

from shardex.client import connect, connect_local
from shardex.core.keycodec import decode_entry
from shardex.index.oracle import expected_entries
from shardex.meta.index_state import find_index, latest_index_topology
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state
from shardex.runtime.pidfile import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "failing"
INDEX = "by_age"
DOCS = 60_000
PARTITIONS = 8


def document(i: int) -> dict[str, Any]:
    # 90 ages over 60k documents: every key is shared by hundreds of docids
    return {"name": f"n{i % 97}", "age": (i * 7919) % 90}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_scans_pages_and_sql_fail_over_when_an_indexer_dies_mid_read(
    spark: SparkSession, tmp_path: Any
) -> None:
    path = tmp_path / "cluster"
    with running_cluster(path, nodes=3) as cluster, connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS, num_replicas=1)
        ks = client.keyspace(KEYSPACE)
        docs = {f"d{i:06d}": document(i) for i in range(DOCS)}
        # majority: the replicas promoted by the automatic failover hold every write, so
        # the index has nothing to roll back
        ks.upsert_many(docs.items(), durability="majority")
        client.execute_ddl(
            f"CREATE INDEX {INDEX} ON {KEYSPACE}(age, name) PARTITION BY HASH(META().id) "
            'WITH {"num_partition": 3, "num_replica": 1}'
        )
        with connect_local(path, name="driver", as_node=True) as driver_client:
            driver = PipelineDriver(
                spark, driver_client, {"cluster_dir": str(path)}, tmp_path / "ckpt", poll=0.3
            )
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                client.wait_for_index(KEYSPACE, INDEX, timeout=600)
                state = index_state(client)
                rec = find_index(state.indexes, KEYSPACE, INDEX)
                assert rec is not None and rec.num_replica == 1
                topo = latest_index_topology(state.index_topologies, rec.id)
                assert topo is not None and all(len(topo.chain(p)) == 2 for p in range(3))
                victim = next(n for n in ("node3", "node2") if n != state.master)
                assert topo.partitions_of(victim), f"{victim} is primary of no partition"

                # Writes for the SQL queries' at_plus, to data partitions whose active lives.
                owners = {k.name: k.assignment for k in client.list_keyspaces()}[KEYSPACE]
                alive = [p for p, n in owners.items() if n != victim]
                results = []
                for p in alive[:2]:
                    for d in docids_in(p, PARTITIONS, 3, f"late{p}-"):
                        docs[d] = {"name": "late", "age": 42}
                        results.append(ks.upsert(d, docs[d], durability="majority"))
                entries = sorted(e for _, e in expected_entries(rec.definition, docs))
                want = [tuple(decode_entry(e, rec.definition.desc)) for e in entries]

                def rows(it: Any) -> list[tuple[Any, ...]]:
                    return [(r["key"], r["docid"]) for r in it]

                with connect(cluster.address(1), secret=cluster.secret(), name="r") as c:
                    ordered = iter(c.scan(KEYSPACE, INDEX, consistency="request_plus"))
                    unordered = iter(
                        c.scan(KEYSPACE, INDEX, consistency="request_plus", ordered=False)
                    )
                    first_ordered = rows([next(ordered)])
                    first_unordered = rows([next(unordered)])
                    page = c.scan_page(
                        KEYSPACE, INDEX, consistency="request_plus", page_size=3000, ordered=True
                    )
                    assert page.continuation is not None
                    paged = rows(page)
                    # An ordered covering statement at a pinned TS, its first rows read: it
                    # resumes on other copies after the rows it sent (``repeatable``).
                    streamed = iter(
                        c.query(
                            f"SELECT age, name, META().id AS id FROM {KEYSPACE} WHERE age >= 0 "
                            "ORDER BY age, name, META().id",
                            consistency="at_plus",
                            at=results,
                            timeout=600,
                            window=64 * 1024,  # the leaves stay a few batches ahead
                        )
                    )
                    first_streamed = [next(streamed)]

                    pid = cluster.pid(int(victim.removeprefix("node")))
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
                    wait_for(lambda: not pid_alive(pid), 10, 0.05, f"{victim} to die")
                    # SQL first, while node1 may still count the victim as a member: a leaf
                    # planned there fails and runs again on other copies (once the victim is
                    # given up, leaves go to the copies at once).
                    sql = f"SELECT age, name FROM {KEYSPACE} WHERE age >= 0"
                    got_sql = [
                        (r["age"], r["name"])
                        for r in c.query(sql, consistency="at_plus", at=results)
                    ]
                    assert sorted(got_sql) == sorted((k[0], k[1]) for k, _ in want)
                    counts = c.query(
                        f"SELECT age, COUNT(*) AS n FROM {KEYSPACE} WHERE age >= 0 GROUP BY age",
                        consistency="at_plus",
                        at=results,
                    )
                    assert {r["age"]: r["n"] for r in counts} == Counter(k[0] for k, _ in want)

                    assert first_ordered + rows(ordered) == want
                    got_streamed = [
                        ((r["age"], r["name"]), r["id"]) for r in [*first_streamed, *streamed]
                    ]
                    assert got_streamed == [(tuple(k), d) for k, d in want]
                    got = first_unordered + rows(unordered)
                    assert sorted(got) == want and len(got) == len(want)

                    continuation = page.continuation
                    while continuation is not None:
                        page = c.scan_page(
                            KEYSPACE,
                            INDEX,
                            consistency="request_plus",
                            page_size=3000,
                            ordered=True,
                            continuation=continuation,
                        )
                        paged += rows(page)
                        continuation = page.continuation
                    assert paged == want
                # The reads really moved mid-way: node1 logged the streams and the pages
                # taken over by other copies (not, say, every row buffered before the kill).
                log = "".join(f.read_text() for f in path.rglob("node.log") if "node1" in str(f))
                assert log.count(f"scan stream from {victim} failed") >= 2, log[-3000:]
                assert f"shard {victim} failed" in log, log[-3000:]
                assert "resuming after the" in log, log[-3000:]
            finally:
                driver.stop()
                thread.join(timeout=60)

"""Helpers of the end-to-end pipeline tests: the oracle against a real cluster.

``check_oracle(client, keyspace, index, ts)`` reads every slice of the index at its snapshot
``ts`` (``ReadSlice`` on each indexer) and the documents as of ``ts`` (the change source's
snapshot read: the last version of every docid with seqno <= ts), and asserts the index
invariant with ``shardex.index.oracle.check_index``. ``running_pipeline`` runs the Spark
driver of one cluster in a thread of the test process (on the shared SparkSession).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardex.api.delivery import ReadSlice, SliceEntries
from shardex.client import Client, connect_local
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.index.oracle import check_index
from shardex.meta.index_state import find_index, latest_index_topology
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state, list_slices, to_node
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import read_ranges

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class SharedCluster:
    """The session's 3-node cluster with the pipeline driver running on it."""

    path: Path  # the cluster directory (``--dir`` of the CLI)
    client: Client

    @contextlib.contextmanager
    def keyspace(self, name: str, num_partitions: int = 8) -> Iterator[str]:
        """A keyspace of one module's own; dropped (with its indexes) at the end."""
        self.client.create_keyspace(name, num_partitions=num_partitions)
        try:
            yield name
        finally:
            self.client.drop_keyspace(name)


@contextlib.contextmanager
def running_pipeline(
    spark: SparkSession,
    cluster_dir: Path,
    checkpoints: Path,
    *,
    poll: float = 0.2,
    each_job: Callable[[MaintenanceJob], None] | None = None,
    stall_after: float | None = None,
) -> Iterator[PipelineDriver]:
    """The pipeline driver of the cluster in ``cluster_dir`` (its own client), supervising
    in a daemon thread until the block ends; ``each_job`` adjusts every maintenance job it
    makes (before its query starts); ``stall_after``: the stall watchdog's period."""
    with connect_local(cluster_dir, as_node=True) as driver_client:
        extra = {} if stall_after is None else {"stall_after": stall_after}
        driver = PipelineDriver(
            spark, driver_client, {"cluster_dir": str(cluster_dir)}, checkpoints, poll=poll, **extra
        )
        if each_job is not None:
            make = driver._job

            def job(*args: Any, **kwargs: Any) -> MaintenanceJob:
                j = make(*args, **kwargs)
                each_job(j)
                return j

            driver._job = job  # type: ignore[method-assign]
        thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
        thread.start()
        try:
            yield driver
        finally:
            driver.stop()
            thread.join(timeout=60)


def documents_at(client: Client, keyspace: str, ts: Timestamp) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for batch in read_ranges(
        client, keyspace, plan_ranges(keyspace, Timestamp({}), ts), snapshot=True
    ):
        for docid, deleted, body in zip(
            batch["docid"].to_pylist(),
            batch["deleted"].to_pylist(),
            batch["body"].to_pylist(),
            strict=True,
        ):
            assert not deleted
            out[docid] = json.loads(body)
    return out


def slice_entries(
    client: Client, index_id: str, partition: int, node: str, ts: Timestamp | None
) -> list[bytes]:
    entries: list[bytes] = []
    after: bytes | None = None
    while True:
        msg = ReadSlice(
            index_id=index_id,
            partition=partition,
            snapshot_ts=None if ts is None else dict(ts.to_wire()),
            after=after,
            limit=5000,
        )
        page = client.rpc.run(to_node(client, node, msg, SliceEntries))
        entries.extend(page.entries)
        if not page.more:
            return entries
        after = page.entries[-1]


def check_oracle(client: Client, keyspace: str, name: str, ts: Timestamp) -> int:
    """Assert the oracle for index ``name`` at stability TS ``ts``; returns its entries."""
    state = index_state(client)
    rec = find_index(state.indexes, keyspace, name)
    assert rec is not None, f"no index {name} on {keyspace}"
    topo = latest_index_topology(state.index_topologies, rec.id)
    assert topo is not None
    by_slice = {
        p: slice_entries(client, rec.id, p, node, ts) for p, node in topo.assignment.items()
    }
    docs = documents_at(client, keyspace, ts)
    check_index(rec.definition, by_slice, docs, context=f"{name} at {ts!r}")
    return sum(len(e) for e in by_slice.values())


def published_ts(client: Client, keyspace: str, name: str) -> Timestamp | None:
    """The index's published stability TS as its indexers hold it (None: not yet)."""
    state = index_state(client)
    rec = find_index(state.indexes, keyspace, name)
    assert rec is not None
    topo = latest_index_topology(state.index_topologies, rec.id)
    assert topo is not None
    infos = list_slices(client, sorted(set(topo.assignment.values())), rec.id)
    tss = [None if s.stability is None else Timestamp.from_wire(s.stability) for s in infos]
    if len(tss) != len(topo.assignment) or any(t is None for t in tss):
        return None
    # Every slice got the same publishes; mid-publish the older one is the common TS.
    return min(tss, key=lambda t: sum(e.seqno for e in t.values()))  # type: ignore[union-attr]


def stability_of(client: Client, keyspace: str, name: str) -> dict[int, int] | None:
    for item in client.list_indexes(keyspace):
        if item["name"] == name:
            st = item.get("stability_ts")
            return None if st is None else {int(p): s for p, s in st.items()}
    raise AssertionError(f"no index {name}")


def wait_stable(
    client: Client, keyspace: str, names: list[str], timeout: float = 240.0
) -> Timestamp:
    """Wait until every named index's published stability TS equals the keyspace's high
    seqnos (writes must have stopped); returns that TS."""
    target = client.high_seqnos(keyspace)
    want = {p: e.seqno for p, e in target.items()}
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = {n: stability_of(client, keyspace, n) for n in names}
        if all(
            s is not None and all(s.get(p, 0) >= q for p, q in want.items()) for s in last.values()
        ):
            return target
        time.sleep(0.2)
    raise AssertionError(f"stability did not reach {want} in {timeout}s: {last}")


def mutate(
    client: Client,
    keyspace: str,
    rng: random.Random,
    n: int,
    *,
    pool: int = 400,
    doc: Callable[[random.Random, int], dict[str, Any]] | None = None,
) -> None:
    """``n`` random mutations over ``pool`` docids: inserts, updates that change the indexed
    key and the partition key (city), deletes, re-inserts, documents leaving the WHERE
    filter or losing the leading key, and bad values ("boom" ages)."""
    ks = client.keyspace(keyspace)
    make = doc or random_doc
    for _ in range(n):
        docid = f"u{rng.randrange(pool)}"
        # A missing docid (delete) or a node that is down (kill tests): skip the mutation.
        with contextlib.suppress(ShardexError):
            if rng.random() < 0.15:
                ks.delete(docid)
            else:
                ks.upsert(docid, make(rng, n))


class Writer:
    """Random mutations (``mutate``) of one keyspace in a background thread until stopped.
    ``done`` counts the mutations attempted (some fail while a node is down)."""

    def __init__(self, client: Client, keyspace: str, seed: int, pause: float = 0.0) -> None:
        self.client = client
        self.keyspace = keyspace
        self.rng = random.Random(seed)
        self.pause = pause  # seconds between rounds of 20 mutations
        self.stop = threading.Event()
        self.done = 0
        self.thread = threading.Thread(target=self._run, name=f"writer-{keyspace}", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            mutate(self.client, self.keyspace, self.rng, 20)
            self.done += 20
            if self.pause:
                self.stop.wait(self.pause)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def random_doc(rng: random.Random, _n: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "user" if rng.random() < 0.8 else "admin"}
    if rng.random() < 0.9:
        doc["name"] = rng.choice(["ann", "bob", "cy", "dee", "eve"])
    if rng.random() < 0.03:
        doc["name"] = "x" * 5000  # over the entry size limit: an evaluation error
    r = rng.random()
    if r < 0.05:
        doc["age"] = "boom"
    elif r < 0.9:
        doc["age"] = rng.randrange(60)
    if rng.random() < 0.95:
        doc["city"] = rng.choice(["paris", "rome", "oslo", "lima", "kyiv"])
    if rng.random() < 0.8:
        doc["score"] = rng.choice([0.5, 1, 2.25, -3, None, 10**30])
    if rng.random() < 0.7:  # elements come, go and repeat (array indexes)
        doc["tags"] = [
            {"k": rng.choice("abcde"), "n": rng.randrange(3)} for _ in range(rng.randrange(4))
        ]
    return doc

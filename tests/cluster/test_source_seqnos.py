"""The stream readers' high seqnos asked of the owners directly (``source/seqnos.py``), on a
real 3-node cluster without Spark: what ``latestOffset`` returns must cover every write
acknowledged before it was called, equal the gathered answer, and fall back to it when the
client's topology is wrong."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.pipeline.source.options import SourceOptions
from shardex.pipeline.source.seqnos import OwnerSeqnos
from shardex.pipeline.source.stream import _OffsetSource

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

KEYSPACE = "seqnos"
NUM_PARTITIONS = 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Client]]:
    path = tmp_path_factory.mktemp("source-seqnos") / "cluster"
    with running_cluster(path, nodes=3), connect_local(path) as client:
        client.create_keyspace(KEYSPACE, num_partitions=NUM_PARTITIONS)
        yield path, client


def _offsets(path: Path, how: str) -> _OffsetSource:
    return _OffsetSource(
        SourceOptions.parse(
            {
                "cluster_dir": str(path),
                "keyspace": KEYSPACE,
                "high_seqnos": how,
                "latest_offset_interval_ms": "0",  # every call asks (no reuse window)
            }
        )
    )


@pytest.mark.parametrize("how", ["owners", "gather"])
def test_latest_offset_covers_every_write_acknowledged_before_the_call(
    cluster: tuple[Path, Client], how: str
) -> None:
    path, client = cluster
    ks = client.keyspace(KEYSPACE)
    acks: list[tuple[int, int]] = []  # (partition, seqno), appended once acknowledged
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            r = ks.upsert(f"{how}-{i}", {"i": i})
            acks.append((r.partition, r.seqno))
            i += 1

    offsets = _offsets(path, how)
    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    start = offsets.initial()
    checked = 0
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            before = len(acks)  # these were acknowledged before the call
            end = offsets.next_end(start, None)
            for p, seqno in acks[:before]:
                assert end.seqno(p) >= seqno, f"{how}: write {p}:{seqno} acked before the call"
            checked += before
            start = end
    finally:
        stop.set()
        for t in threads:
            t.join()
        offsets.close()
    assert checked > 100 and len(acks) > 50
    if how == "owners":
        assert offsets._owner_seqnos is not None and offsets._owner_seqnos.fallbacks == 0


def test_owners_answer_equals_the_gathered_one(cluster: tuple[Path, Client]) -> None:
    path, client = cluster
    ks = client.keyspace(KEYSPACE)
    for i in range(40):
        ks.upsert(f"same-{i}", {"i": i})
    with connect_local(path) as c:
        direct = OwnerSeqnos(c, KEYSPACE)()
        assert direct == client.high_seqnos(KEYSPACE)
        assert sorted(direct) == list(range(NUM_PARTITIONS))


def test_a_wrong_topology_falls_back_to_the_gathered_rpc(cluster: tuple[Path, Client]) -> None:
    path, client = cluster
    with connect_local(path) as c:
        ask = OwnerSeqnos(c, KEYSPACE)
        _, topo = c.rpc.run(c.rpc.router.keyspace(KEYSPACE))
        # Partition 0 "moved" to another node: that node does not serve it, so no owner
        # answers for it and the direct ask must not return a TS without it.
        wrong = {**topo.assignment}
        wrong[0] = next(n for n in topo.nodes() if n != topo.assignment[0])
        c.rpc.router.force_topology(KEYSPACE, Topology(seq_num=topo.seq_num, assignment=wrong))
        ts = ask()
        assert (ask.direct, ask.fallbacks) == (0, 1)
        assert isinstance(ts, Timestamp) and ts == client.high_seqnos(KEYSPACE)
        # The fallback refreshed the client's topology: the next ask goes direct again.
        ask()
        assert (ask.direct, ask.fallbacks) == (1, 1)

"""Document expiry on a real 2-node cluster with a short real TTL (2 s), the expiry pager
every 0.5 s (``expiry_pager_interval`` in each node's config): a document expires and is no
longer readable (Get, SQL), its deletion is in the change stream as an expiration (a delete
marked ``FLAG_EXPIRED``, with its own seqno) and reaches the replica copy; the keyspace's
``max_ttl`` gives and caps expiries; touch and get_and_touch extend one; SQL's
``META().expiration`` answers the stored expiry. Every wait polls with a deadline."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, free_base_port, kill_leftovers, run_cli, wait_for
from data_helpers import read_partition

from shardex.api.expiry import FLAG_EXPIRED
from shardex.api.migration import LocalPartitions, LocalPartitionsReply
from shardex.api.records import OP_DELETE
from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.meta import cluster_dir as cdir
from shardex.meta.partitioning import partition_of
from shardex.net import TcpTransport
from shardex.net import connect as rpc_connect
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster

KS = "ttl"
CAPPED = "capped"
NP = 4
TTL = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tmp_path_factory.mktemp("expiry")
    c = LocalCluster(path, 2, free_base_port(2))
    spec = cdir.create(path, nodes=2, base_port=c.base_port)
    for node in spec.nodes:
        toml = node.path(path) / cdir.NODE_CONFIG_FILE
        toml.write_text(toml.read_text() + "expiry_pager_interval = 0.5\n")
    try:
        c.start()
        yield c
    finally:
        if any(p is not None and pid_alive(p) for p in (c.pid(1), c.pid(2))):
            run_cli("cluster", "stop", "--dir", str(path), "--timeout", "5", check=False)
        kill_leftovers(path)


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, NP, num_replicas=1)
        yield c


def _copy(cluster: LocalCluster, node: str, partition: int) -> tuple[str, int, int]:
    """(state, high seqno, live documents) of ``node``'s copy of ``partition``."""

    async def go() -> LocalPartitionsReply:
        address = cluster.address(int(node.removeprefix("node")))
        conn = await rpc_connect(TcpTransport(), address, cluster.secret(), name="t")
        try:
            reply = await conn.request(LocalPartitions(keyspace=KS), 10.0)
            assert isinstance(reply, LocalPartitionsReply)
            return reply
        finally:
            await conn.close()

    (info,) = [i for i in asyncio.run(go()).partitions if i.partition == partition]
    return info.state, info.high_seqno, info.doc_count


def _gone(client: Client, docid: str) -> bool:
    try:
        client.keyspace(KS).get(docid)
    except ShardexError as exc:
        assert exc.code is ErrorCode.DOC_NOT_FOUND
        return True
    return False


def test_a_document_expires_and_its_deletion_reaches_streams_and_the_replica(
    cluster: LocalCluster, client: Client
) -> None:
    ks = client.keyspace(KS)
    before = time.time()
    ks.upsert("short", {"v": 1}, expiry=TTL)
    ks.upsert("kept", {"v": 2})
    ks.upsert("touched", {"v": 3}, expiry=TTL)
    assert before + TTL <= ks.expiry_of("short") <= time.time() + TTL + 1
    assert ks.expiry_of("kept") == 0
    ks.touch("touched", 600)
    assert ks.expiry_of("touched") >= before + 600
    # SQL reads the stored expiry, on the inline key lookup and through fragments
    sql = f"SELECT RAW [META().id, META().expiration] FROM {KS} USE KEYS ['short', 'kept']"
    want = [["short", ks.expiry_of("short")], ["kept", 0]]
    assert list(client.query(sql)) == want
    assert list(client.query(sql, tuning={"inline": False})) == want

    p = partition_of("short", NP)
    desc = next(k for k in client.list_keyspaces() if k.name == KS)
    active, replica = desc.assignment[p], desc.replicas[p][0]
    wait_for(lambda: _gone(client, "short"), 30, what="the document expired")
    assert list(client.query(sql)) == [["kept", 0]]
    assert ks.get("touched") == {"v": 3} and ks.get("kept") == {"v": 2}

    def expiration() -> bool:
        _, changes = read_partition(ks, p)
        last = [c for c in changes if c.docid == "short"][-1]
        return last.op == OP_DELETE and bool(last.flags & FLAG_EXPIRED)

    wait_for(expiration, 30, what="the expiration in the change stream")
    _, high, live = _copy(cluster, active, p)
    wait_for(
        lambda: _copy(cluster, replica, p) == ("replica", high, live),
        30,
        what="the replica copy level with its active, the expired document deleted",
    )


def test_max_ttl_gives_and_caps_expiries(client: Client) -> None:
    client.create_keyspace(CAPPED, NP, num_replicas=0, max_ttl=3600)
    assert next(k for k in client.list_keyspaces() if k.name == CAPPED).max_ttl == 3600
    ks = client.keyspace(CAPPED)
    before = time.time()
    ks.upsert("none", {})
    ks.upsert("longer", {}, expiry=7 * 86400)
    ks.upsert("shorter", {}, expiry=60)
    after = time.time()
    for d in ("none", "longer"):
        assert before + 3600 <= ks.expiry_of(d) <= after + 3601, d
    assert ks.expiry_of("shorter") <= after + 61
    got = ks.get_and_touch("shorter", 120)
    assert got.doc == {} and before + 120 <= ks.expiry_of("shorter") <= time.time() + 121
    # every write takes an expiry: insert, replace, upsert_many (a datetime: absolute)
    ks.insert("ins", {}, expiry=30)
    ks.replace("ins", {"r": 1}, expiry=dt.timedelta(seconds=90))
    assert before + 90 <= ks.expiry_of("ins") <= time.time() + 91
    when = dt.datetime.fromtimestamp(int(before) + 600, dt.UTC)
    ks.upsert_many([("m1", {}), ("m2", {})], expiry=when)
    assert ks.expiry_of("m1") == ks.expiry_of("m2") == int(before) + 600
    with pytest.raises(ShardexError) as err:
        ks.upsert("bad", {}, expiry=-5)  # refused by the client, naming the value
    assert err.value.code is ErrorCode.BAD_REQUEST and "-5" in err.value.message
    with pytest.raises(ShardexError) as err:
        client.create_keyspace("bad_ttl", NP, max_ttl=-1)
    assert err.value.code is ErrorCode.BAD_REQUEST and "max_ttl" in err.value.message

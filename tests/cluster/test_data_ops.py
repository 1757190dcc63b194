"""The data service on a real 3-node cluster: keyspace DDL, CRUD and CAS, bad inputs, bulk
writes, stats, high seqnos from any node, change streams (ROLLBACK, follow, credits) and the
NOT_MY_PARTITION refresh path. One cluster for the whole module."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli
from data_helpers import docids_in, owner_of, read_partition, running_cluster

from shardex.api.data import Get, GetReply, HighSeqnos, HighSeqnosReply, Upsert
from shardex.client import BulkWriteError, Change, Client, SnapshotMarker, connect_local
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.net import TcpTransport
from shardex.net import connect as rpc_connect
from shardex.net.messages import Message

pytestmark = pytest.mark.cluster

NP = 16  # partitions of the test keyspaces: small, so a few docs cover every partition


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("data-ops")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(cluster.path) as c:
        c.create_keyspace("docs", NP)
        yield c


def raw_request(cluster: LocalCluster, node: int, msg: Message) -> Message:
    """One request on a fresh authenticated connection to node ``node``, no client logic."""

    async def go() -> Message:
        conn = await rpc_connect(
            TcpTransport(), cluster.address(node), cluster.secret(), name="test-raw"
        )
        try:
            return await conn.request(msg, 10.0)
        finally:
            await conn.close()

    return asyncio.run(go())


def expect_error(code: ErrorCode, fn: Any, *args: Any, **kwargs: Any) -> ShardexError:
    with pytest.raises(ShardexError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, f"{info.value} (wanted {code})"
    assert info.value.message  # every error says what was wrong
    return info.value


def test_keyspace_create_list_drop(client: Client) -> None:
    ks = client.create_keyspace("ddl_test", 8)
    assert ks.name == "ddl_test" and ks.num_partitions == 8 and ks.topology_seq == 1
    counts = sorted(len(ks.partitions_of(n)) for n in ("node1", "node2", "node3"))
    assert counts == [2, 3, 3]  # balanced: differ by at most one
    listed = {k.name: k for k in client.list_keyspaces()}
    assert listed["ddl_test"].uuid == ks.uuid and "docs" in listed
    e = expect_error(ErrorCode.KEYSPACE_EXISTS, client.create_keyspace, "ddl_test", 8)
    assert e.details["keyspace"] == "ddl_test"
    for bad in ("1abc", "a b", "a.b", "x" * 101, "", "é"):
        expect_error(ErrorCode.BAD_REQUEST, client.create_keyspace, bad, 8)
    for n in (0, 1025, -1):
        expect_error(ErrorCode.BAD_REQUEST, client.create_keyspace, "fine_name", n)
    client.keyspace("ddl_test").upsert("d1", {"a": 1})
    client.drop_keyspace("ddl_test")
    assert "ddl_test" not in {k.name for k in client.list_keyspaces()}
    expect_error(ErrorCode.KEYSPACE_NOT_FOUND, client.drop_keyspace, "ddl_test")
    expect_error(ErrorCode.KEYSPACE_NOT_FOUND, client.keyspace("ddl_test").get, "d1")
    # Re-created under the same name: a new, empty keyspace (the old data is gone everywhere).
    again = client.create_keyspace("ddl_test", 4)
    assert again.uuid != ks.uuid
    expect_error(ErrorCode.DOC_NOT_FOUND, client.keyspace("ddl_test").get, "d1")
    client.drop_keyspace("ddl_test")


def test_crud_and_cas(client: Client) -> None:
    ks = client.keyspace("docs")
    r1 = ks.insert("alice", {"name": "Alice", "age": 31, "tags": ["a"], "addr": {"city": "Oslo"}})
    assert r1.partition == ks.partition_of("alice") and r1.seqno >= 1 and r1.cas > 0
    ts = client.high_seqnos("docs")
    assert ts[r1.partition].uuid == r1.uuid and ts[r1.partition].seqno == r1.seqno
    assert ks.get("alice") == {"name": "Alice", "age": 31, "tags": ["a"], "addr": {"city": "Oslo"}}
    v = ks.get_versioned("alice")
    assert (v.cas, v.seqno) == (r1.cas, r1.seqno)
    expect_error(ErrorCode.DOC_EXISTS, ks.insert, "alice", {"x": 1})

    r2 = ks.replace("alice", {"name": "Alice", "age": 32}, cas=r1.cas)
    assert r2.seqno == r1.seqno + 1 and r2.cas > r1.cas and r2.uuid == r1.uuid
    e = expect_error(ErrorCode.CAS_MISMATCH, ks.replace, "alice", {"age": 0}, cas=r1.cas)
    assert e.details["expected"] == r1.cas and e.details["actual"] == r2.cas
    expect_error(ErrorCode.CAS_MISMATCH, ks.upsert, "alice", {"age": 0}, cas=r1.cas)
    expect_error(ErrorCode.CAS_MISMATCH, ks.delete, "alice", cas=r1.cas)
    r3 = ks.upsert("alice", {"name": "Alice", "age": 33}, cas=r2.cas)
    assert ks.get("alice")["age"] == 33

    d = ks.delete("alice", cas=r3.cas)
    assert d.seqno == r3.seqno + 1
    expect_error(ErrorCode.DOC_NOT_FOUND, ks.get, "alice")
    expect_error(ErrorCode.DOC_NOT_FOUND, ks.replace, "alice", {"x": 1})
    expect_error(ErrorCode.DOC_NOT_FOUND, ks.delete, "alice")
    r4 = ks.insert("alice", {"back": True})  # a tombstone does not block an insert
    assert r4.seqno == d.seqno + 1
    assert ks.upsert("bob", {"n": 1}).seqno >= 1
    assert ks.upsert("bob", {"n": 2}).cas > 0 and ks.get("bob") == {"n": 2}


def test_bad_inputs_change_nothing(cluster: LocalCluster, client: Client) -> None:
    ks = client.keyspace("docs")
    ks.upsert("target", {"v": 1})
    before = client.high_seqnos("docs")
    big = {"blob": "x" * (1024 * 1024)}
    cases: list[tuple[ErrorCode, Any]] = [
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", '{"a": ')),  # non-JSON text
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", "not json at all")),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", b"\xff\xfe")),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", "[1, 2]")),  # non-object
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", [1, 2])),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", 42)),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", {"x": object()})),
        (ErrorCode.DOC_TOO_LARGE, lambda: ks.upsert("target", big)),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("", {"v": 2})),  # empty docid
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert(7, {"v": 2})),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("d" * 300, {"v": 2})),
        (ErrorCode.BAD_REQUEST, lambda: ks.replace("target", {"v": 2}, cas=0)),
        (ErrorCode.BAD_REQUEST, lambda: ks.upsert("target", {"v": 2}, durability="maybe")),
        (ErrorCode.KEYSPACE_NOT_FOUND, lambda: client.keyspace("nope").upsert("a", {"v": 1})),
        (ErrorCode.KEYSPACE_NOT_FOUND, lambda: client.keyspace("nope").get("a")),
        (ErrorCode.KEYSPACE_NOT_FOUND, lambda: client.high_seqnos("nope")),
        (ErrorCode.BAD_REQUEST, lambda: client.keyspace("bad name!")),
        (ErrorCode.BAD_REQUEST, lambda: client.keyspace("")),
    ]
    for code, call in cases:
        expect_error(code, call)
    # The same through raw messages that skip the client's checks: the node refuses too.
    owner = int(owner_of(client, "docs", ks.partition_of("target"))[-1])
    for body, code in (
        (b'{"a": ', ErrorCode.BAD_REQUEST),
        (b"[1]", ErrorCode.BAD_REQUEST),
        (b'"str"', ErrorCode.BAD_REQUEST),
        (b"{" + b'"k": "' + b"x" * (1024 * 1024) + b'"}', ErrorCode.DOC_TOO_LARGE),
    ):
        msg = Upsert(keyspace="docs", docid="target", doc=body)
        expect_error(code, raw_request, cluster, owner, msg)
    expect_error(
        ErrorCode.BAD_REQUEST,
        raw_request,
        cluster,
        owner,
        Upsert(keyspace="docs", docid="", doc=b"{}"),
    )
    expect_error(
        ErrorCode.KEYSPACE_NOT_FOUND,
        raw_request,
        cluster,
        owner,
        Upsert(keyspace="nope", docid="a", doc=b"{}"),
    )
    assert client.high_seqnos("docs") == before
    assert ks.get("target") == {"v": 1}


def test_upsert_many_partial_failure_and_stats(client: Client) -> None:
    client.create_keyspace("bulk", NP)
    ks = client.keyspace("bulk")
    items: list[tuple[Any, Any]] = [(f"b{i}", {"i": i, "half": i % 2}) for i in range(3000)]
    items[10] = ("b10", "[not an object]")
    items[2500] = ("", {"i": 2500})
    done: list[int] = []
    with pytest.raises(BulkWriteError) as info:
        ks.upsert_many(items, chunk_size=500, on_chunk=lambda start, res: done.append(start))
    err = info.value
    assert err.code == ErrorCode.PARTIAL_FAILURE
    assert [(i, e.code) for i, _, e in err.failures] == [
        (10, ErrorCode.BAD_REQUEST),
        (2500, ErrorCode.BAD_REQUEST),
    ]
    assert "#10" in err.message and "#2500" in err.message
    assert done == list(range(0, 3000, 500))  # progress in input order
    ok = [r for r in err.results if not isinstance(r, ShardexError)]
    assert len(ok) == 2998
    stats = client.keyspace_stats("bulk")
    assert stats.total_docs == 2998 and len(stats.partitions) == NP
    assert sum(p for p, _ in stats.by_node().values()) == NP
    assert ks.get("b2999") == {"i": 2999, "half": 1}
    # Every result's seqno is where the stream has that document.
    results = ks.upsert_many([(f"c{i}", {"i": i}) for i in range(200)], chunk_size=64)
    p = results[0].partition
    _, changes = read_partition(ks, p)
    by_seqno = {c.seqno: c.docid for c in changes}
    for i, r in enumerate(results):
        if r.partition == p:
            assert by_seqno[r.seqno] == f"c{i}"


def test_high_seqnos_from_any_node(cluster: LocalCluster, client: Client) -> None:
    ks = client.keyspace("docs")
    ks.upsert_many([(f"h{i}", {"i": i}) for i in range(100)])
    expected = client.high_seqnos("docs")
    assert sorted(expected) == list(range(NP))
    for node in (1, 2, 3):
        reply = raw_request(cluster, node, HighSeqnos(keyspace="docs"))
        assert isinstance(reply, HighSeqnosReply)
        assert {p: tuple(v) for p, v in reply.entries.items()} == {
            p: (e.seqno, e.uuid) for p, e in expected.items()
        }


def test_not_my_partition_details_and_client_refresh(cluster: LocalCluster, client: Client) -> None:
    ks = client.keyspace("docs")
    ks.upsert("routed", {"v": 1})
    p = ks.partition_of("routed")
    owner = owner_of(client, "docs", p)
    wrong = next(n for n in (1, 2, 3) if f"node{n}" != owner)
    e = expect_error(
        ErrorCode.NOT_MY_PARTITION,
        raw_request,
        cluster,
        wrong,
        Get(keyspace="docs", docid="routed"),
    )
    assert e.details["keyspace"] == "docs" and e.details["partition"] == p
    assert e.details["owner_hint"] == owner
    assert isinstance(
        raw_request(cluster, int(owner[-1]), Get(keyspace="docs", docid="routed")), GetReply
    )

    # A client whose cached topology is wrong everywhere still reads and writes correctly.
    router = client.rpc.router
    _, topo = client.rpc.run(router.keyspace("docs"))
    rotate = {"node1": "node2", "node2": "node3", "node3": "node1"}
    stale = Topology(
        seq_num=topo.seq_num, assignment={q: rotate[n] for q, n in topo.assignment.items()}
    )
    router.force_topology("docs", stale)
    before = router.refreshes
    assert ks.get("routed") == {"v": 1}
    assert router.refreshes == before + 1
    router.force_topology("docs", stale)
    r = ks.upsert("routed", {"v": 2})
    assert r.partition == p and ks.get("routed") == {"v": 2}
    router.force_topology("docs", stale)
    ks.upsert_many([(f"s{i}", {"i": i}) for i in range(300)])  # re-routed per item
    assert all(ks.get(f"s{i}") == {"i": i} for i in (0, 150, 299))


def test_streams_over_the_wire(client: Client) -> None:
    client.create_keyspace("streams", 4)
    ks = client.keyspace("streams")
    ids = docids_in(2, 4, 30, "st")
    acks = [ks.upsert(d, {"n": i}) for i, d in enumerate(ids)]
    ks.delete(ids[0])
    uuid = acks[0].uuid
    markers, changes = read_partition(ks, 2)
    assert [c.seqno for c in changes] == list(range(1, 32))
    assert markers[0].start == 1 and markers[0].end == 31 and markers[0].uuid == uuid
    assert [c.docid for c in changes[:30]] == ids
    assert changes[0].doc() == {"n": 0} and changes[-1].deleted and changes[-1].body is None

    # A bounded range, and a resume from the middle on the right branch.
    with ks.stream(2, 10, uuid, end_seqno=20) as s:
        mid = [i for i in s if isinstance(i, Change)]
    assert [c.seqno for c in mid] == list(range(11, 21))

    # ROLLBACK: an unknown branch goes back to 0; a seqno beyond the history to its end.
    e = expect_error(ErrorCode.ROLLBACK, ks.stream, 2, 10, 12345)
    assert e.details["rollback_seqno"] == 0 and e.details["partition"] == 2
    e = expect_error(ErrorCode.ROLLBACK, ks.stream, 2, 500, uuid)
    assert e.details["rollback_seqno"] == 31

    # Follow: live changes arrive after the backlog, in order.
    with ks.stream(2, 31, uuid, follow=True) as live:
        assert live.next(timeout=0.3) is None and not live.done
        ks.upsert(ids[1], {"n": "live"})
        got = [live.next(timeout=5), live.next(timeout=5)]
        assert isinstance(got[0], SnapshotMarker) and got[0].start == 32
        assert isinstance(got[1], Change) and got[1].seqno == 32 and got[1].doc() == {"n": "live"}
        assert live.position == (32, uuid)


def test_stream_credit_bounds_buffering(client: Client) -> None:
    client.create_keyspace("credit", 1)
    ks = client.keyspace("credit")
    ks.upsert_many([(f"k{i}", {"pad": "x" * 100, "i": i}) for i in range(5000)])
    router = client.rpc.router
    with ks.stream(0, credit=2) as s:
        time.sleep(0.5)  # the node could send all 5000 now; credit lets it send 2 batches
        inbox = router.streams.get(s._remote.stream_id)
        assert inbox is not None and inbox.queued <= 2
        seen = [i.seqno for i in s if isinstance(i, Change)]
    assert seen == list(range(1, 5001))


def test_cli_keyspace_and_load(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    d = str(cluster.path)
    out = run_cli("keyspace", "create", "cli_ks", "--partitions", "8", "--dir", d).stdout
    assert "created keyspace cli_ks: 8 partitions" in out
    listed = json.loads(run_cli("keyspace", "list", "--dir", d, "--json").stdout)
    assert {k["name"] for k in listed} >= {"docs", "cli_ks"}
    bad_create = run_cli("keyspace", "create", "cli_ks", "--dir", d, check=False)
    assert bad_create.returncode == 1 and "already exists" in bad_create.stderr

    good = [json.dumps({"id": f"u{i}", "n": i}) for i in range(500)]
    lines = [*good[:100], "not json", "[1, 2]", '{"no_id": 1}', "", *good[100:]]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    proc = run_cli(
        "load", "cli_ks", str(path), "--dir", d, "--id-field", "id", "--batch", "64", check=False
    )
    assert proc.returncode == 1, proc.stderr
    assert "documents loaded" in proc.stdout and "500" in proc.stdout
    assert "line 101: not valid JSON" in proc.stderr
    assert "line 102: not a JSON object (got an array)" in proc.stderr
    assert "line 103: missing id field 'id'" in proc.stderr
    assert "3 line(s) were not loaded" in proc.stderr
    ks = client.keyspace("cli_ks")
    assert ks.get("u0") == {"id": "u0", "n": 0} and ks.get("u499")["n"] == 499

    ok = tmp_path / "ok.jsonl"
    ok.write_text("\n".join(good[:10]) + "\n")
    assert run_cli("load", "cli_ks", str(ok), "--dir", d).returncode == 0  # no --id-field
    stats = json.loads(run_cli("keyspace", "stats", "cli_ks", "--dir", d, "--json").stdout)
    assert stats["total_docs"] == 510 and len(stats["partitions"]) == 8
    missing = run_cli("load", "nope", str(ok), "--dir", d, check=False)
    assert missing.returncode == 1 and "keyspace 'nope' not found" in missing.stderr
    assert "dropped keyspace cli_ks" in run_cli("keyspace", "drop", "cli_ks", "--dir", d).stdout


def test_cached_client_survives_drop_and_recreate_by_another(
    cluster: LocalCluster, client: Client
) -> None:
    client.create_keyspace("again", 4)
    ks = client.keyspace("again")
    ks.upsert("x", {"gen": 1})
    with connect_local(cluster.path, name="other") as other:
        other.drop_keyspace("again")
        expect_error(ErrorCode.KEYSPACE_NOT_FOUND, ks.get, "x")  # our cache said it exists
        other.create_keyspace("again", 8)  # a new incarnation, another partition count
        r = ks.upsert("x", {"gen": 2})  # routed with the new topology after a refresh
        assert other.keyspace("again").get_versioned("x").seqno == r.seqno
        assert r.partition == other.keyspace("again").partition_of("x")
        assert client.keyspace_stats("again").total_docs == 1

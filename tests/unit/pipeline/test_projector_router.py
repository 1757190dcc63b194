"""Router destinations: owners for Upsert, every other slice for UpsertDeletion when keys can
move, every slice for broadcast deletions; batching by node."""

from __future__ import annotations

import msgspec
import pytest

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index import (
    BROADCAST,
    DELETE,
    ERROR,
    UPSERT,
    UPSERT_DELETION,
    index_partition_of,
    make_definition,
)
from shardex.pipeline.project.projector import project
from shardex.pipeline.project.router import IndexRoute, frames, route, routes_for

MOVING = make_definition(
    id="m", name="m", keyspace="ks", keys=["k"], partition_by=["k"], num_partition=4
)
BY_ID = make_definition(
    id="d", name="d", keyspace="ks", keys=["k"], partition_by=["META().id"], num_partition=4
)
PLAIN = make_definition(id="p", name="p", keyspace="ks", keys=["k"])
PLACE = {0: "n1", 1: "n2", 2: "n3", 3: "n1"}
ROUTES = {
    "m": IndexRoute.of(MOVING, Topology(seq_num=1, assignment=PLACE)),
    "d": IndexRoute.of(BY_ID, PLACE),
    "p": IndexRoute.of(PLAIN, {0: "n2"}),
}


def slices_of(res, kind=None):
    return sorted(
        (node, r[0], r[1], r[2])
        for node, rows in res.by_node.items()
        for r in rows
        if kind is None or r[2] == kind
    )


def test_moving_key_upsert_to_new_owner_deletions_to_others() -> None:
    doc = {"k": "paris"}
    new_p = index_partition_of(MOVING, doc, "x")
    rows = project([MOVING], [("x", 0, 7, "upsert", msgspec.json.encode(doc))]).rows
    res = route(rows, ROUTES)
    got = slices_of(res)
    assert (PLACE[new_p], "m", new_p, UPSERT) in got
    dels = {(n, p) for n, _, p, k in got if k == UPSERT_DELETION}
    assert dels == {(PLACE[q], q) for q in range(4) if q != new_p}
    assert len(got) == 4  # one key version per slice
    for rows in res.by_node.values():
        assert all(r[4:] == ("x", 0, 7) for r in rows)


def test_broadcast_deletions_reach_every_slice() -> None:
    for kind in (DELETE, UPSERT_DELETION):
        res = route([("m", BROADCAST, kind, b"", "x", 1, 3)], ROUTES)
        assert slices_of(res) == sorted((PLACE[q], "m", q, kind) for q in range(4))


def test_docid_partitioned_and_plain_go_to_owner_only() -> None:
    rows = project(
        [BY_ID, PLAIN], [("x", 0, 1, "upsert", b'{"k": 1}'), ("x", 0, 2, "delete", None)]
    )
    res = route(rows.rows, ROUTES)
    got = slices_of(res)
    p = index_partition_of(BY_ID, {}, "x")
    assert got == sorted(
        [
            (PLACE[p], "d", p, UPSERT),
            (PLACE[p], "d", p, DELETE),
            ("n2", "p", 0, UPSERT),
            ("n2", "p", 0, DELETE),
        ]
    )


def test_errors_counted_unknown_index_rejected_frames() -> None:
    res = route([("m", BROADCAST, ERROR, b"boom", "x", 0, 1)], ROUTES)
    assert res.by_node == {} and res.errors == {"m": 1}
    with pytest.raises(ShardexError) as ei:
        route([("zz", 0, UPSERT, b"e", "x", 0, 1)], ROUTES)
    assert ei.value.code == ErrorCode.INDEX_NOT_FOUND
    with pytest.raises(ShardexError):
        IndexRoute.of(MOVING, {0: "n1"})  # partitions without an owner
    rows = [("p", 0, UPSERT, b"e", f"x{i}", 0, i) for i in range(10)]
    assert [len(f) for f in frames(rows, 4)] == [4, 4, 2]
    assert routes_for([PLAIN], {"p": {0: "n9"}})["p"].owners == ("n9",)


def test_delivery_report_refuses_a_restart_between_frames() -> None:
    """A node that answered one frame of a batch as one incarnation and the next as another
    lost the first frame: the batch must be delivered again (STALE_DELIVERY, retried)."""
    from shardex.api.delivery import Delivered
    from shardex.pipeline.rounds.machine import DeliveryReport

    report = DeliveryReport()
    report.add(Delivered(node="n1", incarnation="a", accepted=2))
    report.add(Delivered(node="n2", incarnation="b", accepted=1))
    report.add(Delivered(node="n1", incarnation="a", accepted=3))
    assert report.incarnations == {"n1": "a", "n2": "b"} and report.accepted == 6
    with pytest.raises(ShardexError) as info:
        report.add(Delivered(node="n1", incarnation="c"))
    assert info.value.code is ErrorCode.STALE_DELIVERY


def _expected(rows, routes):
    """The destinations by the rules in the router's docstring, one row at a time."""
    out: dict[str, list] = {}
    for row in rows:
        index_id, ip, kind, _e, docid, part, seqno = row
        if kind == ERROR:
            continue
        r = routes[index_id]
        sent = []
        if kind == UPSERT:
            sent.append((ip, row))
            if r.moving:
                sent += [
                    (q, (index_id, q, UPSERT_DELETION, b"", docid, part, seqno))
                    for q in range(r.num_partition)
                    if q != ip
                ]
        elif ip == BROADCAST:
            sent += [
                (q, (index_id, q, kind, b"", docid, part, seqno)) for q in range(r.num_partition)
            ]
        else:
            sent.append((ip, row))
        for q, kv in sent:
            for node in (r.owners[q], *r.extra().get(q, ())):
                out.setdefault(node, []).append(kv)
    return out


def test_rows_reach_their_nodes_in_input_order_and_only_nodes_with_rows_are_listed() -> None:
    """Indexes whose rows each go to one node (by docid, unpartitioned) and indexes with
    moving keys, replicas or broadcasts, interleaved in one batch: every node's list is
    exactly the rule's destinations in input order, and a node no row goes to is absent."""
    owners = ROUTES["d"].owners
    routes = {**ROUTES, "r": IndexRoute("r", 4, owners, False, {}, {1: ("n4",)})}  # replicas
    rows = []
    for i in range(40):
        ip = (i * 7) % 3  # slice 3 of "d" (n1) and "r" never used, slice 2 only by some
        rows.append(("d", ip, UPSERT, b"e%d" % i, f"x{i}", i % 5, i + 1))
        rows.append(("p", 0, DELETE if i % 4 == 0 else UPSERT, b"", f"x{i}", i % 5, i + 1))
        if i % 3 == 0:
            rows.append(("m", BROADCAST, DELETE, b"", f"x{i}", i % 5, i + 1))
        if i % 5 == 0:
            rows.append(("m", i % 4, UPSERT, b"k", f"x{i}", i % 5, i + 1))
            rows.append(("r", 1, UPSERT, b"k", f"x{i}", i % 5, i + 1))
        if i % 11 == 0:
            rows.append(("d", BROADCAST, ERROR, b"boom", f"x{i}", i % 5, i + 1))
    res = route(rows, routes)
    assert res.by_node == _expected(rows, routes)
    assert res.errors == {"d": 4}
    only_d = [r for r in rows if r[0] == "d" and r[2] != ERROR and r[1] != 2]
    res = route(only_d, routes)
    assert list(res.by_node) == ["n1", "n2"]  # n3 owns slice 2 only: no row, not listed
    assert res.by_node == _expected(only_d, routes)

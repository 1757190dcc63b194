"""Paginated primary scans (``client.scan_page(ks, "#primary")``) on a real cluster while data
partitions migrate: 2 node processes, a third added with ``shardex cluster add-node``, then

* a scan whose partition moves between two of its pages (``move_partition``): the move is
  found by the source shard's next batch (the continuation's virtual-scan map names it),
  the partition is read on its new node as a virtual shard, and the pages together hold
  every document exactly once;
* ``shardex rebalance`` while client threads run paginated scans back to back with random
  page sizes, ordered and unordered: every scan's union equals the documents, none doubled;
* a partition moved twice during one scan ends it with QUERY_STATE;
* an edited, truncated or foreign continuation, a bad page size or span: BAD_REQUEST naming
  the problem, and the scan goes on from the genuine continuation.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli
from data_helpers import owner_of, running_cluster

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.continuation import Continuation, ContinuationCodec

pytestmark = pytest.mark.cluster

KS = "paged"
NP = 16
DOCS = 1500
PRIMARY = "#primary"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("scanpage"), nodes=2) as c:
        admin = connect_local(c.path, name="setup")
        admin.create_keyspace(KS, NP)
        ks = admin.keyspace(KS)
        ks.upsert_many((f"doc{i:05d}", {"i": i}) for i in range(DOCS))
        admin.close()
        run_cli("cluster", "add-node", "--dir", str(c.path))
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    c = connect_local(cluster.path, name="pager")
    yield c
    c.close()


def expected() -> set[str]:
    return {f"doc{i:05d}" for i in range(DOCS)}


def decode(cluster: LocalCluster, continuation: str) -> Continuation:
    return ContinuationCodec(cluster.secret()).decode(continuation)


def drain(
    client: Client,
    page_sizes: Iterator[int],
    *,
    ordered: bool,
    between: Any = None,
    spans: Any = None,
) -> list[list[str]]:
    pages: list[list[str]] = []
    cont: str | None = None
    while True:
        page = client.scan_page(
            KS, PRIMARY, spans=spans, page_size=next(page_sizes), continuation=cont, ordered=ordered
        )
        assert all(r["key"] == [r["docid"]] for r in page.rows)
        pages.append([r["docid"] for r in page.rows])
        cont = page.continuation
        if cont is None:
            return pages
        if between is not None:
            between(len(pages), cont)


def check_exact(pages: list[list[str]], want: set[str], *, ordered: bool) -> None:
    rows = [d for p in pages for d in p]
    dups = {d for d in rows if rows.count(d) > 1} if len(rows) != len(set(rows)) else set()
    assert not dups, f"returned twice: {sorted(dups)[:10]}"
    assert set(rows) == want, (
        f"lost {sorted(want - set(rows))[:10]}, unexpected {sorted(set(rows) - want)[:10]}"
    )
    if ordered:
        assert rows == sorted(rows)


def test_primary_scan_with_spans_and_page_limits(client: Client) -> None:
    spans = [{"low": ["doc00100"], "high": ["doc00200"], "inclusion": "low"}]
    pages = drain(client, iter(lambda: 17, None), ordered=True, spans=spans)
    assert all(len(p) <= 17 for p in pages)
    check_exact(pages, {f"doc{i:05d}" for i in range(100, 200)}, ordered=True)
    unordered = drain(client, iter(lambda: 400, None), ordered=False)
    check_exact(unordered, expected(), ordered=False)


@pytest.mark.parametrize("ordered", [False, True])
def test_partition_moved_between_pages_is_scanned_on_its_new_node(
    cluster: LocalCluster, client: Client, ordered: bool
) -> None:
    """After page 1 (on the first base shard), move one of that shard's partitions to the
    other node: the next batch there hands it to a virtual scan, and nothing is lost."""
    first = client.scan_page(KS, PRIMARY, page_size=20, ordered=ordered)
    assert first.continuation is not None
    ck = decode(cluster, first.continuation)
    assert ck.base_topo >= 1 and not ck.vsm
    status = {ks.name: ks for ks in client.list_keyspaces()}[KS]
    nodes = sorted(set(status.assignment.values()))
    source = nodes[0]
    target = next(n for n in ("node1", "node2", "node3") if n != source)
    moved = max(p for p, n in status.assignment.items() if n == source)
    client.move_partition(KS, moved, target)
    assert owner_of(client, KS, moved) == target

    pages = [[r["docid"] for r in first.rows]]
    cont: str | None = first.continuation
    seen_virtual = False
    while cont is not None:
        page = client.scan_page(KS, PRIMARY, page_size=37, continuation=cont, ordered=ordered)
        pages.append([r["docid"] for r in page.rows])
        cont = page.continuation
        if cont is not None:
            seen_virtual = seen_virtual or any(v.pid == moved for v in decode(cluster, cont).vsm)
    assert seen_virtual, "the move was never handed to a virtual scan"
    check_exact(pages, expected(), ordered=ordered)


def test_rebalance_while_paginated_scans_run(cluster: LocalCluster) -> None:
    """Client threads scan back to back with random page sizes while ``rebalance`` moves
    partitions onto the new node; every complete scan is exact."""
    stop = threading.Event()
    results: list[tuple[bool, list[list[str]]]] = []
    errors: list[BaseException] = []

    def scanner(seed: int) -> None:
        rng = random.Random(seed)
        c = connect_local(cluster.path, name=f"scanner{seed}")
        try:
            while not stop.is_set() or len(results) < 4:
                ordered = rng.random() < 0.5
                sizes = iter(lambda: rng.choice([1, 7, 50, 133, 400]), None)
                results.append((ordered, drain(c, sizes, ordered=ordered)))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=scanner, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    admin = connect_local(cluster.path, name="rebalancer")
    try:
        result = admin.rebalance()
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    topologies = len(admin.rpc.run(admin.rpc.router.refresh()).data_topologies[KS])
    admin.close()
    assert not errors, [
        (getattr(e, "code", None), str(e), getattr(e, "details", None)) for e in errors
    ]
    assert result.state == "done" and result.moved
    print(f"\n{len(results)} paginated scans during a rebalance of {len(result.moved)} moves")
    for ordered, pages in results:
        check_exact(pages, expected(), ordered=ordered)
    assert topologies >= len(result.moved) + 1


def test_partition_moved_twice_during_a_scan_is_query_state(
    cluster: LocalCluster, client: Client
) -> None:
    status = {ks.name: ks for ks in client.list_keyspaces()}[KS]
    nodes = sorted(set(status.assignment.values()))
    source = nodes[0]
    other = nodes[-1]
    mine = sorted(p for p, n in status.assignment.items() if n == source)
    moved = mine[-1]
    first = client.scan_page(KS, PRIMARY, page_size=5, ordered=False)
    assert first.continuation is not None
    client.move_partition(KS, moved, other)
    second = client.scan_page(KS, PRIMARY, page_size=5, continuation=first.continuation)
    assert second.continuation is not None
    assert any(v.pid == moved for v in decode(cluster, second.continuation).vsm)
    client.move_partition(KS, moved, source)  # back: its skipped entries would be lost
    with pytest.raises(ShardexError) as info:
        client.scan_page(KS, PRIMARY, page_size=5, continuation=second.continuation)
    assert info.value.code == ErrorCode.QUERY_STATE
    assert info.value.details["partition"] == moved


def test_tampered_continuation_is_refused(cluster: LocalCluster, client: Client) -> None:
    page = client.scan_page(KS, PRIMARY, page_size=10, ordered=True)
    cont = page.continuation
    assert cont is not None
    flipped = cont[:10] + ("A" if cont[10] != "A" else "B") + cont[11:]
    for bad in (flipped, cont[:-4], cont + "AA", "not-a-continuation"):
        with pytest.raises(ShardexError) as info:
            client.scan_page(KS, PRIMARY, page_size=10, continuation=bad, ordered=True)
        assert info.value.code == ErrorCode.BAD_REQUEST
        assert "continuation" in str(info.value)
    # Another cluster's secret: refused as well.
    foreign = ContinuationCodec("another-cluster").encode(decode(cluster, cont))
    with pytest.raises(ShardexError) as info:
        client.scan_page(KS, PRIMARY, page_size=10, continuation=foreign, ordered=True)
    assert info.value.code == ErrorCode.BAD_REQUEST
    # Replayed on a different scan (unordered, or other spans): refused.
    with pytest.raises(ShardexError) as info:
        client.scan_page(KS, PRIMARY, page_size=10, continuation=cont, ordered=False)
    assert "different scan" in str(info.value)
    # Bad arguments: clear errors naming the value.
    with pytest.raises(ShardexError) as info:
        client.scan_page(KS, PRIMARY, page_size=0)
    assert info.value.code == ErrorCode.BAD_REQUEST and "page_size" in str(info.value)
    with pytest.raises(ShardexError) as info:
        client.scan_page(KS, PRIMARY, spans=[{"low": [5]}], page_size=10)
    assert info.value.code == ErrorCode.BAD_REQUEST and "docid" in str(info.value)
    with pytest.raises(ShardexError) as info:
        client.scan_page("nope", PRIMARY, page_size=10)
    assert info.value.code == ErrorCode.KEYSPACE_NOT_FOUND
    # The genuine continuation still works after all that.
    rest = [r["docid"] for r in page.rows]
    while cont is not None:
        nxt = client.scan_page(KS, PRIMARY, page_size=300, continuation=cont, ordered=True)
        rest += [r["docid"] for r in nxt.rows]
        cont = nxt.continuation
    check_exact([rest], expected(), ordered=True)

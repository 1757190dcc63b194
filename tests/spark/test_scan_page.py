"""Paginated index scans (``client.scan_page``) end to end: a real 3-node cluster, the Spark
pipeline (both shared with other modules: ``shared_cluster``) maintaining a partitioned
index of this module's own keyspace (4 slices over 3 indexers), and pages of random
sizes, ordered and unordered, compared with ``client.scan`` of the same span and with the
oracle (the definition over the documents the test wrote, ``pipeline_helpers.mutate``).

request_plus pins one stability TS in the continuation: writes made between two pages are
not seen by the later pages, so the pages together are exactly the index at that TS."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from pipeline_helpers import documents_at, mutate, wait_stable

from shardex.api.spans import encode_spans, to_user_spans
from shardex.client import Client
from shardex.core.keycodec import decode_entry
from shardex.core.spans import in_ranges, spans_to_ranges
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.oracle import expected_entries
from shardex.index.slice import DEFAULT_KEEP_SNAPSHOTS
from shardex.meta.cluster_dir import read_secret
from shardex.meta.index_state import find_index
from shardex.pipeline.indexers import index_state, to_node
from shardex.scan.continuation import ContinuationCodec
from shardex.scan.paging_leases import RELEASE, LeaseSnapshots, SnapshotsLeased
from shardex.scan.paging_store_spec import decode_context

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KEYSPACE = "paged_idx"
INDEX = "by_age"
WAIT = 120.0

Row = tuple[list[Any], str]


@pytest.fixture(scope="module")
def env(shared_cluster: SharedCluster) -> Iterator[Client]:
    client = shared_cluster.client
    with shared_cluster.keyspace(KEYSPACE):
        mutate(client, KEYSPACE, random.Random(5), 400)
        client.create_index(
            KEYSPACE, INDEX, ["age", "name"], partition_by=["META().id"], num_partition=4
        )
        client.wait_for_index(KEYSPACE, INDEX, timeout=240)
        yield client


def oracle(client: Client, ts: Timestamp, spans: Any = None) -> list[Row]:
    """The index's entries in ``spans`` over the documents as of ``ts``, in index order."""
    rec = find_index(index_state(client).indexes, KEYSPACE, INDEX)
    assert rec is not None
    defn = rec.definition
    ranges = spans_to_ranges(encode_spans(to_user_spans(spans), defn))
    docs = documents_at(client, KEYSPACE, ts)
    entries = sorted(e for _, e in expected_entries(defn, docs) if in_ranges(e, ranges))
    return [decode_entry(e, defn.desc) for e in entries]


def paged(
    client: Client, rng: random.Random, *, ordered: bool, between: Any = None, **kw: Any
) -> tuple[list[Row], set[Any]]:
    """Every page of one scan (random page sizes); returns the rows and the TSs read."""
    out: list[Row] = []
    tss: set[Any] = set()
    cont: str | None = None
    while True:
        page = client.scan_page(
            KEYSPACE,
            INDEX,
            page_size=rng.choice([1, 5, 17, 60, 250]),
            continuation=cont,
            ordered=ordered,
            timeout=WAIT,
            **kw,
        )
        out += [(r["key"], r["docid"]) for r in page.rows]
        tss.add(None if page.ts is None else tuple(sorted(page.ts.to_wire().items())))
        cont = page.continuation
        if cont is None:
            return out, tss
        if between is not None:
            between()


@pytest.mark.timeout(600)
def test_paged_index_scans_equal_scan_rows(env: Client) -> None:
    rng = random.Random(3)
    spans = [{"low": [5], "high": [30], "inclusion": "low"}, {"low": [35, "cy"]}]
    for span in (None, spans):
        full = env.scan(KEYSPACE, INDEX, span, consistency="request_plus", timeout=WAIT)
        want = [(r["key"], r["docid"]) for r in full]
        assert full.ts is not None and want == oracle(env, full.ts, span)
        assert len(want) > 50
        # not_bounded reads the tips; nothing is written meanwhile, so they are at full.ts.
        got, tss = paged(env, rng, ordered=True, spans=span)
        assert got == want and tss == {None}
        got, _ = paged(env, rng, ordered=False, spans=span)
        assert sorted(got, key=repr) == sorted(want, key=repr) and len(got) == len(want)


@pytest.mark.timeout(600)
def test_request_plus_pages_read_one_pinned_snapshot(env: Client) -> None:
    """Writes between pages change the index, but every page reads the TS the first pinned."""
    rng = random.Random(11)
    writer_rng = random.Random(12)
    for ordered in (True, False):
        first = env.scan_page(
            KEYSPACE,
            INDEX,
            consistency="request_plus",
            page_size=40,
            ordered=ordered,
            timeout=WAIT,
        )
        assert first.ts is not None and first.continuation is not None
        want = oracle(env, first.ts)
        rows = [(r["key"], r["docid"]) for r in first.rows]
        mutate(env, KEYSPACE, writer_rng, 15)  # after the first page, before the others
        cont: str | None = first.continuation
        while cont is not None:
            page = env.scan_page(
                KEYSPACE,
                INDEX,
                consistency="request_plus",
                page_size=rng.choice([3, 40, 200]),
                continuation=cont,
                ordered=ordered,
                timeout=WAIT,
            )
            assert page.ts == first.ts
            rows += [(r["key"], r["docid"]) for r in page.rows]
            cont = page.continuation
        if ordered:
            assert rows == want
        else:
            assert sorted(rows, key=repr) == sorted(want, key=repr) and len(rows) == len(want)
        # The writes are visible to a new request_plus scan: the pin really was a pin.
        now = env.scan(KEYSPACE, INDEX, consistency="request_plus", timeout=WAIT)
        now_rows = [(r["key"], r["docid"]) for r in now]
        assert now.ts is not None and now_rows == oracle(env, now.ts) and now_rows != want


@pytest.mark.timeout(600)
def test_a_lost_lease_ends_the_scan_on_the_next_page(
    env: Client, shared_cluster: SharedCluster
) -> None:
    """The pinned snapshot is gone on an indexer the next page does not even read (its lease
    was released and newer snapshots pushed it out): the renewal that page sends finds it
    gone, and the page ends the scan with SNAPSHOT_TOO_OLD instead of returning rows."""
    first = env.scan_page(
        KEYSPACE, INDEX, consistency="request_plus", page_size=1, ordered=False, timeout=WAIT
    )
    assert first.continuation is not None
    ck = ContinuationCodec(read_secret(shared_cluster.path)).decode(first.continuation)
    lease = decode_context(ck.context).lease
    rec = find_index(index_state(env).indexes, KEYSPACE, INDEX)
    assert rec is not None and lease
    base = next(t for t in index_state(env).index_topologies[rec.id] if t.seq_num == ck.base_topo)
    shards = base.nodes()  # an unordered scan reads them one after the other
    assert ck.shard_idx == 0 and len(shards) > 1
    last = shards[-1]
    release = LeaseSnapshots(
        index_id=rec.id, partitions=base.partitions_of(last), lease_id=lease, mode=RELEASE
    )
    env.rpc.run(to_node(env, last, release, SnapshotsLeased))
    for n in range(DEFAULT_KEEP_SNAPSHOTS + 2):  # newer snapshots push the pinned one out
        env.keyspace(KEYSPACE).upsert(f"lease-{n}", {"age": n, "name": "pushed"})
        wait_stable(env, KEYSPACE, [INDEX])
    with pytest.raises(ShardexError) as info:
        env.scan_page(
            KEYSPACE, INDEX, consistency="request_plus", page_size=1, ordered=False,
            continuation=first.continuation, timeout=WAIT,
        )  # fmt: skip
    assert info.value.code is ErrorCode.SNAPSHOT_TOO_OLD, info.value

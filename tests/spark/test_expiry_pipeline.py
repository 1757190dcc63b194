"""Expired documents leave the indexes: on the shared cluster with the Spark pipeline
running, documents are indexed, then given a short expiry (``touch``) and expire; the
reads that find them expired have them deleted (expirations in the change streams,
deletions to the pipeline), and the index ends equal to the oracle over the documents
still live."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import wait_for

from shardex.client import Client
from shardex.core.keycodec import decode_entry
from shardex.errors import ErrorCode, ShardexError
from shardex.index.oracle import expected_entries
from shardex.meta.index_state import find_index
from shardex.pipeline.indexers import index_state

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KEYSPACE = "expiring"
TTL = 2
WAIT = 120.0


def _rows(c: Client) -> list[tuple[list[Any], str]]:
    result = c.scan(KEYSPACE, "by_age", consistency="request_plus", timeout=WAIT)
    return sorted((r["key"], r["docid"]) for r in result)


def _oracle(c: Client, docs: dict[str, Any]) -> list[tuple[list[Any], str]]:
    rec = find_index(index_state(c).indexes, KEYSPACE, "by_age")
    assert rec is not None
    defn = rec.definition
    return sorted(decode_entry(e, defn.desc) for _, e in expected_entries(defn, docs))


def _expired(c: Client, docid: str) -> bool:
    try:
        c.keyspace(KEYSPACE).get(docid)  # a read of an expired document has it deleted
    except ShardexError as exc:
        assert exc.code is ErrorCode.DOC_NOT_FOUND
        return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_expired_documents_leave_the_index(shared_cluster: SharedCluster) -> None:
    c = shared_cluster.client
    with shared_cluster.keyspace(KEYSPACE, num_partitions=8):
        ks = c.keyspace(KEYSPACE)
        live = {f"k{i}": {"age": i % 20} for i in range(40)}
        ks.upsert_many(live.items())
        c.create_index(KEYSPACE, "by_age", ["age"], partition_by=["META().id"], num_partition=2)
        c.wait_for_index(KEYSPACE, "by_age", timeout=240)
        short = {f"e{i}": {"age": i % 20} for i in range(30)}
        ks.upsert_many(short.items())
        assert _rows(c) == _oracle(c, {**live, **short})  # indexed
        for d in short:  # then they expire: a touch gives each a short expiry
            ks.touch(d, TTL)
        wait_for(lambda: all(_expired(c, d) for d in short), TTL + 60, what="the documents expired")
        want = _oracle(c, live)
        wait_for(lambda: _rows(c) == want, 240, what="the expirations reached the index")

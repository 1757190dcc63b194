"""The client's one-chunk ``upsert_many`` (one hop to its loop, one request per node sent
directly) on a real 3-node cluster: results aligned with the input, per-item failures,
progress callback, unknown keyspace, and the same outcome as the multi-chunk path."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import BulkWriteError, Client, connect_local
from shardex.client.bulk import BulkWriter
from shardex.errors import ErrorCode, ShardexError

pytestmark = pytest.mark.cluster

NP = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("write-path")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(cluster.path) as c:
        c.create_keyspace("w", NP)
        yield c


def test_one_chunk_results_failures_and_progress(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    ks = client.keyspace("w")
    used: list[int] = []
    real = BulkWriter.write_only_chunk

    async def spy(self: BulkWriter, ops: Any) -> Any:
        used.append(len(ops))
        return await real(self, ops)

    monkeypatch.setattr(BulkWriter, "write_only_chunk", spy)
    items: list[tuple[Any, Any]] = [(f"one{i}", {"i": i}) for i in range(40)]
    items[7] = ("one7", b"[1]")  # not an object: fails alone, on the client
    progress: list[tuple[int, int]] = []
    with pytest.raises(BulkWriteError) as info:
        ks.upsert_many(items, on_chunk=lambda start, res: progress.append((start, len(res))))
    err = info.value
    assert used == [39]  # the one-chunk path, with the 39 valid items
    assert [(i, d, e.code) for i, d, e in err.failures] == [(7, "one7", ErrorCode.BAD_REQUEST)]
    assert progress == [(0, 40)]
    for i, r in enumerate(err.results):
        if i == 7:
            continue
        assert not isinstance(r, ShardexError)
        assert r.partition == ks.partition_of(f"one{i}")  # aligned with the input
        assert ks.get_versioned(f"one{i}").seqno == r.seqno
    # Without raising: the same list, the error in its slot.
    out = ks.upsert_many(items, raise_errors=False)
    assert isinstance(out[7], ShardexError) and out[7].code == ErrorCode.BAD_REQUEST
    assert sum(not isinstance(r, ShardexError) for r in out) == 39


def test_one_chunk_matches_many_chunks_and_keeps_input_order(client: Client) -> None:
    ks = client.keyspace("w")
    # The same docid twice in one call: the later value wins, with the higher seqno.
    items = [("dup", {"v": 1}), ("x1", {"v": 0}), ("dup", {"v": 2})]
    first, _, last = ks.upsert_many(items)
    assert not isinstance(first, ShardexError) and not isinstance(last, ShardexError)
    assert last.seqno > first.seqno and ks.get("dup") == {"v": 2}
    docs = [(f"m{i}", {"i": i}) for i in range(60)]
    one = ks.upsert_many(docs)  # one chunk
    many = ks.upsert_many(docs, chunk_size=7)  # nine chunks through the sender tasks
    assert [r.partition for r in one] == [r.partition for r in many]
    for a, b in zip(one, many, strict=True):
        assert b.seqno > a.seqno


def test_one_chunk_unknown_keyspace_fails_whole(client: Client) -> None:
    for items in ([("a", {"x": 1})], []):
        with pytest.raises(ShardexError) as info:
            client.keyspace("absent").upsert_many(items)
        assert info.value.code == ErrorCode.KEYSPACE_NOT_FOUND

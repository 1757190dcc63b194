"""A ``MutateMany`` over real TCP to an in-process data service, with one document nested
too deep among ten good ones (sent as raw bytes, as a client that skips the checks would):
only that item errors, the ten are written, and the node still serves."""

from __future__ import annotations

import msgspec

from shardex.api.data import GetMany, GetManyReply, MutateMany, MutateManyReply, OpItem
from shardex.api.validation import MAX_DOC_DEPTH
from shardex.errors import ErrorCode
from shardex.net import ConnectionPool, TcpTransport
from tests.integration.data.test_data_get_many import KS, SECRET, cluster, owner

__all__ = ["cluster"]  # the fixture, used by name

DEEP = b'{"a":' * 10_000 + b"1" + b"}" * 10_000


async def test_one_too_deep_document_among_ten_fails_alone(cluster) -> None:
    _, addresses = cluster
    good = [d for d in (f"doc-{i}" for i in range(80)) if owner(d) == "n1"][:10]
    ops = [OpItem("upsert", d, b'{"n": %d}' % k) for k, d in enumerate(good)]
    ops.insert(4, OpItem("upsert", "deep", DEEP))
    pool = ConnectionPool(TcpTransport(), SECRET, name="t")
    try:
        reply = await pool.request(
            addresses["n1"], MutateMany(keyspace=KS, ops=ops), 10.0, expect=MutateManyReply
        )
        assert [e.index for e in reply.errors] == [4]
        err = reply.errors[0].error
        assert err.code == ErrorCode.BAD_REQUEST.value
        assert err.details["docid"] == "deep"
        assert err.details["depth"] == 10_000 and err.details["limit"] == MAX_DOC_DEPTH
        assert sum(r is not None for r in reply.results) == 10
        got = await pool.request(
            addresses["n1"], GetMany(keyspace=KS, docids=good), 5.0, expect=GetManyReply
        )
        assert [msgspec.json.decode(b) for b in got.bodies] == [{"n": k} for k in range(10)]
    finally:
        await pool.close()

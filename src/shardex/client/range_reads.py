"""Multi-range change reads in the client: one ``ReadRanges`` per owner node, all at once.

``read_round(router, keyspace, specs)`` groups the ranges by owner from the router's cached
topology, sends each owner its ranges in one request (concurrently), and answers every
range's ``RangeChanges`` in the order asked. A node that cannot be reached, or a request
that fails as a whole, becomes an error on each of that owner's ranges (the reply's own
per-range errors pass through untouched), so the caller decides per range: continue from
``reached``, resume elsewhere after a topology refresh, or fail. Nothing here retries:
the exactness rules and the resume deadline are the reader's (``pipeline/source/ranges.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shardex.api.data import RangeChanges, RangeSpec, ReadRanges, ReadRangesReply
from shardex.api.errors import WireError
from shardex.client.routing import DataRouter
from shardex.errors import ErrorCode, ShardexError

__all__ = ["RangeChanges", "RangeSpec", "read_round"]


async def read_round(
    router: DataRouter,
    keyspace: str,
    specs: Sequence[RangeSpec],
    *,
    max_items: int = 20_000,
    max_bytes: int = 8 * 1024 * 1024,
) -> list[RangeChanges]:
    """One ``ReadRanges`` per owner of ``specs``' partitions, sent at once; the answer of
    every range in ``specs``' order. Raises only for the keyspace itself (not found)."""
    _, topo = await router.keyspace(keyspace)
    by_owner: dict[str, list[int]] = {}
    out: list[RangeChanges | None] = [None] * len(specs)
    for i, s in enumerate(specs):
        node = topo.assignment.get(s.partition)
        if node is None:
            out[i] = _error(
                s,
                ShardexError(
                    f"partition {s.partition} is not in topology {topo.seq_num} of {keyspace!r}",
                    code=ErrorCode.BAD_REQUEST,
                    details={"keyspace": keyspace, "partition": s.partition},
                ),
            )
            continue
        by_owner.setdefault(node, []).append(i)
    owners = list(by_owner)
    replies = await asyncio.gather(
        *(
            _ask(router, keyspace, node, [specs[i] for i in by_owner[node]], max_items, max_bytes)
            for node in owners
        ),
        return_exceptions=True,
    )
    for node, reply in zip(owners, replies, strict=True):
        idx = by_owner[node]
        if isinstance(reply, ShardexError) and reply.code is ErrorCode.KEYSPACE_NOT_FOUND:
            raise reply
        if isinstance(reply, BaseException):
            if not isinstance(reply, ShardexError):
                raise reply
            for i in idx:
                out[i] = _error(specs[i], reply)
            continue
        if len(reply.results) != len(idx):
            raise ShardexError(
                f"node {node} answered {len(reply.results)} ranges for {len(idx)}",
                code=ErrorCode.INTERNAL,
                details={"node": node},
            )
        for i, res in zip(idx, reply.results, strict=True):
            out[i] = res
    return [r for r in out if r is not None]


async def _ask(
    router: DataRouter,
    keyspace: str,
    node: str,
    specs: list[RangeSpec],
    max_items: int,
    max_bytes: int,
) -> ReadRangesReply:
    msg = ReadRanges(keyspace=keyspace, ranges=specs, max_items=max_items, max_bytes=max_bytes)
    return await router.to_node(node, msg, ReadRangesReply)


def _error(spec: RangeSpec, exc: ShardexError) -> RangeChanges:
    code, message, details = exc.to_wire()
    return RangeChanges(
        partition=spec.partition,
        uuid=spec.uuid,
        reached=spec.from_seqno,
        error=WireError(code, message, dict(details)),
    )

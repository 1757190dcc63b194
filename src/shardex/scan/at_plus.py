"""at_plus tokens across failovers: check each against its partition's current history.

An at_plus read waits for a stability TS that covers the caller's mutation tokens, and
``Timestamp.covers`` compares a partition's entries only on the same branch. After a
failover promoted a replica (a new branch, a new uuid), a token of the old branch would never
be covered and the read would wait out its timeout. So before the wait, each token is checked
with the partition's owner (``CheckHistory``, answered from memory by the failover log's
rule): a token still in the history (at or below where its branch ended) is the same point
on the current branch and is rewritten with the current uuid; a token past that point names
a write the failover lost, and the read fails at once with ROLLBACK naming the partition.
Tokens already on the current branch pass unchanged. One request per owner node, like the
high-seqno round of a request_plus read; the owners' answers wait (bounded) while a failover
is still promoting a dead owner's partitions.
"""

from __future__ import annotations

import asyncio
from typing import Final

from shardex.api.data import CheckHistory, HistoryChecked
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.scan.cluster_view import SEQNO_FAILOVER_WAIT, SEQNO_TIMEOUT, ClusterView

CHECK_ATTEMPTS: Final = 4
_RETRY = frozenset(
    (
        ErrorCode.NOT_MY_PARTITION,
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.TIMEOUT,
        ErrorCode.NODE_FAILED_OVER,
    )
)


async def on_current_branches(view: ClusterView, keyspace: str, want: Timestamp) -> Timestamp:
    """``want`` with every token on its partition's current branch (module docstring);
    ROLLBACK for a token of a lost branch."""
    points = {p: e for p, e in want.items() if e.seqno > 0}
    if not points:
        return want
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SEQNO_FAILOVER_WAIT
    attempt = 0
    out = dict(want.to_wire())
    last: ShardexError | None = None
    while points:
        owners = await view.data_owners(keyspace)
        owned = {p for parts in owners.values() for p in parts}
        for p in [p for p in points if p not in owned]:
            del points[p]  # no such partition (or keyspace) now: the wait says so
        asks = {
            node: [(p, points[p].seqno, points[p].uuid) for p in parts if p in points]
            for node, parts in owners.items()
        }
        asks = {n: pts for n, pts in asks.items() if pts}
        replies = await asyncio.gather(
            *(_ask(view, keyspace, n, pts) for n, pts in asks.items()), return_exceptions=True
        )
        for reply in replies:
            if isinstance(reply, ShardexError) and reply.code in _RETRY:
                last = reply
                continue
            if isinstance(reply, BaseException):
                raise reply
            for pt in reply.points:
                token = points.pop(pt.partition)
                if pt.rollback is not None:
                    raise ShardexError(
                        f"the at_plus token for partition {pt.partition} of {keyspace!r} "
                        f"(seqno {token.seqno} on branch {token.uuid:x}) is on a history the "
                        f"cluster lost in a failover (it ended at seqno {pt.rollback}): the "
                        "write it names may be gone",
                        code=ErrorCode.ROLLBACK,
                        details={
                            "keyspace": keyspace,
                            "partition": pt.partition,
                            "seqno": token.seqno,
                            "uuid": token.uuid,
                            "rollback_seqno": pt.rollback,
                            "hint": "read the document to see what survived; tokens of "
                            "writes at durability majority survive a failover",
                        },
                    )
                out[pt.partition] = (token.seqno, pt.uuid)
        if not points:
            break
        attempt += 1
        if attempt >= CHECK_ATTEMPTS and loop.time() >= deadline:
            raise NodeUnavailable(
                f"no owner answered for the at_plus tokens of partitions {sorted(points)[:20]} "
                f"of {keyspace!r}",
                details={"keyspace": keyspace, "cause": str(last) if last else None},
            )
        await asyncio.sleep(min(0.05 * 2 ** (attempt - 1), 0.5))
        await view.state(fresh=True)
    return Timestamp.from_wire(out)


async def _ask(
    view: ClusterView, keyspace: str, node: str, points: list[tuple[int, int, int]]
) -> HistoryChecked:
    msg = CheckHistory(keyspace=keyspace, points=points)
    return await view.pool.request(view.address(node), msg, SEQNO_TIMEOUT, expect=HistoryChecked)

"""What a scan coordinator reads about the cluster: state, member addresses, high seqnos.

The coordinator runs on every node, manager or not. A manager node reads its own replica of
the coordinator state (replicated synchronously with every commit, so it is current) and
asks the master for a fresh one only when a name is missing (an index created a moment ago);
any other node asks the managers, caching the answer for ``STATE_TTL`` seconds.

``high_seqnos`` is what request_plus waits for (seed step 9, "poll all KV nodes"): every
partition's (seqno, uuid), asked of the owners directly, in parallel, one request per data
node (the partitions it owns per the keyspace's latest topology). This node's own data
service, if it runs one, is read in-process (``local_seqnos``: no loopback connection, no
encoding): it answers from the same in-memory partition metadata as its ``HighSeqnos``
handler, after the writes it acknowledged. A partition that moved meanwhile is asked again
after a fresh state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from shardex.core.timestamp import Timestamp
from shardex.data.messages import HighSeqnos, HighSeqnosReply
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.coordinator_messages import StateReply, StateRequest
from shardex.manager.member_list import MemberInfo
from shardex.manager.state import StateContext
from shardex.net import ConnectionPool

__all__ = ["ClusterView"]

STATE_TTL: Final = 1.0
STATE_TIMEOUT: Final = 5.0
SEQNO_TIMEOUT: Final = 10.0
SEQNO_ATTEMPTS: Final = 4
SECTIONS: Final = ["keyspaces", "data_topologies", "indexes", "index_topologies"]

# (keyspace, partitions) -> {partition: (high seqno, uuid)} of those this node serves.
LocalSeqnos = Callable[[str, list[int]], dict[int, tuple[int, int]]]


class ClusterView:
    def __init__(
        self,
        *,
        pool: ConnectionPool,
        coordinator: Callable[[], Any | None],
        members: Callable[[], list[MemberInfo]],
        name: str = "",
    ) -> None:
        self.pool = pool
        self.name = name
        self._coordinator = coordinator
        self._members = members
        self._cached: StateContext | None = None
        self._cached_at = 0.0
        # This node's data service (set by the node when it runs one): asked in-process.
        self.local_seqnos: LocalSeqnos | None = None
        # The owners of every partition of a data topology, grouped once per topology object
        # (the state replaces it on every change): (topology, {node: partitions}).
        self._owners: dict[str, tuple[Any, dict[str, list[int]]]] = {}

    async def state(self, *, fresh: bool = False) -> StateContext:
        coord = self._coordinator()
        if coord is not None:
            if not fresh:
                local: StateContext = coord.state
                return local
            reply = await coord.submit(StateRequest(sections=SECTIONS, fresh=True))
            assert isinstance(reply, StateReply)
            return reply.state
        loop = asyncio.get_running_loop()
        if not fresh and self._cached is not None and loop.time() - self._cached_at < STATE_TTL:
            return self._cached
        errors: dict[str, str] = {}
        managers = [m for m in self._members() if "manager" in m.services]
        for m in managers:
            try:
                answer = await self.pool.request(
                    m.address,
                    StateRequest(sections=SECTIONS, fresh=fresh),
                    STATE_TIMEOUT,
                    expect=StateReply,
                )
            except ShardexError as exc:
                errors[m.name] = str(exc)
                continue
            self._cached, self._cached_at = answer.state, loop.time()
            return answer.state
        raise NodeUnavailable(
            "no manager answered the state request",
            details={"managers": [m.name for m in managers], "errors": errors},
        )

    def address(self, node: str) -> str:
        for m in self._members():
            if m.name == node:
                return m.address
        raise NodeUnavailable(
            f"node {node!r} is not a cluster member",
            details={"node": node, "hint": "check `shardex cluster status`"},
        )

    async def high_seqnos(self, keyspace: str) -> Timestamp:
        """Every partition's current (high seqno, uuid), gathered from the owners."""
        got: dict[int, tuple[int, int]] = {}
        state = await self.state()
        last: ShardexError | None = None
        for attempt in range(SEQNO_ATTEMPTS):
            if attempt:
                state = await self.state(fresh=True)
            history = state.data_topologies.get(keyspace)
            if keyspace not in state.keyspaces or not history:
                raise ShardexError(
                    f"keyspace {keyspace!r} not found",
                    code=ErrorCode.KEYSPACE_NOT_FOUND,
                    details={"keyspace": keyspace},
                )
            owners = self._owners_of(keyspace, history[-1])
            by_node = {n: [p for p in ps if p not in got] for n, ps in owners.items()}
            by_node = {n: ps for n, ps in by_node.items() if ps}
            if not by_node:
                break

            async def ask(node: str, parts: list[int]) -> dict[int, tuple[int, int]]:
                msg = HighSeqnos(keyspace=keyspace, partitions=parts)
                reply = await self.pool.request(
                    self.address(node), msg, SEQNO_TIMEOUT, expect=HighSeqnosReply
                )
                return reply.entries

            local = self.local_seqnos if self.name in by_node else None
            remote = [(n, ps) for n, ps in by_node.items() if local is None or n != self.name]
            pending = asyncio.gather(*(ask(n, ps) for n, ps in remote), return_exceptions=True)
            if local is not None:  # read while the requests are out; no task, no encoding
                try:
                    got.update(local(keyspace, by_node[self.name]))
                except ShardexError as exc:
                    last = exc
                except BaseException:
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)
                    raise
            for res in await pending:
                if isinstance(res, ShardexError):
                    last = res
                elif isinstance(res, BaseException):
                    raise res
                else:
                    got.update(res)
            if all(p in got for ps in by_node.values() for p in ps):
                break
            if attempt + 1 < SEQNO_ATTEMPTS:
                await asyncio.sleep(0.05 * 2**attempt)  # a partition in hand-over
        else:
            missing = sorted(p for ps in by_node.values() for p in ps if p not in got)
            raise NodeUnavailable(
                f"no owner answered the high seqnos of partitions {missing[:20]} of {keyspace!r}",
                details={
                    "keyspace": keyspace,
                    "partitions": missing[:100],
                    "cause": str(last) if last else None,
                },
            )
        return Timestamp.from_wire(got)

    def _owners_of(self, keyspace: str, topo: Any) -> dict[str, list[int]]:
        """Data node -> the partitions it owns in ``topo`` (ascending), computed once per
        topology object."""
        cached = self._owners.get(keyspace)
        if cached is not None and cached[0] is topo:
            return cached[1]
        by_node: dict[str, list[int]] = {}
        for p, node in sorted(topo.assignment.items()):
            by_node.setdefault(node, []).append(p)
        self._owners[keyspace] = (topo, by_node)
        return by_node

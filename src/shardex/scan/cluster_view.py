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
after a fresh state. A request_plus scan gets most of them another way (its ``ScanSlices``
replies) and asks only the other owners, in a round shared by the scans that ask before it
starts (``shared_partial_high_seqnos``), then completes what is missing (``known=``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
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
# A shared high-seqno round waits at most this long for the round ahead of it to be
# answered (``shared_partial_high_seqnos``); a healthy round takes about a millisecond.
CHAIN_WAIT: Final = 0.1
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
        # (keyspace, nodes skipped) -> the shared high-seqno round not yet started, and the
        # one whose requests are out (the next one starts once it is answered).
        self._next_round: dict[tuple[str, frozenset[str]], _Round] = {}
        self._in_flight: dict[tuple[str, frozenset[str]], asyncio.Task[Any]] = {}

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

    async def data_owners(self, keyspace: str) -> dict[str, list[int]]:
        """Data node -> the partitions of ``keyspace`` it owns in the latest topology ({}:
        no such keyspace; ``high_seqnos`` says so)."""
        state = await self.state()
        history = state.data_topologies.get(keyspace)
        if keyspace not in state.keyspaces or not history:
            return {}
        return self._owners_of(keyspace, history[-1])

    def shared_partial_high_seqnos(
        self,
        keyspace: str,
        skip: Collection[str],
        owners: Mapping[str, list[int]] | None = None,
    ) -> asyncio.Future[dict[int, tuple[int, int]]]:
        """``partial_high_seqnos`` shared by the scans that ask before it starts.

        Seed step 9 wants seqnos read after the scan arrived. A round that has not started
        yet (its task runs on a later loop iteration) reads them after every scan that
        joined it arrived, so all of them may use its answer: concurrent request_plus scans
        arriving at a busy coordinator send one ``HighSeqnos`` per data node, not one each.
        A round starts once the round ahead of it (same keyspace and skipped nodes) is
        answered, or after ``CHAIN_WAIT``; scans keep joining it meanwhile (group commit).
        A round already started is never joined. The answer is shared: do not modify it.
        Cancelling the returned future leaves the round to its other scans.

        ``owners`` (``data_owners(keyspace)``, when the caller has it): if no owner outside
        ``skip`` but this node's own data service is left, that is read now, in-process -
        no round, no task (every other owner answers in the scan's ``ScanSlices``)."""
        if owners is not None and self._only_local(owners, skip):
            done: asyncio.Future[dict[int, tuple[int, int]]]
            done = asyncio.get_running_loop().create_future()
            done.set_result(self._read_local(keyspace, owners.get(self.name)))
            return done
        key = (keyspace, frozenset(skip))
        pending = self._next_round.get(key)
        if pending is None:
            pending = self._next_round[key] = _Round()
            ahead = self._in_flight.get(key)

            async def run(r: _Round = pending) -> dict[int, tuple[int, int]]:
                if ahead is not None and not ahead.done():
                    # Group commit: while the round ahead is out, scans keep joining this
                    # one, so concurrent scans send one HighSeqnos per data node per round
                    # trip instead of one per loop iteration. Bounded: a hung owner must
                    # not hold every later scan for its whole request timeout.
                    await asyncio.wait((ahead,), timeout=CHAIN_WAIT)
                if self._next_round.get(key) is r:  # from now on, later scans start another
                    del self._next_round[key]
                assert r.task is not None
                self._in_flight[key] = r.task
                try:
                    return await self.partial_high_seqnos(keyspace, skip)
                finally:
                    if self._in_flight.get(key) is r.task:
                        del self._in_flight[key]

            pending.task = asyncio.ensure_future(run())
            pending.task.add_done_callback(_retrieve)
        assert pending.task is not None
        return asyncio.shield(pending.task)

    def _only_local(self, owners: Mapping[str, list[int]], skip: Collection[str]) -> bool:
        if self.name in owners and self.local_seqnos is None:
            return False
        return all(n in skip or n == self.name for n in owners)

    def _read_local(self, keyspace: str, parts: list[int] | None) -> dict[int, tuple[int, int]]:
        """This node's own data partitions ``parts`` read in-process ({}: none, or the read
        failed: ``high_seqnos(known=...)`` then asks for them)."""
        if not parts or self.local_seqnos is None:
            return {}
        try:
            return self.local_seqnos(keyspace, parts)
        except ShardexError:
            return {}

    async def partial_high_seqnos(
        self, keyspace: str, skip: Collection[str]
    ) -> dict[int, tuple[int, int]]:
        """One round of ``high_seqnos`` over the owners not in ``skip`` (their seqnos come
        another way: a request_plus scan's ``ScanSlices``): what answered. Nothing is
        retried or raised here; ``high_seqnos(known=...)`` completes the rest."""
        got: dict[int, tuple[int, int]] = {}
        owners = await self.data_owners(keyspace)
        by_node = {n: ps for n, ps in owners.items() if n not in skip}
        if by_node:
            await self._ask_round(keyspace, by_node, got)
        return got

    async def high_seqnos(
        self, keyspace: str, *, known: Mapping[int, tuple[int, int]] | None = None
    ) -> Timestamp:
        """Every partition's current (high seqno, uuid), gathered from the owners; those in
        ``known`` (read after the scan arrived, elsewhere) are not asked again."""
        return Timestamp.from_wire(await self.high_seqnos_wire(keyspace, known=known))

    async def high_seqnos_wire(
        self, keyspace: str, *, known: Mapping[int, tuple[int, int]] | None = None
    ) -> dict[int, tuple[int, int]]:
        """``high_seqnos`` as its wire dict, in partition order, not checked into a
        ``Timestamp`` (a request_plus scan compares it with its snapshot's first)."""
        got: dict[int, tuple[int, int]] = dict(known) if known else {}
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
            if got.keys() >= history[-1].assignment.keys():
                break  # the common case: every partition came with the scan (C-level check)
            owners = self._owners_of(keyspace, history[-1])
            by_node = {n: [p for p in ps if p not in got] for n, ps in owners.items()}
            by_node = {n: ps for n, ps in by_node.items() if ps}
            if not by_node:
                break
            last = await self._ask_round(keyspace, by_node, got) or last
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
        # In partition order: the answers arrive node by node, and a Timestamp sorts an
        # unordered dict by its (partition, entry) items; sorting the ints is cheaper.
        return {p: got[p] for p in sorted(got)}

    async def _ask_round(
        self, keyspace: str, by_node: dict[str, list[int]], got: dict[int, tuple[int, int]]
    ) -> ShardexError | None:
        """Ask every node of ``by_node`` for its partitions in parallel (this node's own in
        process) into ``got``; the last error of a node that failed (its partitions stay
        missing)."""
        last: ShardexError | None = None

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
        return last

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


class _Round:
    """A shared high-seqno round: its task, removed from ``_next_round`` when it starts."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: asyncio.Task[dict[int, tuple[int, int]]] | None = None


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared round's failure as seen: every scan that joined it may have gone."""
    if not task.cancelled():
        task.exception()

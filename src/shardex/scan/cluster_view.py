"""What a scan coordinator reads about the cluster: state, member addresses, high seqnos.

The coordinator runs on every node, manager or not. A manager node reads its own replica of
the coordinator state (replicated synchronously with every commit, so it is current) and
asks the master for a fresh one only when a name is missing (an index created a moment ago);
any other node asks the managers, caching the answer for ``STATE_TTL`` seconds.

``high_seqnos`` is what request_plus waits for (scan-request flow step 9, "poll all KV nodes"):
every partition's (seqno, uuid), asked of the owners directly, in parallel, one request per data
node (the partitions it owns per the keyspace's latest topology). This node's own data service, if
it runs one, is read in-process (``local_seqnos``: no loopback connection, no encoding): it answers
from the same in-memory partition metadata as its ``HighSeqnos`` handler, after the writes it
acknowledged. A partition that moved meanwhile is asked again after a fresh state. A request_plus
scan gets most of them another way (its ``ScanSlices`` replies) and asks only the other owners
(``shared_partial_high_seqnos``: a round sent at once, without a task, or shared by the scans that
ask while one is out), then completes what is missing (``known=``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.data import HighSeqnos, HighSeqnosReply
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.meta.member_list import MemberInfo
from shardex.meta.state import StateContext
from shardex.net import ConnectionPool

__all__ = ["ClusterView"]

STATE_TTL: Final = 1.0
STATE_TIMEOUT: Final = 5.0
SEQNO_TIMEOUT: Final = 10.0
SEQNO_ATTEMPTS: Final = 4
# How long a request_plus read waits for a dead owner's partitions to be failed over to a
# replica (auto-failover: failure detection + its timeout, 3 + 5 s by default).
SEQNO_FAILOVER_WAIT: Final = 15.0
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
        self._in_flight: dict[tuple[str, frozenset[str]], asyncio.Future[Any]] = {}

    def state_now(self) -> StateContext | None:
        """``state()`` when it needs no request: this manager's replica of the state, or
        the copy fetched less than ``STATE_TTL`` ago; None otherwise."""
        coord = self._coordinator()
        if coord is not None:
            local: StateContext = coord.state
            return local
        now = asyncio.get_running_loop().time()
        if self._cached is not None and now - self._cached_at < STATE_TTL:
            return self._cached
        return None

    async def state(self, *, fresh: bool = False) -> StateContext:
        if not fresh:
            known = self.state_now()
            if known is not None:
                return known
        coord = self._coordinator()
        if coord is not None:
            reply = await coord.submit(StateRequest(sections=SECTIONS, fresh=True))
            assert isinstance(reply, StateReply)
            return reply.state
        loop = asyncio.get_running_loop()
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
        owners: Mapping[str, list[int]],
    ) -> asyncio.Future[dict[int, tuple[int, int]]]:
        """The high seqnos of ``owners``' partitions (``data_owners(keyspace)``) but those of
        the nodes in ``skip`` (their seqnos come another way: a request_plus scan's
        ``ScanSlices``): what answered. Nothing is retried or raised here;
        ``high_seqnos(known=...)`` completes the rest. The answer may be shared: do not
        modify it. Cancelling the returned future leaves a shared round to its other scans.

        Scan-request flow step 9 wants seqnos read after the scan arrived. With no round of this
        (keyspace, skip) out, one starts now: its requests leave before this returns (no task:
        ``Connection.request_future``) and this node's own partitions are read in-process
        meanwhile; no other scan can join it. While one is out, the scans asking share the
        next round, which starts once the one ahead is answered, or after ``CHAIN_WAIT``: it
        reads the seqnos after every scan that joined it arrived (group commit), so
        concurrent scans send one ``HighSeqnos`` per data node per round trip.

        If no owner outside ``skip`` but this node's own data service is left, that is read
        now, in-process - no round (every other owner answers in the scan's ``ScanSlices``)."""
        loop = asyncio.get_running_loop()
        if self._only_local(owners, skip):
            done: asyncio.Future[dict[int, tuple[int, int]]] = loop.create_future()
            done.set_result(self._read_local(keyspace, owners.get(self.name)))
            return done
        key = (keyspace, frozenset(skip))
        pending = self._next_round.get(key)
        if pending is None:
            by_node = {n: ps for n, ps in owners.items() if n not in skip}
            ahead = self._in_flight.get(key)
            if ahead is None:  # a lone scan: its own round, at once
                own: asyncio.Future[dict[int, tuple[int, int]]] = loop.create_future()
                self._start_round(key, keyspace, by_node, own)
                return own
            pending = self._next_round[key] = _Round(loop.create_future())
            start = functools.partial(self._start_pending, key, keyspace, by_node, pending)
            # Bounded: a hung owner must not hold every later scan for its whole timeout.
            pending.timer = loop.call_later(CHAIN_WAIT, start)
            ahead.add_done_callback(lambda _: start())
        return asyncio.shield(pending.fut)

    def shared_high_seqnos_now(
        self, keyspace: str
    ) -> asyncio.Future[dict[int, tuple[int, int]]] | None:
        """The round of ``shared_high_seqnos_wire`` joined or started in the call (no task,
        no coroutine: its requests leave before this returns) when the state is at hand;
        None when it is not (``shared_high_seqnos_wire`` then). Its answer may be partial:
        complete it with ``high_seqnos_wire(known=...)``."""
        state = self.state_now()
        history = None if state is None else state.data_topologies.get(keyspace)
        if state is None or keyspace not in state.keyspaces or not history:
            return None
        owners = self._owners_of(keyspace, history[-1])
        return self.shared_partial_high_seqnos(keyspace, (), owners)

    async def shared_high_seqnos(self, keyspace: str) -> Timestamp:
        """``high_seqnos`` of every partition read after this call, through a round shared
        with concurrent callers (``shared_partial_high_seqnos``), completed if need be: what
        a request_plus scan or query waits for before any slice is read."""
        return Timestamp.from_wire(await self.shared_high_seqnos_wire(keyspace))

    async def shared_high_seqnos_wire(self, keyspace: str) -> Mapping[int, tuple[int, int]]:
        """``shared_high_seqnos`` as its wire dict, not checked into a ``Timestamp``
        (``high_seqnos_wire``); it may be shared: do not modify it."""
        owners = await self.data_owners(keyspace)
        shared = await self.shared_partial_high_seqnos(keyspace, (), owners)
        return await self.high_seqnos_wire(keyspace, known=shared)

    def _start_pending(
        self,
        key: tuple[str, frozenset[str]],
        keyspace: str,
        by_node: dict[str, list[int]],
        r: _Round,
    ) -> None:
        """Start the shared round ``r`` (once: the round ahead answered, or ``CHAIN_WAIT``
        passed); from now on, scans asking start or join another."""
        if r.started:
            return
        r.started = True
        if r.timer is not None:
            r.timer.cancel()
        if self._next_round.get(key) is r:
            del self._next_round[key]
        self._start_round(key, keyspace, by_node, r.fut)

    def _start_round(
        self,
        key: tuple[str, frozenset[str]],
        keyspace: str,
        by_node: dict[str, list[int]],
        out: asyncio.Future[dict[int, tuple[int, int]]],
    ) -> None:
        """Send one ``HighSeqnos`` to every node of ``by_node`` but this one, read this
        node's partitions in-process meanwhile, and set ``out`` to what answered once every
        request ended (a failed one just leaves its partitions out)."""
        self._in_flight[key] = out
        out.add_done_callback(functools.partial(self._round_ended, key))
        got: dict[int, tuple[int, int]] = {}
        local = self.local_seqnos is not None and self.name in by_node
        asks = [
            self._ask(node, keyspace, parts)
            for node, parts in by_node.items()
            if not (local and node == self.name)
        ]
        if local:  # while the requests are out; no task, no encoding
            got.update(self._read_local(keyspace, by_node[self.name]))
        left = len(asks)
        if not left:
            out.set_result(got)
            return

        def answered(f: asyncio.Future[Any]) -> None:
            nonlocal left
            left -= 1
            if not f.cancelled() and f.exception() is None:
                reply = f.result()
                if isinstance(reply, HighSeqnosReply):
                    got.update(reply.entries)
            if not left and not out.done():
                out.set_result(got)

        for f in asks:
            f.add_done_callback(answered)

    def _round_ended(self, key: tuple[str, frozenset[str]], out: asyncio.Future[Any]) -> None:
        if self._in_flight.get(key) is out:
            del self._in_flight[key]

    def _ask(self, node: str, keyspace: str, parts: list[int]) -> asyncio.Future[Any]:
        """``HighSeqnos`` for ``parts`` to ``node``, sent now on a live pooled connection
        (else connecting in a task); its failure is the future's exception."""
        msg = HighSeqnos(keyspace=keyspace, partitions=parts)
        try:
            address = self.address(node)
            conn = self.pool.connections.get(address)
            if conn is not None:
                return conn.request_future(msg, SEQNO_TIMEOUT)
        except ShardexError as exc:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        return asyncio.ensure_future(self.pool.request(address, msg, SEQNO_TIMEOUT))

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

    async def high_seqnos(
        self, keyspace: str, *, known: Mapping[int, tuple[int, int]] | None = None
    ) -> Timestamp:
        """Every partition's current (high seqno, uuid), gathered from the owners; those in
        ``known`` (read after the scan arrived, elsewhere) are not asked again."""
        return Timestamp.from_wire(await self.high_seqnos_wire(keyspace, known=known))

    async def high_seqnos_wire(
        self, keyspace: str, *, known: Mapping[int, tuple[int, int]] | None = None
    ) -> Mapping[int, tuple[int, int]]:
        """``high_seqnos`` as its wire dict, in no particular order, not checked into a
        ``Timestamp`` (a request_plus scan compares it with its snapshot's first). ``known``
        itself when it names every partition (not copied: do not modify the answer)."""
        got: Mapping[int, tuple[int, int]] = known if known is not None else {}
        state = await self.state()
        last: ShardexError | None = None
        loop = asyncio.get_running_loop()
        deadline: float | None = None  # set once we know whether a failover can help
        attempt = 0
        missing: list[int] = []
        while True:
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
            if got is known:
                got = dict(got)  # ``known`` may be shared: asked partitions go into a copy
            assert isinstance(got, dict)
            last = await self._ask_round(keyspace, by_node, got) or last
            missing = sorted(p for ps in by_node.values() for p in ps if p not in got)
            if not missing:
                break
            if deadline is None:
                # With replicas, a dead owner's partitions get a new active by failover:
                # wait for it (bounded; the scan's own timeout may end it sooner). Without,
                # nothing will change soon: a few quick retries for a hand-over in flight.
                meta = state.keyspaces.get(keyspace)
                replicated = meta is not None and meta.num_replicas > 0
                deadline = loop.time() + (SEQNO_FAILOVER_WAIT if replicated else 0.0)
            attempt += 1
            if attempt >= SEQNO_ATTEMPTS and loop.time() >= deadline:
                break  # ``missing`` is raised below
            await asyncio.sleep(min(0.05 * 2 ** (attempt - 1), 0.5))
        if missing:
            raise NodeUnavailable(
                f"no owner answered the high seqnos of partitions {missing[:20]} of {keyspace!r}",
                details={
                    "keyspace": keyspace,
                    "partitions": missing[:100],
                    "cause": str(last) if last else None,
                },
            )
        return got

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
    """A shared high-seqno round not started yet: the answer its scans wait for."""

    __slots__ = ("fut", "started", "timer")

    def __init__(self, fut: asyncio.Future[dict[int, tuple[int, int]]]) -> None:
        self.fut = fut
        self.started = False
        self.timer: asyncio.TimerHandle | None = None

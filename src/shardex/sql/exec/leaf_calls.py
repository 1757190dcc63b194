"""Leaf calls: the leaves of a statement with a small result asked by request and reply.

The execution protocol is built for results of any size: each leaf's node gets a
``QueryExecute``, sets up an execution with its outbox, builds Arrow batches and streams them
under credit to the initiator's inbox, which grants credit back; the initiator runs a root
fragment as a task of its own over those streams. A covering query returning 100 rows, or an
ORDER BY ... LIMIT 20 whose leaves send 20 rows each, pays all of that per leaf for a
few kilobytes: on a 3-node cluster most of such a statement's node CPU was that bookkeeping,
not its rows.

Here each leaf on another node gets one ``LeafRequest`` (the leaf fragment's very arguments)
and answers its encoded rows in the reply (``LeafRows``); a leaf on this node runs
in-process (``PhysicalPlan.leaf_spec``). Every leaf runs at once; when all have answered the
root runs here over their rows as ``local_leaf`` runs it over one leaf's
(``root_of_leaves``), so results and errors are the protocol's. No row is handed on before
every leaf answered, so:

* a leaf whose rows come to more than ``CALL_MAX_BYTES`` encoded stops there and answers
  ``complete=False``; the statement then runs through the protocol at the same TS (the
  rows read so far are dropped), and its text is not sent by calls again for
  ``LARGE_BACKOFF`` seconds (a statement that has many rows once usually has them again).
  The work wasted is bounded by what a leaf reads to produce ``CALL_MAX_BYTES``;
* a lost leaf node fails the call with the node named (``indexer``), and
  ``failover.failing_over`` runs the statement again on other copies, as for a stream.

Which statements: the index plans (not a DML's derived SELECT) whose leaves send their rows
as they make them or are cut short: a known ``offset + limit`` of at most
``CALL_MAX_ROWS`` (a LIMIT), or rows mode without DISTINCT (a leaf that outgrows the
bound learns it early). A GROUP BY, a window, a sort without LIMIT read everything before
their first row: a large one would be read twice, so they keep the protocol. Tuning switch
``leaf_calls``.

On the leaf's node a call is admitted as an execution of another node's query is
(``QueryService.leaf_call``: QUERY_OVERLOADED past ``sql_max_fragments``), runs within the
statement's memory quota (``run_leaf``) and for at most the statement's timeout. A call the
initiator gives up on (its client gone, another leaf's error, another leaf's rows too large)
is stopped there: the initiator sends ``LeafCancel`` to each node whose call had not
answered, on the request's connection, and the node cancels the leaf's task (a cancel that
overtakes its request refuses that request when it comes).

At the initiator the replies' rows are held until the root has read them: they are charged
to the statement's memory account on this node from their arrival (operator ``leaf_rows``),
the account the root draws on too. Replies past the statement's quota are dropped and the
statement streams through the protocol, as for a reply too large.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from shardex.api.query_ids import QueryId
from shardex.api.scan import WireTs
from shardex.api.sql_exec import LeafCancel, LeafRequest, LeafRows
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.net import Connection, ConnectionPool
from shardex.scan.cluster_view import ClusterView
from shardex.scan.coordinator import ScanCoordinator
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.failover import FAILOVER
from shardex.sql.exec.fragments import leaf_pipeline, run_leaf
from shardex.sql.exec.local_leaf import LocalRun, root_of_leaves
from shardex.sql.exec.memory import NodeMemory, Reservation, value_size
from shardex.sql.exec.plan import PhysicalPlan
from shardex.sql.exec.rows import cell_chunks
from shardex.sql.protocol import QueryService

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = [
    "CALL_MAX_BYTES",
    "CALL_MAX_ROWS",
    "LARGE_BACKOFF",
    "LeafCalls",
    "SeqnoRide",
    "answer_leaf",
]

CALL_MAX_BYTES: Final = 256 * 1024  # a leaf's encoded rows in one reply, at most
CALL_MAX_ROWS: Final = 1024  # a LIMIT (offset + limit) small enough to call the leaves
LARGE_BACKOFF: Final = 10.0  # seconds a text that outgrew a reply keeps the protocol
TEXTS_MAX: Final = 1024  # texts remembered as large
REPLY_SLACK: Final = 1.0  # seconds the caller waits past the leaf's own timeout
CANCELLED_MAX: Final = 1024  # cancelled query ids a leaf node remembers (a late request)

Stream = Callable[[], Awaitable[AsyncIterator[list[bytes]]]]


class _Large(Exception):
    """A leaf's rows came to more than the bound, or the replies to more than the
    statement's memory quota here: the statement streams instead."""


async def answer_leaf(
    index_scan: IndexScanServer | None,
    documents: DocumentAccess,
    memory: NodeMemory,
    msg: LeafRequest,
    member: str,
) -> LeafRows:
    """A ``LeafRequest`` answered on the leaf's node (``member``): the leaf's rows, or
    ``complete=False`` as soon as they pass ``msg.max_bytes``."""
    if index_scan is None:
        raise ShardexError(
            f"member {member} runs no index service but got a leaf call",
            code=ErrorCode.QUERY_STATE,
            details={"member": member},
        )
    seqnos = index_scan.high_seqnos_here(msg.seqnos_keyspace, msg.seqnos_of)  # on arrival
    chunks = leaf_pipeline(
        index_scan, documents, memory, msg.args, msg.params, str(msg.query_id), cell_chunks
    )
    try:
        async with asyncio.timeout(msg.timeout):
            reply = await _collected(chunks, msg.max_bytes)
            reply.high_seqnos = seqnos
            return reply
    except TimeoutError:
        raise ShardexError(
            f"query {msg.query_id} timed out after {msg.timeout}s",
            code=ErrorCode.QUERY_CANCELLED,
            details={"reason": "timeout", "timeout": msg.timeout, "query_id": str(msg.query_id)},
        ) from None


async def _collected(chunks: AsyncIterator[list[bytes]], max_bytes: int) -> LeafRows:
    rows: list[bytes] = []
    size = 0
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            rows += chunk
            size += sum(map(len, chunk))
            if size > max_bytes:
                return LeafRows(rows=[], complete=False)
    return LeafRows(rows=rows, complete=True)


class LeafCalls:
    """The initiator's side: which statements call their leaves, and the calls."""

    def __init__(
        self,
        query: QueryService,
        pool: ConnectionPool,
        scan: ScanCoordinator,
        documents: DocumentAccess,
        memory: NodeMemory,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.query = query
        self.pool = pool
        self.scan = scan  # its view, and this node's index service (when it runs one)
        self.view = scan.view
        self.documents = documents
        self.memory = memory
        self._clock = clock
        self._large: OrderedDict[str, float] = OrderedDict()  # text -> streamed until
        # The leaf's node: calls running here by query, and queries whose calls were
        # cancelled (a request that comes after its cancel is refused).
        self._running: dict[QueryId, set[asyncio.Task[Any]]] = {}
        self._cancelled: OrderedDict[QueryId, None] = OrderedDict()
        self.calls_cancelled = 0  # calls stopped here by their initiator's LeafCancel
        # The initiator: LeafCancel sends under way (held: a task nobody refers to may go).
        self._sends: set[asyncio.Task[None]] = set()

    async def on_leaf_request(self, msg: LeafRequest, conn: Connection) -> LeafRows:
        """One leaf of another node's statement, its rows in the reply; stopped by a
        ``LeafCancel`` of its query."""
        q = msg.query_id
        if q in self._cancelled:
            raise _abandoned(q)
        task = asyncio.current_task()
        assert task is not None
        running = self._running.setdefault(q, set())
        running.add(task)
        try:
            with self.query.leaf_call(q):
                local, member = self.scan.local_index, self.query.member_id
                return await answer_leaf(local, self.documents, self.memory, msg, member)
        finally:
            running.discard(task)
            if not running:
                self._running.pop(q, None)

    async def on_leaf_cancel(self, msg: LeafCancel, conn: Connection) -> None:
        """The initiator gave up on its call of ``msg.query_id``: stop the leaf's work (its
        reply is not awaited; the cancelled task sends none)."""
        q = msg.query_id
        self._cancelled[q] = None
        self._cancelled.move_to_end(q)
        if len(self._cancelled) > CANCELLED_MAX:
            self._cancelled.popitem(last=False)
        for task in self._running.get(q, ()):
            task.cancel()
            self.calls_cancelled += 1

    def wanted(self, plan: PhysicalPlan, sql: str, dml: bool) -> bool:
        """Whether ``plan`` calls its leaves (see the module's docstring)."""
        if not plan.tuning["leaf_calls"] or dml or plan.source != "index" or not plan.leaves:
            return False
        top = plan.top
        if top is not None and top <= CALL_MAX_ROWS:
            return True
        if plan.mode != "rows" or plan.bound.distinct:
            return False
        until = self._large.get(sql)
        if until is None:
            return True
        if self._clock() < until:
            return False
        del self._large[sql]
        return True

    def _outgrew(self, sql: str) -> None:
        self._large[sql] = self._clock() + LARGE_BACKOFF
        self._large.move_to_end(sql)
        if len(self._large) > TEXTS_MAX:
            self._large.popitem(last=False)

    async def rows(
        self,
        index_scan: IndexScanServer | None,
        local: LocalRun,
        q: QueryId,
        ts: Timestamp | None,
        params: Any,
        timeout: float,
        stream: Stream,
        ride: SeqnoRide | None = None,
    ) -> AsyncIterator[list[bytes]]:
        """The result rows of ``local.plan`` (query ``q``) at ``ts``, its leaves called;
        ``stream()``: the statement through the protocol, when a leaf's rows outgrow a
        reply. ``ride``: the high seqnos to gather with the calls (``SeqnoRide``)."""
        replies = None
        # The statement's account here: the replies are charged from their arrival until
        # the root (which draws on the same account) has read them.
        with self.memory.fragment(str(q), local.budget, local.spill) as mem:
            held = mem.budget().reserve("leaf_rows", fixed=True)
            try:
                replies = await self._leaves(index_scan, local, q, ts, params, timeout, ride, held)
            except _Large:
                held.release()
            finally:
                if ride is not None:
                    ride.answered({})  # not answered by the calls: the round asks every owner
            if replies is not None:
                sources = [_once(rows) for rows in replies]
                out = root_of_leaves(self.documents, self.memory, local, sources, params, str(q))
                async with contextlib.aclosing(out):
                    async for chunk in out:
                        yield chunk
                return
        # A leaf's rows outgrew a reply (or the replies the quota): through the protocol.
        self._outgrew(local.sql)
        chunks = await stream()
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk

    async def _leaves(
        self,
        index_scan: IndexScanServer | None,
        local: LocalRun,
        q: QueryId,
        ts: Timestamp | None,
        params: Any,
        timeout: float,
        ride: SeqnoRide | None,
        held: Reservation,
    ) -> list[list[bytes]]:
        """Every leaf's rows, in the plan's order, charged to ``held`` as they arrive;
        ``_Large`` when one outgrew the bound or they outgrow the quota. ``ride`` is
        answered the high seqnos gathered when every leaf answered. The calls still out
        when it ends otherwise are cancelled on their nodes (``LeafCancel``)."""
        plan = local.plan
        here = self.query.member_id
        remote = [leaf for leaf in plan.leaves if leaf.member != here]
        qplan = None
        if remote:
            qplan = plan.query_plan(local.sql, local.dml, here, ts, local.budget, spill=local.spill)
        # The leaf nodes read their own data partitions' high seqnos on arrival; the round
        # asks the other owners meanwhile (this node's own in-process).
        of: dict[str, list[int]] = {}
        others = None
        if ride is not None:
            owners = await self.view.data_owners(ride.keyspace)
            nodes = {leaf.node for leaf in remote}
            of = {n: ps for n, ps in owners.items() if n in nodes}
            others = self.view.shared_partial_high_seqnos(ride.keyspace, of.keys(), owners)
        calls: list[Awaitable[tuple[list[bytes], WireTs | None]]] = []
        remote_nodes: list[str | None] = []  # per call: the node it asks (None: here)
        for i, leaf in enumerate(plan.leaves, start=1):
            if leaf.member == here and index_scan is not None:
                spec = plan.leaf_spec(leaf, local.dml, ts, local.budget, local.spill)
                chunks = run_leaf(
                    index_scan, self.documents, self.memory, spec, params, str(q), cell_chunks
                )
                calls.append(_charged(held, _rows_within(_collected(chunks, CALL_MAX_BYTES))))
                remote_nodes.append(None)
                continue
            assert qplan is not None
            args = qplan.fragments[i].args
            seqnos = (ride.keyspace, of.get(leaf.node, [])) if ride is not None else ("", [])
            call = self._call(leaf.member, leaf.node, q, args, params, timeout, seqnos)
            calls.append(_charged(held, call))
            remote_nodes.append(leaf.node)
        tasks = [asyncio.ensure_future(c) for c in calls]
        try:
            replies = await asyncio.gather(*tasks)
        except BaseException:
            if others is not None:
                others.cancel()  # a shared round goes on for its other statements
            raise
        finally:
            for t, node in zip(tasks, remote_nodes, strict=True):
                if not t.done() and node is not None:
                    self._cancel_call(node, q)
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if ride is not None and others is not None:
            known = dict(await others)
            for _, high in replies:
                if high:
                    known.update(high)
            ride.answered(known)
        return [rows for rows, _ in replies]

    async def _call(
        self,
        member: str,
        node: str,
        q: QueryId,
        args: dict[str, Any],
        params: Any,
        timeout: float,
        seqnos: tuple[str, list[int]] = ("", []),
    ) -> tuple[list[bytes], WireTs | None]:
        """One leaf on another node: its rows, and the high seqnos of ``seqnos`` (keyspace,
        partitions) it read on arrival. A node known down or lost fails naming it
        (``indexer``), so the statement fails over as a lost stream does."""
        if self.query.directory.is_down(member):
            raise NodeUnavailable(
                f"participant {member} is down; the query was not started",
                details={"value": member, "hint": "plan over live members"},
            )
        msg = LeafRequest(
            query_id=q,
            args=args,
            params=params,
            timeout=timeout,
            max_bytes=CALL_MAX_BYTES,
            seqnos_keyspace=seqnos[0] if seqnos[1] else "",
            seqnos_of=seqnos[1],
        )
        try:
            address = self.view.address(node)
            reply = await self.pool.request(address, msg, timeout + REPLY_SLACK, expect=LeafRows)
        except ShardexError as exc:
            if exc.code not in FAILOVER:
                raise
            details = {k: v for k, v in exc.details.items() if k != "value"}
            raise ShardexError(
                f"leaf on {node}: {exc.message}",
                code=exc.code,
                details={**details, "indexer": node, "member": member},
            ) from exc
        if not reply.complete:
            raise _Large
        return reply.rows, reply.high_seqnos

    def _cancel_call(self, node: str, q: QueryId) -> None:
        """Tell ``node`` to stop its leaf of ``q`` (one-way, in a task: the caller may be
        unwinding a cancel; a node gone or unreachable needs no telling)."""

        async def send() -> None:
            with contextlib.suppress(ShardexError):
                await self.pool.send(self.view.address(node), LeafCancel(query_id=q))

        task = asyncio.get_running_loop().create_task(send(), name=f"leaf cancel {q} {node}")
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)


def _abandoned(q: QueryId) -> ShardexError:
    return ShardexError(
        f"query {q} gave up its leaf call before it arrived",
        code=ErrorCode.QUERY_CANCELLED,
        details={"reason": "closed", "query_id": str(q)},
    )


async def _charged(
    held: Reservation, call: Awaitable[tuple[list[bytes], WireTs | None]]
) -> tuple[list[bytes], WireTs | None]:
    """A call's reply, its rows charged to ``held`` (the statement's account here) as it
    arrives; ``_Large`` past the quota (the statement streams, spilling as it needs)."""
    rows, high = await call
    if not held.grow(value_size(rows)):
        raise _Large
    return rows, high


async def _rows_within(collected: Awaitable[LeafRows]) -> tuple[list[bytes], None]:
    reply = await collected
    if not reply.complete:
        raise _Large
    return reply.rows, None


class SeqnoRide:
    """A request_plus statement run at a guessed TS (``pin_guess``) by leaf calls: the
    keyspace's high seqnos, read after the statement arrived, gathered with the calls. Each
    leaf node reads those of the data partitions it owns when its call arrives and answers
    them with its rows; the node's shared round asks only the other owners (and reads this
    node's in-process); ``wait_for`` completes the rest as ``high_seqnos(known=...)``. So the
    leaf nodes get no ``HighSeqnos`` of their own. If the calls end otherwise (an error, rows
    too large), nothing is known and ``wait_for`` asks every owner, as the plain round."""

    def __init__(self, view: ClusterView, keyspace: str) -> None:
        self.view = view
        self.keyspace = keyspace
        self._known: asyncio.Future[WireTs] = asyncio.get_running_loop().create_future()

    def answered(self, known: WireTs) -> None:
        """The seqnos gathered (once; later calls are ignored)."""
        if not self._known.done():
            self._known.set_result(known)

    async def wait_for(self) -> Timestamp:
        """Every partition's high seqno, read after the statement arrived."""
        return await self.view.high_seqnos(self.keyspace, known=await self._known)


async def _once(rows: list[bytes]) -> AsyncIterator[list[bytes]]:
    if rows:
        yield rows

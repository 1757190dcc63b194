"""``QueryService``: the SQL execution protocol on one member (participant and initiator).

Dispatch table (``routes``): ``QueryExecute``, ``QueryBatch``, ``QueryFlowControl``,
``QueryCancel`` (one-way) and ``QueryCheck`` (request -> ``QueryCheckResponse``).

Life of a query (the protocol's specification, sections 3-4):
* ``execute()`` on the initiator registers the query (before anything is sent, so a check
  naming it always finds it), starts its local fragments, sends ``QueryExecute`` to every
  other participant at once and returns a ``QueryResult``; a timer enforces the timeout.
* Cancel: a member that must cancel (its fragment failed, a link broke, a participant it
  works with left) frees its state and sends one ``QueryCancel`` to the initiator; the
  initiator broadcasts once to every participant but itself and the cancel initiator. Each
  member sends at most one cancel per query, so a query costs at most 2N cancel messages.
* Cleanup: tombstones drop late messages; every ``check_interval`` a member asks each
  initiator about the queries it holds state for and frees those the initiator no longer
  runs; a member whose initiator the failure detector holds down frees that state and
  still sends its one cancel there (a wrong suspicion must not leave the initiator
  waiting for its timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from shardex.api.query_ids import QueryId, QueryIdFactory
from shardex.api.sql_protocol import (
    QueryBatch,
    QueryCancel,
    QueryCheck,
    QueryCheckResponse,
    QueryExecute,
    QueryFlowControl,
    QueryPlan,
)
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.connection import Handler
from shardex.net.messages import Message
from shardex.net.transport import Transport
from shardex.runtime.admission import overloaded
from shardex.sql.protocol.config import BeforeSend, MemberDirectory, ProtocolConfig
from shardex.sql.protocol.execution import QueryExecution
from shardex.sql.protocol.flow import ExchangeMeter
from shardex.sql.protocol.fragments import FragmentRegistry
from shardex.sql.protocol.initiator import Initiator, cancelled, wire_details
from shardex.sql.protocol.plan_layout import PlanLayout, layout_plan
from shardex.sql.protocol.registry import QueryRegistry
from shardex.sql.protocol.results import QueryResult, ResultChannel

__all__ = ["QueryService"]

log = logging.getLogger(__name__)


class QueryService:
    """The protocol on one member: the dispatch of its messages, the participant's part
    (executions, held batches, cancels through the initiator), its links and the periodic
    check; the initiator's part is ``self.initiator``."""

    def __init__(
        self,
        *,
        member_id: str,
        transport: Transport,
        secret: str,
        directory: MemberDirectory,
        fragments: FragmentRegistry,
        config: ProtocolConfig | None = None,
        meter: ExchangeMeter | None = None,
        name: str | None = None,
        before_send: BeforeSend | None = None,
        id_factory: Callable[[], QueryId] | None = None,
    ) -> None:
        self.member_id = member_id
        self.name = name or member_id
        self.config = config or ProtocolConfig()
        self.directory = directory
        self.fragments = fragments
        self.meter = meter if meter is not None else ExchangeMeter()
        self.before_send = before_send
        self._new_id = id_factory or QueryIdFactory(member_id, transport.nonce)
        self._pool = ConnectionPool(
            transport,
            secret,
            name=self.name,
            connect_timeout=self.config.connect_timeout,
            handlers=self.routes,
        )
        self.registry = QueryRegistry(
            member_id=member_id,
            clock=lambda: asyncio.get_running_loop().time(),
            tombstone_ttl=self.config.tombstone_ttl,
            max_pending_bytes=self.config.max_pending_bytes,
            max_pending_queries=self.config.max_pending_queries,
        )
        self.sent: Counter[str] = Counter()  # messages handed to the network, by class name
        self._watched: dict[Connection, str] = {}  # live connections -> peer member
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self._stopping = False
        self.calls = 0  # leaves run here by request and reply for other members' queries
        self.initiator = Initiator(
            member_id=member_id,
            config=self.config,
            directory=directory,
            fragments=fragments,
            registry=self.registry,
            new_id=self._new_id,
            send=self._send,
            send_quietly=self._send_quietly,
            spawn=self._spawn,
            free=self._free,
            start_execution=self._start_execution,
        )

    # --- wiring --------------------------------------------------------------------------

    @property
    def routes(self) -> dict[type[Message], Handler]:
        """The dispatch table: one handler per protocol message."""
        return {
            QueryExecute: self.on_execute,
            QueryBatch: self.on_batch,
            QueryFlowControl: self.on_flow_control,
            QueryCancel: self.on_cancel,
            QueryCheck: self.on_check,
        }

    def install(self, server: RpcServer) -> None:
        for msg_type, handler in self.routes.items():
            server.route(msg_type, handler)

    async def start(self) -> None:
        self._stopping = False
        self._maintenance = asyncio.get_running_loop().create_task(
            self._maintain(), name=f"sql-protocol {self.name}"
        )

    async def stop(self) -> None:
        """Fail the queries this member initiated, stop every execution, close links."""
        self._stopping = True
        if self._maintenance is not None:
            self._maintenance.cancel()
        reg = self.registry
        for q, iq in list(reg.initiated.items()):
            iq.end()
            stopped = NodeUnavailable(f"member {self.name} stopped", details={"query": str(q)})
            iq.result.fail(stopped)
        reg.initiated.clear()
        for exe in list(reg.executions.values()):
            exe.stop()
        reg.executions.clear()
        tasks = [t for t in (self._maintenance, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._pool.close()

    async def execute(
        self,
        plan: QueryPlan,
        parameters: list[Any] | dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        window: int | None = None,
    ) -> QueryResult:
        """Start ``plan`` on its participants now, this member its initiator; rows come
        from the returned result.

        Raises ``BAD_REQUEST`` (bad plan, unknown fragment kind, window or timeout out of
        range) or ``NODE_UNAVAILABLE`` (a participant is down, this member is stopping)
        before anything is sent."""
        if self._stopping:
            raise NodeUnavailable(f"member {self.name} is stopping")
        return self.initiator.start(plan, parameters, timeout=timeout, window=window)

    def new_query_id(self) -> QueryId:
        """A fresh id from this member's factory, for a query that runs without fragments
        (the SQL initiator's inline key lookup): it is named in replies and logs like the
        others, and no two queries of this member share an id."""
        return self._new_id()

    def describe(self) -> dict[str, int]:
        """Counts of live state, including protocol tasks still running (sends, checks)."""
        return {**self.registry.describe(), "tasks": len(self._tasks)}

    # --- any member ----------------------------------------------------------------------

    def request_cancel(self, q: QueryId, error: ShardexError) -> None:
        """Cancel ``q`` from this member: through the initiator unless this member is it."""
        if q.initiator == self.member_id:
            self.initiator.cancel(q, error, self.member_id)
            return
        if self.registry.is_tombstoned(q):
            return  # this member already cancelled or finished it: one cancel per member
        self._free(q)
        # Sent even when the failure detector holds the initiator down: a suspicion may be
        # false (a starved process misses heartbeats), and an initiator that never hears
        # would wait for this member's streams until the query's timeout. To one that
        # really is down the send fails, quietly.
        msg = QueryCancel(
            query_id=q,
            cancel_initiator=self.member_id,
            code=error.code.value,
            message=error.message,
            details=wire_details(error.details),
        )
        self._spawn(self._send_quietly(q.initiator, msg))

    def _admit(self, q: QueryId) -> None:
        """QUERY_OVERLOADED when ``max_executions`` executions of other members' queries run
        here already. It never waits: a query's initiator holds its statement's slot while
        its executions start, and a wait here for slots held by queries that wait on that
        initiator would be a cycle (decision 0105). The initiator's own part is not counted:
        its statement slot admitted it. Counted from the registry, so no end path of an
        execution can leak a slot."""
        cap = self.config.max_executions
        reg = self.registry
        if cap is None or q.initiator == self.member_id or len(reg.executions) + self.calls < cap:
            return
        running = sum(1 for k in reg.executions if k.initiator != self.member_id) + self.calls
        if running >= cap:
            reg.stats["executes_overloaded"] += 1
            raise overloaded(
                f"{running} query fragments running for other nodes (the limit {cap})",
                keys=("sql_max_fragments",),
                cap=cap,
                running=running,
                member=self.member_id,
            )

    @contextlib.contextmanager
    def leaf_call(self, q: QueryId) -> Iterator[None]:
        """A leaf of ``q`` run here by request and reply (``sql.exec.leaf_calls``), not as an
        execution: admitted as one (``_admit``: QUERY_OVERLOADED past ``max_executions``)
        and counted with them while it runs."""
        self._admit(q)
        self.calls += 1
        try:
            yield
        finally:
            self.calls -= 1

    def _free(self, q: QueryId) -> None:
        exe = self.registry.executions.pop(q, None)
        if exe is not None:
            exe.stop()
        self.registry.tombstone(q)

    def _start_execution(
        self, msg: QueryExecute, layout: PlanLayout, result: ResultChannel | None
    ) -> QueryExecution:
        exe = QueryExecution(
            msg=msg,
            layout=layout,
            member=self.member_id,
            fragments=self.fragments,
            send=self._send,
            grant=self._grant,
            meter=self.meter,
            result=result,
            on_done=self._on_execution_done,
        )
        self.registry.executions[msg.query_id] = exe
        exe.start()
        return exe

    def _on_execution_done(self, exe: QueryExecution, error: ShardexError | None) -> None:
        q = exe.query_id
        if self.registry.executions.get(q) is not exe:
            return
        if error is not None:
            self.request_cancel(q, error)
        elif q in self.registry.initiated:
            self.initiator.complete(q, early=exe.early)
        else:
            self._free(q)

    def _grant(self, sender: str, msg: QueryFlowControl) -> None:
        self._spawn(self._send_or_cancel(sender, msg))

    async def _send_or_cancel(self, member: str, msg: QueryFlowControl) -> None:
        try:
            await self._send(member, msg)
        except ShardexError as e:
            self.request_cancel(msg.query_id, e)

    # --- handlers ------------------------------------------------------------------------

    async def on_execute(self, msg: QueryExecute, conn: Connection | None) -> None:
        q = msg.query_id
        self._watch(conn, q.initiator)
        reg = self.registry
        if reg.is_tombstoned(q) or q in reg.executions or self._stopping:
            reg.stats["executes_ignored"] += 1  # cancelled before it arrived, or a repeat
            return
        try:
            layout = layout_plan(msg.plan, q.initiator)
            if self.member_id not in layout.participants:
                raise ShardexError(
                    f"{self.member_id} got execute for {q} but runs none of its fragments",
                    code=ErrorCode.PROTOCOL_ERROR,
                    details={"query_id": str(q), "participants": list(layout.participants)},
                )
            for f in msg.plan.fragments:
                self.fragments.get(f.kind)
            self._admit(q)
        except ShardexError as e:
            reg.drop_pending(q)
            self.request_cancel(q, e)
            return
        exe = self._start_execution(msg, layout, None)
        reg.stats["executions_started"] += 1
        for held in reg.take_pending(q):
            if reg.executions.get(q) is not exe:
                break  # an early batch was bad and cancelled the query
            self._deliver(exe, held)

    async def on_batch(self, msg: QueryBatch, conn: Connection | None) -> None:
        q = msg.query_id
        self._watch(conn, msg.sender)
        reg = self.registry
        exe = reg.executions.get(q)
        if exe is not None:
            self._deliver(exe, msg)
        elif reg.is_tombstoned(q) or q.initiator == self.member_id or self._stopping:
            # An initiator starts its execution before anyone can send to it, so no state
            # there means finished; elsewhere a tombstone says cancelled or finished.
            reg.stats["batches_discarded"] += 1
        elif not reg.hold(msg):
            reg.stats["pending_overflow"] += 1
            self.request_cancel(
                q,
                ShardexError(
                    f"{self.member_id} holds too many batches of queries not started yet",
                    code=ErrorCode.QUERY_STATE,
                    details={
                        "value": reg.pending_bytes,
                        "hint": "raise max_pending_bytes / max_pending_queries",
                    },
                ),
            )

    def _deliver(self, exe: QueryExecution, msg: QueryBatch) -> None:
        try:
            exe.on_batch(msg)
        except ShardexError as e:
            self.request_cancel(exe.query_id, e)

    async def on_flow_control(self, msg: QueryFlowControl, conn: Connection | None) -> None:
        self._watch(conn, msg.receiver)
        exe = self.registry.executions.get(msg.query_id)
        if exe is not None:
            exe.on_flow_control(msg)
        else:
            self.registry.stats["flow_control_discarded"] += 1

    async def on_cancel(self, msg: QueryCancel, conn: Connection | None) -> None:
        q = msg.query_id
        error = ShardexError.from_wire(msg.code, msg.message, msg.details)
        self.registry.stats["cancels_received"] += 1
        if q.initiator == self.member_id:
            self._watch(conn, msg.cancel_initiator)
            self.initiator.cancel(q, error, msg.cancel_initiator)
        else:
            self._watch(conn, q.initiator)
            self._free(q)  # before its execute, the tombstone makes the execute a no-op

    async def on_check(self, msg: QueryCheck, conn: Connection | None) -> QueryCheckResponse:
        inactive = [
            q
            for q in msg.suspected
            if q.initiator == self.member_id and q not in self.registry.initiated
        ]
        return QueryCheckResponse(inactive=inactive)

    # --- sending and links ---------------------------------------------------------------

    async def _send(self, member: str, msg: Message) -> None:
        """Send ``msg`` to ``member`` (dispatched in place when it is this member)."""
        if member == self.member_id:
            if isinstance(msg, QueryBatch):
                await self.on_batch(msg, None)
            elif isinstance(msg, QueryFlowControl):
                await self.on_flow_control(msg, None)
            else:
                raise AssertionError(f"{type(msg).__name__} is never sent to oneself")
            return
        if self.before_send is not None and not await self.before_send(member, msg):
            self.registry.stats["dropped_by_hook"] += 1
            return
        address = self.directory.address_of(member)
        if address is None:
            raise NodeUnavailable(f"no address for member {member}", details={"value": member})
        try:
            conn = await self._pool.get(address)
            self._watch(conn, member)
            self.sent[type(msg).__name__] += 1
            await conn.send(msg)
        except ShardexError as e:
            # Whatever broke the link, the query's error names the member it lost.
            raise cancelled(
                f"{type(msg).__name__} from {self.member_id} to {member} failed: {e.message}",
                "link_lost",
                member=member,
                cause=e.code.value,
            ) from e

    async def _send_quietly(self, member: str, msg: Message) -> None:
        try:
            await self._send(member, msg)
        except ShardexError as e:
            log.debug("%s: %s to %s lost: %s", self.name, type(msg).__name__, member, e)

    def _watch(self, conn: Connection | None, peer: str) -> None:
        """A connection that breaks may have lost messages of any query it carried."""
        if conn is None or conn in self._watched or conn.closed:
            return
        self._watched[conn] = peer
        conn.add_close_callback(self._on_link_closed)

    def _on_link_closed(self, conn: Connection) -> None:
        peer = self._watched.pop(conn, None)
        if peer is None or self._stopping:
            return
        error = cancelled(
            f"connection between {self.member_id} and {peer} lost during the query",
            "link_lost",
            member=peer,
        )
        reg = self.registry
        for q, iq in list(reg.initiated.items()):
            if peer in iq.participants:
                self.initiator.cancel(q, error, self.member_id)
        for q, exe in list(reg.executions.items()):
            if peer in exe.participants:
                self.request_cancel(q, error)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[task] = None
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: protocol task failed", self.name, exc_info=task.exception())

    # --- maintenance: membership, check, tombstones --------------------------------------

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval)
            self.registry.collect()
            self._watch_members()
            await self._check()

    def _watch_members(self) -> None:
        reg, down = self.registry, self.directory.is_down
        for q, iq in list(reg.initiated.items()):
            gone = [p for p in iq.participants if p != self.member_id and down(p)]
            if gone:
                left = cancelled(f"participant {gone[0]} left", "participant_left", member=gone[0])
                self.initiator.cancel(q, left, self.member_id)
        for q, exe in list(reg.executions.items()):
            if q.initiator == self.member_id:
                continue
            if down(q.initiator):
                self._initiator_down(q)
                continue
            gone = [p for p in exe.participants if p != self.member_id and down(p)]
            if gone:
                self.request_cancel(
                    q, cancelled(f"participant {gone[0]} left", "participant_left", member=gone[0])
                )
        for q in list(reg.pending):
            if down(q.initiator):
                self._initiator_down(q)

    def _initiator_down(self, q: QueryId) -> None:
        """Free ``q`` here: the failure detector holds its initiator down. The specification
        frees without a message; this member still sends its one cancel (``request_cancel``)
        so that an initiator suspected wrongly fails the query at once with this error
        rather than waiting for its timeout on streams that will never end."""
        self.registry.stats["freed_initiator_down"] += 1
        self.request_cancel(
            q,
            cancelled(
                f"{self.member_id} dropped its part of query {q}: the failure detector here "
                f"holds the initiator {q.initiator} down",
                "initiator_suspected",
                member=self.member_id,
                hint="missed heartbeats (an overloaded node?); run the statement again",
            ),
        )

    async def _check(self) -> None:
        held = self.registry.held_for_others()
        asks = [(i, qs) for i, qs in held.items() if not self.directory.is_down(i)]
        await asyncio.gather(*(self._check_one(i, qs) for i, qs in asks))

    async def _check_one(self, initiator: str, suspected: list[QueryId]) -> None:
        address = self.directory.address_of(initiator)
        if address is None:
            return
        self.sent["QueryCheck"] += 1
        try:
            reply = await self._pool.request(
                address,
                QueryCheck(sender=self.member_id, suspected=suspected),
                self.config.check_timeout,
                expect=QueryCheckResponse,
            )
        except ShardexError as e:
            log.debug("%s: check with %s failed: %s", self.name, initiator, e)
            return
        reg = self.registry
        for q in reply.inactive:
            if q.initiator == initiator and (q in reg.executions or q in reg.pending):
                self._free(q)
                reg.stats["freed_by_check"] += 1

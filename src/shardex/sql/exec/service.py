"""``SqlService``: one SQL statement from a client, on the node that receives it (the
initiator of the query).

SELECT: bind, check parameters, plan (``plan.plan_select``), pick the query's one stability
TS (``stability.py``), start the fragments through the execution protocol
(``QueryService.execute``) and stream the root's rows to the client; a key lookup of at
most ``plan.INLINE_KEYS`` documents runs right here on the loop instead (one ``GetMany``
per owner, no fragment, no thread). The reply carries the first block of result rows (all
of them when they fit: no stream at all) unless the ``inline`` switch is off. EXPLAIN: the
plan as one row. INSERT/UPSERT: by key. DELETE/UPDATE: the derived SELECT
(``statements.dml_select``) runs distributed at request_plus to choose the documents, then each
is written at its owner under its CAS with the WHERE re-checked on the version written
(``dml.py``: no lost updates); the reply carries the mutation count. Errors before the
statement runs answer the request (SQL_SYNTAX with line/column/token, KEYSPACE_NOT_FOUND,
INDEX_NOT_FOUND with a CREATE PRIMARY INDEX hint, BAD_REQUEST for parameters and for a
statement over ``MAX_STATEMENT_BYTES``); errors while
rows flow (also within the first block) end the stream with that error. Nothing here
outlives the statement: a failed statement leaves the node serving.

The node's HTTP query service runs statements through ``open_statement``: the same checks,
admission and statement logic (``_run``), the rows handed back as an iterator instead of
being streamed on a connection (decision 0116).

Admission (decision 0104): at most ``sql_max_running`` statements run at once on a node as
their initiator and ``sql_max_queued`` more wait for a slot, first come first served, for at
most ``QUEUE_WAIT`` (or the statement's timeout when shorter); past either, QUERY_OVERLOADED.
A statement holds its slot until its last row is sent, however it ends.

Parsing, binding and planning cost grows with the statement's length (CPython: about a
second per 100 KiB of IN list or OR chain): a statement of up to
``statements.PLAN_ON_LOOP_CHARS`` is prepared on the loop (milliseconds: no thread hand-off
on the common path), a longer one in a worker thread, so it never stalls the loop's
heartbeats and other requests; its fragments bind it likewise (decision 0103).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import msgspec

import shardex.sql.exec.compound as compound  # set operations, WITH, PREPARE, INSERT SELECT
from shardex.api.scan import AT_PLUS, CONSISTENCIES
from shardex.api.scan_streams import OutStreams
from shardex.api.sql_exec import (
    ExchangeStats,
    ExchangeStatsReply,
    LeafCancel,
    LeafRequest,
    SqlQuery,
    SqlStarted,
)
from shardex.api.validation import check_durability, check_durability_timeout
from shardex.core.expr.functions_date import mentions_statement_time, with_statement_time
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.net import Connection, Principal, RpcServer
from shardex.runtime.admission import DEFAULT_QUEUED, AdmissionGate, Slot, default_cap
from shardex.scan.coordinator import ScanCoordinator
from shardex.sql.exec.dml_run import dml_statement
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.explain_statement import explain_statement
from shardex.sql.exec.key_lookup import KeyLookups
from shardex.sql.exec.leaf_calls import LeafCalls
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.pin_guess import PinGuesses
from shardex.sql.exec.plan import (
    PhysicalPlan,
    bind_statement,
    plan_select,
    statement_facts,
)
from shardex.sql.exec.reply import BLOCK_BYTES, BLOCK_ROWS, once, respond
from shardex.sql.exec.select_start import SelectStart
from shardex.sql.exec.stability import StatementStability
from shardex.sql.exec.started import started_reply
from shardex.sql.exec.statement_checks import (
    MAX_STATEMENT_BYTES,
    MAX_TIMEOUT,
    check_memory_quota,
    check_statement,
    check_statement_size,
    time_left,
)
from shardex.sql.exec.statement_stats import StatementStats
from shardex.sql.exec.statements import (
    PLAN_ON_LOOP_CHARS,
    bad_request,
    parsed,
    prepared_off_loop,
)
from shardex.sql.exec.subquery_inputs import inputs_of
from shardex.sql.exec.tuning import BoundedMeter, check_tuning
from shardex.sql.prepared import PreparedStatements
from shardex.sql.protocol import QueryService
from shardex.sql.syntax import (
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    SelectStmt,
    UpdateStmt,
)
from shardex.sql.syntax.ast import ExecuteStmt, PrepareStmt
from shardex.sql.syntax.merge import MergeStmt
from shardex.sql.syntax.params import check_params, check_params_depth

__all__ = ["QUEUE_WAIT", "SqlService"]

# Admission (decision 0104): the longest a statement waits for a slot when all
# ``sql_max_running`` run (its own timeout when shorter).
QUEUE_WAIT: Final = 30.0


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """A key lookup checked and planned in the loop turn it arrived in, with its keys."""

    plan: PhysicalPlan
    keys: list[str]


class SqlService(SelectStart):
    def __init__(
        self,
        *,
        query: QueryService,
        scan: ScanCoordinator,
        documents: DocumentAccess,
        streams: OutStreams,
        members: Callable[[], dict[str, str]],
        memory: NodeMemory | None = None,
        max_statement_bytes: int = MAX_STATEMENT_BYTES,
        max_running: int | None = None,
        max_queued: int = DEFAULT_QUEUED,
    ) -> None:
        self.query = query
        self.scan = scan
        self.documents = documents
        self.stability = StatementStability(scan)
        self.guesses = PinGuesses()  # request_plus's last pinned TS per index (``pin_guess``)
        self.streams = streams
        self._members = members  # node name -> member id of the members up now
        # The node's SQL memory (decision 0106): every statement's operators draw on it.
        self.memory = NodeMemory() if memory is None else memory
        self.max_statement_bytes = max_statement_bytes
        self.keys = KeyLookups(documents, self.memory, query.new_query_id)
        # Small results: leaves asked by request and reply, not streamed (``leaf_calls``).
        self.calls = LeafCalls(query, documents.pool, scan, documents, self.memory)
        self.prepared = PreparedStatements()  # PREPARE / EXECUTE names, this node's
        # How the statements initiated here ended, and their latency (the node's metrics).
        self.stats = StatementStats()
        # Statements running at once on this node as their initiator, and waiting to.
        self.admission = AdmissionGate(
            "SQL statements",
            default_cap() if max_running is None else max_running,
            max_queued,
            cap_key="sql_max_running",
            queue_key="sql_max_queued",
        )

    def install(self, server: RpcServer) -> None:
        # Called in the receive callback: a point query by key on the node owning its
        # documents is answered there (``_select_now``); anything else goes on in a task.
        server.router.route_inline(SqlQuery, self._on_query_observed)
        server.route(ExchangeStats, self.on_exchange_stats)
        server.route(LeafRequest, self.calls.on_leaf_request)
        server.route(LeafCancel, self.calls.on_leaf_cancel)

    async def on_exchange_stats(self, msg: ExchangeStats, conn: Connection) -> ExchangeStatsReply:
        meter = self.query.meter
        streams = meter.report(msg.query_id) if isinstance(meter, BoundedMeter) else []
        return ExchangeStatsReply(member=self.query.member_id, streams=streams)

    # --- the request ---------------------------------------------------------------------

    def _on_query_observed(
        self, msg: SqlQuery, conn: Connection
    ) -> SqlStarted | Awaitable[SqlStarted]:
        """``on_query``, its statement observed when it ends in this call: answered in the
        loop turn, or refused (``StatementStats``); an admitted one observes itself."""
        t0 = time.perf_counter()
        try:
            out = self.on_query(msg, conn)
        except BaseException as exc:
            self.stats.end(t0, exc)
            raise
        if isinstance(out, SqlStarted):
            self.stats.end(t0)
        return out

    def on_query(self, msg: SqlQuery, conn: Connection) -> SqlStarted | Awaitable[SqlStarted]:
        """The statement once admitted (``admission``): it holds its slot until its last
        row is sent, on every way out (done, error, cancel, a lost connection)."""
        self.streams.check_new(conn, msg.stream_id)
        msg = self._accepted(msg)
        slot = self.admission.try_enter()
        if slot is None:
            return self._queued(msg, conn)
        try:
            started = self._select_now(msg, conn.principal)
        except BaseException:
            slot.release()
            raise
        if not isinstance(started, SqlStarted):
            return self._admitted(msg, conn, slot, started)
        slot.release()
        return started

    def _accepted(self, msg: SqlQuery) -> SqlQuery:
        """``msg`` checked (a request that cannot run never queues) and, when it names
        ``NOW_*``, its params stamped with the statement time (one for every fragment)."""
        self._check(msg)
        if mentions_statement_time(msg.statement):
            msg = msgspec.structs.replace(msg, params=with_statement_time(msg.params))
        return msg

    async def _queued(self, msg: SqlQuery, conn: Connection) -> SqlStarted:
        t0 = time.perf_counter()
        try:
            msg, slot = await self._wait_for_slot(msg)
        except BaseException as exc:
            self.stats.end(t0, exc)  # refused, or gave up waiting
            raise
        return await self._admitted(msg, conn, slot)

    async def _wait_for_slot(self, msg: SqlQuery) -> tuple[SqlQuery, Slot]:
        """A slot once one is free, and ``msg`` with what is left of its timeout."""
        loop = asyncio.get_running_loop()
        queued_at = loop.time()
        slot = await self.admission.enter(min(msg.timeout, QUEUE_WAIT))
        # The timeout counts from arrival, so the client's wait for the reply holds.
        left = time_left(queued_at + msg.timeout, loop.time())
        return msgspec.structs.replace(msg, timeout=left), slot

    async def open_statement(
        self, msg: SqlQuery, principal: Principal | None
    ) -> tuple[SqlStarted, AsyncIterator[list[bytes]], Slot]:
        """A statement run in-process for ``principal`` (the node's HTTP query service):
        the checks, admission and statement logic of ``on_query``, its rows handed back as
        an iterator instead of a stream on a connection. The caller closes the rows and
        releases the slot once they end, however they end."""
        msg = self._accepted(msg)
        slot = self.admission.try_enter()
        if slot is None:
            msg, slot = await self._wait_for_slot(msg)
        try:
            now = self._select_now(msg, principal)
            if isinstance(now, SqlStarted):  # answered in this turn: its rows are the reply's
                rows, now = now.rows, msgspec.structs.replace(now, rows=[], done=False)
                return now, once(rows), slot
            started, chunks = await self._run(msg, principal, now)
        except BaseException:
            slot.release()
            raise
        return started, chunks, slot

    def answer_now(self, msg: SqlQuery, principal: Principal | None) -> SqlStarted | None:
        """The whole answer (rows in the reply) of a statement ``open_statement`` would
        answer in this loop turn, a key lookup whose documents are all here, made without
        waiting (the HTTP service's receive callback); None for any other statement and for
        one that fails or finds no free slot (``open_statement`` then runs it, errors and
        all). The caller observes its end (``stats``)."""
        try:
            msg = self._accepted(msg)
        except ShardexError:
            return None
        slot = self.admission.try_enter()
        if slot is None:
            return None
        try:
            now = self._select_now(msg, principal)
        except ShardexError:
            return None
        finally:
            slot.release()
        return now if isinstance(now, SqlStarted) else None

    async def _admitted(
        self, msg: SqlQuery, conn: Connection, slot: Slot, lookup: KeyPlan | None = None
    ) -> SqlStarted:
        t0 = time.perf_counter()
        try:
            return await self._statement(msg, conn, slot, t0, lookup)
        except BaseException as exc:
            slot.release()
            self.stats.end(t0, exc)
            raise

    def _select_now(
        self, msg: SqlQuery, principal: Principal | None
    ) -> SqlStarted | KeyPlan | None:
        """The whole answer of a key lookup whose documents are all this node's, made in
        this loop turn (``KeyLookups.read_now``); for a key lookup whose documents are not
        all here, its checked plan and keys (``KeyPlan``: the awaited path reads them from
        their owners without planning again); None for anything else (the awaited path does
        it from the start: every step here is repeated there or answers the same)."""
        tuning = check_tuning(msg.tuning)
        sql, params = msg.statement, msg.params
        if not (tuning["inline"] and tuning["plan_cache"]) or len(sql) > PLAN_ON_LOOP_CHARS:
            return None
        stmt = parsed(sql)
        if not isinstance(stmt, SelectStmt):
            return None
        # Anything but a key lookup leaves here, before checks its own path makes anyway
        # (parse, bind and the facts are kept per text: lookups). A statement that does not
        # bind is answered by that path too, in its order (privileges first).
        try:
            b = bind_statement(sql, False)
        except ShardexError:
            return None
        state = self.scan.view.state_now()
        if statement_facts(b).key_lookup is None or state is None or inputs_of(b):
            return None
        check_statement(principal, stmt)
        check_params(b.params(), params)
        plan = plan_select(b, params, state=state, members=self._members(), tuning=tuning)
        keys = self.keys.keys_of(plan, params)
        if keys is None:
            return None
        cells = self.keys.read_now(plan, keys, params, self.quota(msg), msg.spill)
        if cells is None or len(cells) > BLOCK_ROWS or sum(map(len, cells)) > BLOCK_BYTES:
            return KeyPlan(plan, keys)
        return msgspec.structs.replace(self._started(msg, plan, None), rows=cells, done=True)

    async def _statement(
        self, msg: SqlQuery, conn: Connection, slot: Slot, t0: float, lookup: KeyPlan | None
    ) -> SqlStarted:
        started, chunks = await self._run(msg, conn.principal, lookup)
        on_end = functools.partial(self.stats.end, t0)
        return await respond(self.streams, conn, msg, started, chunks, slot, on_end)

    async def _run(
        self, msg: SqlQuery, principal: Principal | None, lookup: KeyPlan | None = None
    ) -> tuple[SqlStarted, AsyncIterator[list[bytes]]]:
        """The statement started: its first reply (without rows) and its rows. ``lookup``:
        the key lookup ``_select_now`` checked and planned, whose documents are elsewhere."""
        if lookup is not None:
            rows = self.keys.rows(
                lookup.plan, lookup.keys, msg.params, msg.timeout, self.quota(msg), msg.spill
            )
            return self._started(msg, lookup.plan, None), rows
        tuning = check_tuning(msg.tuning)
        sql, cached = msg.statement, tuning["plan_cache"]
        stmt = await prepared_off_loop(sql, lambda: parsed(sql, cached=cached))  # SQL_SYNTAX
        check_statement(principal, stmt)
        params = msg.params
        if isinstance(stmt, SelectStmt):
            plan, ts, chunks = await self.start_select(msg, msg.statement, stmt, params)
            return self._started(msg, plan, ts), chunks
        if isinstance(stmt, PrepareStmt | ExecuteStmt) or _explains_execute(stmt):
            run = functools.partial(self._run, principal=principal)  # EXECUTE: as if sent
            return await compound.prepared_statement(
                self, msg, stmt, principal, run, self._accepted
            )
        if isinstance(stmt, ExplainStmt):  # any other statement's plan; nothing runs
            return await explain_statement(self, msg, stmt, params, self._members())
        if compound.is_compound(stmt):  # a set operation or WITH
            return await compound.compound_statement(self, msg, stmt, params, self.quota(msg))  # type: ignore[arg-type]
        if isinstance(stmt, InsertStmt | DeleteStmt | UpdateStmt | MergeStmt):
            return await dml_statement(self, msg, stmt, params)
        raise bad_request(
            f"{type(stmt).__name__} is index DDL: run it with client.execute_ddl",
            hint="client.query sends DDL there itself",
        )

    def _check(self, msg: SqlQuery) -> None:
        check_statement_size(msg.statement, self.max_statement_bytes)
        check_durability(msg.durability)
        check_durability_timeout(msg.durability_timeout)
        if msg.consistency not in CONSISTENCIES:
            raise bad_request(
                f"consistency must be one of {', '.join(CONSISTENCIES)}, got {msg.consistency!r}",
                value=repr(msg.consistency),
            )
        if msg.consistency == AT_PLUS and msg.at is None:
            raise bad_request("at_plus needs a timestamp (at=...)", hint="pass the writes' results")
        if not 0 < msg.timeout <= MAX_TIMEOUT:
            raise bad_request(f"timeout must be in (0, {MAX_TIMEOUT}] seconds", value=msg.timeout)
        check_memory_quota(msg.memory_quota, self.memory.query_max)
        check_params_depth(msg.params)

    def _started(self, msg: SqlQuery, plan: PhysicalPlan, ts: Timestamp | None) -> SqlStarted:
        """The reply that starts a SELECT's result (without its rows)."""
        return started_reply(msg, plan, ts, self.scan.name, self.scan.view.address)


def _explains_execute(stmt: object) -> bool:
    """EXPLAIN EXECUTE: the prepared text's EXPLAIN, run as EXECUTE runs its text."""
    return isinstance(stmt, ExplainStmt) and isinstance(stmt.statement, ExecuteStmt)

"""How ``SqlService`` starts a SELECT: bind (off the loop when long), read subquery inputs
first (decision 0139), plan, then the cheapest way to run it that stays exact: a join between
fragments or over side statements (``join_start``), a key lookup by ``GetMany`` (``key_lookup``),
a request_plus one-leaf plan read while its seqno round is out (``local_leaf.speculate``), a
local leaf in-process, leaf calls for a small result (``leaf_calls``), or the execution protocol;
at a guessed TS when one is known (``pin_guess``), else at the TS pinned by
``StatementStability``; with failover to other copies of a lost indexer's slices
(``failover``). Apart from the service's admission, checks and statement kinds so each reads
on its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import msgspec

import shardex.sql.exec.compound as compound  # subquery inputs read before the statement
from shardex.api.scan import REQUEST_PLUS
from shardex.api.sql_exec import SqlQuery
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.scan.coordinator import ScanCoordinator
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.failover import failed_leaf, failing_over
from shardex.sql.exec.join_start import start_join
from shardex.sql.exec.key_lookup import KeyLookups
from shardex.sql.exec.leaf_calls import LeafCalls, SeqnoRide
from shardex.sql.exec.local_leaf import LocalRun, high_seqnos_after, local_rows, speculate
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.pin_guess import PinGuesses
from shardex.sql.exec.plan import PhysicalPlan, bind_statement, plan_select
from shardex.sql.exec.reply import cells_closing
from shardex.sql.exec.stability import StatementStability
from shardex.sql.exec.statement_checks import time_left
from shardex.sql.exec.statements import prepared_off_loop
from shardex.sql.exec.subquery_inputs import inputs_of
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.protocol import QueryService
from shardex.sql.syntax import SelectStmt
from shardex.sql.syntax.bind import BoundSelect
from shardex.sql.syntax.params import check_params

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer
    from shardex.sql.exec.service import SqlService

log = logging.getLogger("shardex.sql.exec.service")  # one logger name for the service's lines


class SelectStart:
    """The SELECT half of ``SqlService`` (which sets these attributes)."""

    query: QueryService
    scan: ScanCoordinator
    documents: DocumentAccess
    memory: NodeMemory
    stability: StatementStability
    guesses: PinGuesses
    keys: KeyLookups
    calls: LeafCalls
    _members: Callable[[], dict[str, str]]

    def _service(self) -> SqlService:
        """This object as the service it is part of (what compound and join starts take)."""
        return cast("SqlService", self)

    def quota(self, msg: SqlQuery) -> int:
        """The statement's memory quota on each member, bytes (checked by ``_check``)."""
        return self.memory.query_max if msg.memory_quota is None else msg.memory_quota

    async def start_select(
        self,
        msg: SqlQuery,
        sql: str,
        stmt: SelectStmt,
        params: Any,
        *,
        dml: bool = False,
        consistency: str | None = None,
        params_checked: bool = False,
    ) -> tuple[PhysicalPlan, Timestamp | None, AsyncIterator[list[bytes]]]:
        """Plan and start a SELECT; returns the plan, the TS it reads and its result rows
        (encoded, in chunks). ``stmt`` is ``sql`` parsed (for DML: the SELECT it derives)."""
        tuning = check_tuning(msg.tuning)
        b = await prepared_off_loop(
            sql, lambda: bind_statement(sql, dml, cached=tuning["plan_cache"])
        )
        if not params_checked:  # a set operation's branch: checked against the whole
            check_params(b.params(), params)
        inputs = inputs_of(b)
        if inputs:  # subqueries over keyspaces: read first (decision 0139)

            def start(with_inputs: Any) -> Awaitable[tuple[Any, Any, Any]]:
                return self._start_bound(msg, sql, b, with_inputs, dml, consistency)

            # They read at the statement's consistency (a DML's SELECT: request_plus).
            level = msg
            if consistency is not None:
                level = msgspec.structs.replace(msg, consistency=consistency)
            return await compound.with_subquery_inputs(
                self._service(), level, sql, inputs, params, start
            )
        return await self._start_bound(msg, sql, b, params, dml, consistency)

    async def _start_bound(
        self,
        msg: SqlQuery,
        sql: str,
        b: BoundSelect,
        params: Any,
        dml: bool,
        consistency: str | None,
    ) -> tuple[PhysicalPlan, Timestamp | None, AsyncIterator[list[bytes]]]:
        """``start_select`` once ``sql`` is bound (``b``) and its parameters are complete."""
        tuning = check_tuning(msg.tuning)
        state = await self.scan.view.state()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + msg.timeout
        # Indexer nodes that failed this statement: its leaves go to other copies
        # (``failover.py``), at the TS pinned once.
        avoid: set[str] = set()

        def planned(members: dict[str, str] | None = None) -> PhysicalPlan:
            return plan_select(
                b,
                params,
                state=state,
                members=self._members() if members is None else members,
                tuning=tuning,
                avoid=frozenset(avoid),
            )

        # The members are read here, on the loop: membership changes only there.
        members = self._members()
        plan = await prepared_off_loop(sql, lambda: planned(members))
        plan.params = params
        if plan.join is not None:  # between fragments (0135) or here over side statements (0123)
            return (
                plan,
                None,
                await start_join(self._service(), msg, sql, plan, params, self._members),
            )
        keys = self.keys.keys_of(plan, params)
        if keys is not None:
            quota = self.quota(msg)
            return plan, None, self.keys.rows(plan, keys, params, msg.timeout, quota, msg.spill)

        def without_failed(exc: ShardexError) -> PhysicalPlan:
            """The plan again without ``exc``'s lost leaf node, or ``exc`` raised."""
            node = failed_leaf(exc, plan)
            if node is None or node in avoid or loop.time() >= deadline:
                raise exc
            avoid.add(node)
            try:
                again = planned()
            except ShardexError:
                raise exc from None  # no other copy of one of its partitions
            log.info("statement lost the indexer %s (%s); planned on other copies", node, exc)
            return again

        level = consistency or msg.consistency
        local = self.scan.local_index
        speculates = tuning["local"] and tuning["speculate"]
        if level == REQUEST_PLUS and speculates and local and self._runs_here(plan):
            return await self._speculate(plan, local, sql, dml, params, msg)

        def runs_local(p: PhysicalPlan) -> bool:
            return p.tuning["local"] and self.scan.local_index is not None and self._runs_here(p)

        async def run(
            p: PhysicalPlan, ts: Timestamp | None, ride: SeqnoRide | None = None
        ) -> AsyncIterator[list[bytes]]:
            local = self.scan.local_index
            if local is not None and runs_local(p):
                p.query_id = str(self.query.new_query_id())
                p.local = True
                here = LocalRun(p, sql, dml, self.quota(msg), msg.spill)
                docs, memory = self.documents, self.memory
                chunks = await local_rows(local, docs, memory, here, ts, params, p.query_id)
            elif self.calls.wanted(p, sql, dml):  # a small result: leaves by request and reply
                q = self.query.new_query_id()
                p.query_id, p.called = str(q), True
                left = time_left(deadline, loop.time())
                here = LocalRun(p, sql, dml, self.quota(msg), msg.spill)
                stream = functools.partial(streamed, p, ts)
                return self.calls.rows(local, here, q, ts, params, left, stream, ride)
            else:
                chunks = await streamed(p, ts)
            if ride is not None:
                ride.answered({})  # no calls: the round asks every owner
            return chunks

        async def streamed(p: PhysicalPlan, ts: Timestamp | None) -> AsyncIterator[list[bytes]]:
            """``p`` run through the execution protocol."""
            qplan = p.query_plan(
                sql, dml, self.query.member_id, ts, self.quota(msg), spill=msg.spill
            )
            left = time_left(deadline, loop.time())
            result = await self.query.execute(qplan, params, timeout=left, window=msg.window)
            p.query_id = str(result.query_id)
            return cells_closing(result)

        async def rerun(failed: str | None) -> tuple[PhysicalPlan, AsyncIterator[list[bytes]]]:
            if failed is None:  # late materialization could not be exact: leaves fetch
                tuning["late"] = False
            else:
                avoid.add(failed)
            again = planned()  # NODE_UNAVAILABLE when a partition has no copy left
            return again, await run(again, ts)

        ts: Timestamp | None = None
        rides: list[SeqnoRide] = []

        def guess_seqnos(keyspace: str) -> Awaitable[Timestamp]:
            """What a run at the guessed TS must cover: the high seqnos gathered with its
            leaf calls when it makes them (``SeqnoRide``), else the node's shared round."""
            if runs_local(plan) or not self.calls.wanted(plan, sql, dml):
                return self.scan.view.shared_high_seqnos(keyspace)
            rides.append(SeqnoRide(self.scan.view, keyspace))
            return rides[0].wait_for()

        chunks = await self.guesses.try_run(
            plan, level, tuning, guess_seqnos, lambda at: run(plan, at, *rides)
        )
        if chunks is not None:
            ts = plan.guessed
        else:
            while True:
                try:
                    ts = await self.stability.pin(plan, level, msg.at, msg.timeout)
                    break
                except ShardexError as exc:
                    plan = without_failed(exc)
            while True:
                try:
                    chunks = await run(plan, ts)
                    break
                except ShardexError as exc:  # a participant already known down
                    plan = without_failed(exc)
            if ts is not None and plan.record is not None and level == REQUEST_PLUS:
                self.guesses.pinned(plan.record.id, ts)
        if not plan.leaves:
            return plan, ts, chunks
        repeatable = ts is not None and plan.repeatable
        return plan, ts, failing_over(plan, chunks, rerun, deadline, repeatable=repeatable)

    async def _speculate(
        self,
        plan: PhysicalPlan,
        local: IndexScanServer,
        sql: str,
        dml: bool,
        params: Any,
        msg: SqlQuery,
    ) -> tuple[PhysicalPlan, Timestamp, AsyncIterator[list[bytes]]]:
        """A request_plus one-leaf plan on this node: read while the seqno round is out
        (``local_leaf.speculate``)."""
        assert plan.record is not None and plan.keyspace is not None
        plan.query_id = str(self.query.new_query_id())
        plan.local = True
        here = LocalRun(plan, sql, dml, self.quota(msg), msg.spill)
        seqnos = high_seqnos_after(self.scan.view, plan.keyspace)
        ts, chunks = await speculate(
            local, self.documents, self.memory, here, seqnos, params, plan.query_id, msg.timeout
        )
        return plan, ts, chunks

    def _runs_here(self, plan: PhysicalPlan) -> bool:
        """One leaf, on this node: the plan runs in-process (``local_leaf``)."""
        return len(plan.leaves) == 1 and plan.leaves[0].member == self.query.member_id

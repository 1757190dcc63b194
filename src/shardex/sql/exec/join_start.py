"""Where a join statement runs: between fragments over hash exchanges when its join and sides
allow (decision 0135, ``join_exchange``), else at the initiator over side statements (0123).

A join fragment holds state no other copy has, so the exchange join has no failover of its
own: a node lost while it starts, or before any row left, runs the statement at the
initiator, whose side statements fail over as any SELECT does.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from shardex.api.sql_exec import SqlQuery
from shardex.errors import ShardexError
from shardex.sql.exec.failover import lost_participant, or_else_when_lost
from shardex.sql.exec.join_exchange import start_exchange_join
from shardex.sql.exec.join_run import run_join
from shardex.sql.exec.plan import PhysicalPlan, bind_statement, plan_select
from shardex.sql.exec.statement_checks import time_left
from shardex.sql.exec.statements import parsed, prepared_off_loop
from shardex.sql.syntax import SelectStmt

if TYPE_CHECKING:
    from shardex.sql.exec.service import SqlService

__all__ = ["start_join"]


async def start_join(
    svc: SqlService,
    msg: SqlQuery,
    sql: str,
    plan: PhysicalPlan,
    params: Any,
    members: Callable[[], dict[str, str]],
) -> AsyncIterator[list[bytes]]:
    """The rows of the join statement ``plan`` (text ``sql``); ``members`` gives the node
    name -> member id of the members up now."""
    assert plan.join is not None
    quota, spill = svc.quota(msg), msg.spill
    # One deadline for the whole statement: each step (the sides' pins, the query between
    # fragments, the fallback at the initiator and its side statements) gets what the
    # earlier ones left of the timeout, so a stuck statement ends at its timeout.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + msg.timeout

    def left() -> float:
        return time_left(deadline, loop.time())

    async def at_initiator() -> AsyncIterator[list[bytes]]:
        assert plan.join is not None
        plan.join.ran = None
        plan.query_id = str(svc.query.new_query_id())

        async def start(sql: str, side_params: Any) -> AsyncIterator[list[bytes]]:
            stmt = parsed(sql)
            assert isinstance(stmt, SelectStmt)
            now = msgspec.structs.replace(msg, timeout=left())
            return (await svc.start_select(now, sql, stmt, side_params))[2]

        return run_join(plan, params, start, svc.documents, svc.memory, quota, spill, left())

    async def plan_side(tuning: dict[str, bool], sql: str, params: Any) -> PhysicalPlan:
        """A side statement planned as a SELECT of its own."""
        b = await prepared_off_loop(
            sql, lambda: bind_statement(sql, False, cached=tuning["plan_cache"])
        )
        state = await svc.scan.view.state()
        return plan_select(b, params, state=state, members=members(), tuning=tuning)

    if plan.join.exchange is None or not plan.tuning["join_exchange"]:
        return await at_initiator()
    try:
        chunks = await start_exchange_join(
            plan,
            sql,
            params,
            plan_side=functools.partial(plan_side, plan.tuning),
            pin=lambda p: svc.stability.pin(p, msg.consistency, msg.at, left()),
            execute=lambda qplan, named: svc.query.execute(
                qplan, named, timeout=left(), window=msg.window
            ),
            initiator=svc.query.member_id,
            budget=quota,
            spill=spill,
        )
    except ShardexError as exc:
        if not lost_participant(exc):
            raise
        chunks = None  # lost while it started
    if chunks is None:
        return await at_initiator()
    return or_else_when_lost(chunks, at_initiator, f"join {plan.query_id}")

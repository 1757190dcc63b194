"""The initiator's part of the protocol: start a query on every participant, time it out,
cancel it once (the broadcast half of cancel), complete it. ``check`` answers from the
same bookkeeping (``QueryRegistry.initiated``).

``Initiator`` is built by ``QueryService`` and given what it uses of the member: the shared
registry, the directory, and the member's ways to send, spawn a task, free a query's local
state and start the local execution; it holds no reference to the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from shardex.api.query_ids import QueryId
from shardex.api.sql_protocol import QueryCancel, QueryExecute, QueryPlan
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.net.messages import Message
from shardex.sql.protocol.config import MemberDirectory, ProtocolConfig
from shardex.sql.protocol.execution import QueryExecution
from shardex.sql.protocol.flow import MIN_WINDOW
from shardex.sql.protocol.fragments import FragmentRegistry
from shardex.sql.protocol.plan_layout import PlanLayout, layout_plan
from shardex.sql.protocol.registry import InitiatedQuery, QueryRegistry
from shardex.sql.protocol.results import QueryResult, ResultChannel

__all__ = ["Initiator", "cancelled", "wire_details"]


def cancelled(message: str, reason: str, **details: Any) -> ShardexError:
    return ShardexError(
        message, code=ErrorCode.QUERY_CANCELLED, details={"reason": reason, **details}
    )


def wire_details(details: dict[str, Any]) -> dict[str, Any]:
    """Details that msgpack can carry (a fragment may put anything in its error)."""
    plain = (str, int, float, bool, type(None))
    return {str(k): v if isinstance(v, plain) else repr(v) for k, v in details.items()}


class Initiator:
    """The queries this member coordinates: their start, timeout, cancel and completion."""

    def __init__(
        self,
        *,
        member_id: str,
        config: ProtocolConfig,
        directory: MemberDirectory,
        fragments: FragmentRegistry,
        registry: QueryRegistry,
        new_id: Callable[[], QueryId],
        send: Callable[[str, Message], Awaitable[None]],
        send_quietly: Callable[[str, Message], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        free: Callable[[QueryId], None],
        start_execution: Callable[[QueryExecute, PlanLayout, ResultChannel | None], QueryExecution],
    ) -> None:
        self.member_id = member_id
        self.config = config
        self.directory = directory
        self.fragments = fragments
        self.registry = registry
        self._new_id = new_id
        self._send = send  # raises ShardexError when the link fails
        self._send_quietly = send_quietly  # logs a failure instead
        self._spawn = spawn
        self._free = free  # stop the local execution, tombstone the query
        self._start_execution = start_execution

    def start(
        self,
        plan: QueryPlan,
        parameters: list[Any] | dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        window: int | None = None,
    ) -> QueryResult:
        """Start ``plan`` on its participants now (``QueryService.execute``); rows come from
        the returned result. Raises as ``execute`` says, before anything is sent."""
        layout = layout_plan(plan, self.member_id)
        for f in plan.fragments:
            self.fragments.get(f.kind)
        window = self.config.window if window is None else window
        timeout = self.config.timeout if timeout is None else timeout
        if window < MIN_WINDOW:
            raise ShardexError(
                f"credit window {window} is below {MIN_WINDOW} bytes",
                code=ErrorCode.BAD_REQUEST,
                details={"value": window, "hint": f"use a window >= {MIN_WINDOW}"},
            )
        if not timeout > 0:
            raise ShardexError(
                f"query timeout must be positive, got {timeout}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": timeout, "hint": "seconds, > 0"},
            )
        for p in layout.participants:
            if p != self.member_id and (
                self.directory.is_down(p) or self.directory.address_of(p) is None
            ):
                raise NodeUnavailable(
                    f"participant {p} is down or unknown; the query was not started",
                    details={"value": p, "hint": "plan over live members"},
                )
        q = self._new_id()
        msg = QueryExecute(
            query_id=q,
            participants=list(layout.participants),
            plan=plan,
            parameters=parameters if parameters is not None else [],
            timeout=timeout,
            window=window,
        )
        channel = ResultChannel(self.config.result_capacity)
        iq = InitiatedQuery(q, layout.participants, timeout, channel)
        self.registry.initiated[q] = iq  # before any execute leaves: check must find it
        iq.timer = asyncio.get_running_loop().call_later(timeout, self._on_timeout, q)
        self._start_execution(msg, layout, channel)
        for p in layout.participants:
            if p != self.member_id:
                self._spawn(self._send_execute(p, msg))
        return QueryResult(q, channel, close=lambda: self._close_query(q))

    async def _send_execute(self, member: str, msg: QueryExecute) -> None:
        try:
            await self._send(member, msg)
        except ShardexError as e:
            self.cancel(
                msg.query_id,
                cancelled(
                    f"could not start query {msg.query_id} on {member}: {e.message}",
                    "start_failed",
                    member=member,
                    cause=e.code.value,
                ),
                self.member_id,
            )

    async def _close_query(self, q: QueryId) -> None:
        self.cancel(q, cancelled(f"query {q} closed by the caller", "closed"), self.member_id)

    def _on_timeout(self, q: QueryId) -> None:
        iq = self.registry.initiated.get(q)
        if iq is None:
            return
        iq.timer = None
        self.cancel(
            q,
            cancelled(
                f"query {q} timed out after {iq.timeout}s",
                "timeout",
                timeout=iq.timeout,
                query_id=str(q),
                hint="raise the query timeout or make the query cheaper",
            ),
            self.member_id,
        )

    def cancel(self, q: QueryId, error: ShardexError, cancel_initiator: str) -> None:
        """The initiator's half of cancel: broadcast once, fail the caller's result, free."""
        reg = self.registry
        iq = reg.initiated.get(q)
        if iq is None or iq.cancelled:
            reg.stats["cancels_ignored"] += 1
            return
        iq.cancelled = True
        msg = QueryCancel(
            query_id=q,
            cancel_initiator=cancel_initiator,
            code=error.code.value,
            message=error.message,
            details=wire_details(error.details),
        )
        for p in iq.participants:
            if p not in (self.member_id, cancel_initiator) and not self.directory.is_down(p):
                self._spawn(self._send_quietly(p, msg))
        iq.result.fail(error)
        iq.end()
        del reg.initiated[q]
        self._free(q)

    def complete(self, q: QueryId, early: bool) -> None:
        """The root fragment finished: the caller has every row. If it finished before its
        inputs did (a LIMIT), tell the participants still running to stop."""
        iq = self.registry.initiated.pop(q, None)
        if iq is None:
            return
        iq.end()
        self._free(q)
        if early:
            msg = QueryCancel(
                query_id=q,
                cancel_initiator=self.member_id,
                code=ErrorCode.QUERY_CANCELLED.value,
                message=f"query {q} finished",
                details={"reason": "finished"},
            )
            for p in iq.participants:
                if p != self.member_id and not self.directory.is_down(p):
                    self._spawn(self._send_quietly(p, msg))

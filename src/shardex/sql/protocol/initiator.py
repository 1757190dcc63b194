"""The initiator's role: start a query on every participant, time it out, cancel it once
(the broadcast half of cancel), complete it, and answer checks from its bookkeeping.

``InitiatorRole`` is a mixin of ``QueryService``: it shares the service's registry, links
and helpers (declared below for type checkers) and keeps the initiator's rules in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardex.api.query_ids import QueryId
from shardex.api.sql_protocol import QueryCancel, QueryExecute, QueryPlan
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.net.messages import Message
from shardex.sql.protocol.flow import MIN_WINDOW
from shardex.sql.protocol.fragments import FragmentRegistry
from shardex.sql.protocol.plan_layout import PlanLayout, layout_plan
from shardex.sql.protocol.results import QueryResult, ResultChannel

if TYPE_CHECKING:
    from shardex.sql.protocol.config import MemberDirectory, ProtocolConfig
    from shardex.sql.protocol.execution import QueryExecution
    from shardex.sql.protocol.registry import QueryRegistry

__all__ = ["InitiatedQuery", "InitiatorRole", "cancelled", "wire_details"]


def cancelled(message: str, reason: str, **details: Any) -> ShardexError:
    return ShardexError(
        message, code=ErrorCode.QUERY_CANCELLED, details={"reason": reason, **details}
    )


def wire_details(details: dict[str, Any]) -> dict[str, Any]:
    """Details that msgpack can carry (a fragment may put anything in its error)."""
    plain = (str, int, float, bool, type(None))
    return {str(k): v if isinstance(v, plain) else repr(v) for k, v in details.items()}


@dataclass
class InitiatedQuery:
    """The initiator's bookkeeping for one query it coordinates."""

    query_id: QueryId
    participants: tuple[str, ...]
    timeout: float
    result: ResultChannel
    timer: asyncio.TimerHandle | None = None
    # Set by the first cancel: the broadcast goes out once, whoever else asks afterwards.
    cancelled: bool = False

    def end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class InitiatorRole:
    if TYPE_CHECKING:
        member_id: str
        name: str
        config: ProtocolConfig
        directory: MemberDirectory
        fragments: FragmentRegistry
        registry: QueryRegistry
        _stopping: bool
        _new_id: Callable[[], QueryId]

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
        async def _send(self, member: str, msg: Message) -> None: ...
        async def _send_quietly(self, member: str, msg: Message) -> None: ...
        def _free(self, q: QueryId) -> None: ...
        def request_cancel(self, q: QueryId, error: ShardexError) -> None: ...
        def _start_execution(
            self, msg: QueryExecute, layout: PlanLayout, result: ResultChannel | None
        ) -> QueryExecution: ...

    async def execute(
        self,
        plan: QueryPlan,
        parameters: list[Any] | dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        window: int | None = None,
    ) -> QueryResult:
        """Start ``plan`` on its participants now; rows come from the returned result.

        Raises ``BAD_REQUEST`` (bad plan, unknown fragment kind, window or timeout out of
        range) or ``NODE_UNAVAILABLE`` (a participant is down) before anything is sent."""
        if self._stopping:
            raise NodeUnavailable(f"member {self.name} is stopping")
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
            self.request_cancel(
                msg.query_id,
                cancelled(
                    f"could not start query {msg.query_id} on {member}: {e.message}",
                    "start_failed",
                    member=member,
                    cause=e.code.value,
                ),
            )

    async def _close_query(self, q: QueryId) -> None:
        self._initiator_cancel(
            q, cancelled(f"query {q} closed by the caller", "closed"), self.member_id
        )

    def _on_timeout(self, q: QueryId) -> None:
        iq = self.registry.initiated.get(q)
        if iq is None:
            return
        iq.timer = None
        self._initiator_cancel(
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

    def _initiator_cancel(self, q: QueryId, error: ShardexError, cancel_initiator: str) -> None:
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

    def _complete(self, q: QueryId, early: bool) -> None:
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

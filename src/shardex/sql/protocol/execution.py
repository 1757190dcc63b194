"""One query on one member: the local fragment instances with their inboxes and outboxes.

Created when the ``execute`` message arrives (on the initiator: before any is sent) and
started at once. The service is told when every local fragment has finished
(``on_done(execution, None)``) or when one failed (``on_done(execution, error)``); it then
frees the execution (and, on failure, cancels the query through the initiator).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pyarrow as pa

from shardex.api.query_ids import QueryId
from shardex.api.sql_protocol import FragmentSpec, QueryBatch, QueryExecute, QueryFlowControl
from shardex.errors import ErrorCode, ShardexError
from shardex.net.messages import Message
from shardex.sql.protocol.flow import ExchangeMeter, Inbox, Outbox
from shardex.sql.protocol.fragments import FragmentContext, FragmentRegistry
from shardex.sql.protocol.plan_layout import BROADCAST, HASH, PlanLayout
from shardex.sql.protocol.results import ResultChannel

__all__ = ["QueryExecution"]

log = logging.getLogger(__name__)

DoneCallback = Callable[["QueryExecution", ShardexError | None], None]


def as_query_error(exc: BaseException, fragment: FragmentSpec, member: str) -> ShardexError:
    where = {"fragment": fragment.fragment_id, "kind": fragment.kind, "member": member}
    if isinstance(exc, ShardexError):
        return ShardexError(exc.message, code=exc.code, details={**exc.details, **where})
    return ShardexError(
        f"fragment {fragment.kind} on {member} failed: {type(exc).__name__}: {exc}",
        code=ErrorCode.INTERNAL,
        details={**where, "exception": type(exc).__name__},
    )


def stray_cancel(fragment: FragmentSpec, member: str) -> ShardexError:
    log.error("fragment %s on %s ended cancelled without a stop", fragment.kind, member)
    return ShardexError(
        f"fragment {fragment.kind} on {member} was cancelled while its query ran",
        code=ErrorCode.INTERNAL,
        details={"reason": "fragment_cancelled", "hint": "a bug: see the member's log"},
    )


class QueryExecution:
    def __init__(
        self,
        *,
        msg: QueryExecute,
        layout: PlanLayout,
        member: str,
        fragments: FragmentRegistry,
        send: Callable[[str, Message], Awaitable[None]],
        grant: Callable[[str, QueryFlowControl], None],
        meter: ExchangeMeter,
        result: ResultChannel | None,
        on_done: DoneCallback,
    ) -> None:
        self.query_id: QueryId = msg.query_id
        self.msg = msg
        self.layout = layout
        self.member = member
        self.participants = layout.participants
        self._registry = fragments
        self._result = result
        self._on_done = on_done
        self.local = [f for f in msg.plan.fragments if member in f.members]
        self.inboxes: dict[int, Inbox] = {}
        # Per output edge, one outbox per member of the reader, in its ``members`` order.
        self.outboxes: dict[int, list[Outbox]] = {}
        for f in self.local:
            for e in f.inputs:
                self.inboxes[e] = Inbox(
                    query_id=self.query_id,
                    edge_id=e,
                    receiver=member,
                    senders=layout.edges[e].senders,
                    window=msg.window,
                    grant=lambda sender, limit, e=e: grant(
                        sender,
                        QueryFlowControl(
                            query_id=self.query_id, edge_id=e, receiver=member, credit_limit=limit
                        ),
                    ),
                    meter=meter,
                )
            if f.output is not None:
                self.outboxes[f.output] = [
                    Outbox(
                        query_id=self.query_id,
                        edge_id=f.output,
                        sender=member,
                        receiver=receiver,
                        window=msg.window,
                        send=send,
                        meter=meter,
                    )
                    for receiver in layout.edges[f.output].receivers
                ]
        self._tasks: dict[asyncio.Task[None], FragmentSpec] = {}
        self.finished = False
        # The root fragment finished before everything feeding it did (a LIMIT): the
        # initiator then stops the participants still running.
        self.early = False

    def __repr__(self) -> str:
        return f"<QueryExecution {self.query_id} on {self.member}, {len(self._tasks)} running>"

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for f in self.local:
            task = loop.create_task(self._run(f), name=f"sql {self.query_id} f{f.fragment_id}")
            self._tasks[task] = f
            task.add_done_callback(self._task_done)

    @property
    def inputs_complete(self) -> bool:
        return all(inbox.complete for inbox in self.inboxes.values())

    def on_batch(self, msg: QueryBatch) -> None:
        inbox = self.inboxes.get(msg.edge_id)
        if inbox is None:
            raise ShardexError(
                f"batch for edge {msg.edge_id}, which no fragment on {self.member} reads",
                code=ErrorCode.PROTOCOL_ERROR,
                details={"query_id": str(self.query_id), "edge": msg.edge_id},
            )
        inbox.on_batch(msg)

    def on_flow_control(self, msg: QueryFlowControl) -> None:
        for outbox in self.outboxes.get(msg.edge_id, ()):
            if outbox.receiver == msg.receiver:
                outbox.on_flow_control(msg.credit_limit)

    def stop(self) -> None:
        """Cancel every local fragment (no callback follows)."""
        self.finished = True
        for task in list(self._tasks):
            task.cancel()

    async def _run(self, f: FragmentSpec) -> None:
        inputs: dict[int, AsyncIterator[pa.RecordBatch]] = {
            e: self.inboxes[e].batches() for e in f.inputs
        }
        outboxes = self.outboxes.get(f.output, []) if f.output is not None else []
        ctx = FragmentContext(
            query_id=self.query_id,
            member_id=self.member,
            fragment=f,
            participants=self.participants,
            parameters=self.msg.parameters,
            inputs=inputs,
            partitions=len(outboxes) if f.exchange == HASH else 1,
            by_sender=lambda e: [
                self.inboxes[e].batches_from(s) for s in self.layout.edges[e].senders
            ],
        )
        produce = self._registry.get(f.kind)(ctx)
        if f.output is None:
            assert self._result is not None, "the root fragment runs on the initiator"
            async for batch in produce:
                await self._result.put(batch)  # type: ignore[arg-type]
            self._result.finish()
        else:
            await _send_all(produce, outboxes, f)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        f = self._tasks.pop(task, None)
        if self.finished or f is None:
            return
        # Only ``stop`` cancels a fragment, and it sets ``finished`` first: a fragment that
        # ends cancelled otherwise (a CancelledError from something it awaited) sent no end
        # of its stream, so its readers would wait for the query's timeout. It fails the
        # query instead.
        exc = stray_cancel(f, self.member) if task.cancelled() else task.exception()
        if exc is not None:
            self.finished = True
            self.stop()
            self._on_done(self, as_query_error(exc, f, self.member))
        elif f.output is None:
            # The root is done: the caller has every row, whatever else still runs here.
            self.early = bool(self._tasks) or not self.inputs_complete
            self.stop()
            self._on_done(self, None)
        elif not self._tasks:
            self.finished = True
            self._on_done(self, None)


async def _send_all(produce: AsyncIterator[Any], outboxes: list[Outbox], f: FragmentSpec) -> None:
    """A fragment's output into its edge's streams: every batch to the one receiver of a
    gather or to each receiver of a broadcast; a hash fragment's ``(partition, batch)`` to
    the receiver it names. Per stream one batch is held back, so the last one travels with
    the end of the stream. A held batch waits only for the producer's next step (fragments
    are a DAG: none waits on its own consumer); a broadcast waits for the slowest reader."""
    held: list[pa.RecordBatch | None] = [None] * len(outboxes)

    async def put(i: int, batch: pa.RecordBatch) -> None:
        before = held[i]
        if before is not None:
            await outboxes[i].put(before)
        held[i] = batch

    async for item in produce:
        if f.exchange == HASH:
            part, batch = item
            if not (isinstance(part, int) and 0 <= part < len(outboxes)):
                raise ShardexError(
                    f"fragment {f.kind} sent rows to partition {part!r} of {len(outboxes)}",
                    code=ErrorCode.INTERNAL,
                    details={"value": repr(part), "hint": "0 <= partition < ctx.partitions"},
                )
            await put(part, batch)
        elif f.exchange == BROADCAST:
            for i in range(len(outboxes)):
                await put(i, item)
        else:
            await put(0, item)
    for outbox, last in zip(outboxes, held, strict=True):
        await outbox.finish(last)

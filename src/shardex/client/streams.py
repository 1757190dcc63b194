"""Change streams in the client: the async consumer and the synchronous iterator around it.

``ks.stream(partition, from_seqno, uuid, end_seqno, follow)`` yields ``SnapshotMarker`` and
``Change`` objects (the engine's own types) in seqno order. The node sends batches only as
long as it holds credit; the consumer returns one credit per batch it takes off its inbox
(``shardex.net.credit_stream``), so at most ``credit`` batches wait in the client, however
slow the consumer is.

Failures end the iterator with the error: ROLLBACK (``details["rollback_seqno"]``) when the
(uuid, seqno) is not in the partition's history, NOT_MY_PARTITION if the partition moved away
mid-stream, CONNECTION_CLOSED if the owner died. Resuming is the consumer's decision: open a
new stream from the last seqno and uuid it applied (``ChangeStream.position``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from shardex.api.data import (
    CancelStream,
    HighSeqnos,
    HighSeqnosReply,
    OpenStream,
    StreamBatch,
    StreamCredit,
    StreamEnd,
    StreamOpened,
)
from shardex.api.records import Change, SnapshotMarker
from shardex.client.routing import DataRouter
from shardex.errors import ShardexError
from shardex.net import Connection

T = TypeVar("T")
StreamItem = SnapshotMarker | Change
DEFAULT_CREDIT = 4


class RemoteStream:
    """One open stream (async side)."""

    def __init__(self, router: DataRouter, keyspace: str, partition: int) -> None:
        self._router = router
        self.keyspace = keyspace
        self.partition = partition
        self._inbox = router.streams.open()
        self.stream_id = self._inbox.stream_id
        self.opened: StreamOpened | None = None
        self.done = False

    async def open(
        self,
        from_seqno: int,
        uuid: int | None,
        end_seqno: int | None,
        follow: bool,
        credit: int = DEFAULT_CREDIT,
        max_items: int = 1000,
    ) -> StreamOpened:
        if uuid is None:
            # "Whatever branch the partition is on now": no rollback check from this side.
            uuid = 0 if from_seqno == 0 else await self._current_uuid()
        msg = OpenStream(
            stream_id=self.stream_id,
            keyspace=self.keyspace,
            partition=self.partition,
            from_seqno=from_seqno,
            uuid=uuid,
            end_seqno=end_seqno,
            follow=follow,
            credit=credit,
            max_items=max_items,
        )
        try:
            self.opened = await self._router.to_partition(
                self.keyspace,
                self.partition,
                msg,
                StreamOpened,
                idempotent=False,
                on_conn=self._watch,
            )
        except BaseException:
            self._finish()
            raise
        return self.opened

    async def _current_uuid(self) -> int:
        reply = await self._router.to_partition(
            self.keyspace,
            self.partition,
            HighSeqnos(keyspace=self.keyspace, partitions=[self.partition]),
            HighSeqnosReply,
            idempotent=True,
        )
        entry = reply.entries.get(self.partition)
        return 0 if entry is None else entry[1]

    def _watch(self, conn: Connection) -> None:
        self._inbox.attach(conn)

    async def next_batch(self, timeout: float | None = None) -> list[StreamItem] | None:
        """The next batch of items, ``[]`` if ``timeout`` passed first, None at the end."""
        if self.done:
            return None
        try:
            msg = await asyncio.wait_for(self._inbox.next_msg(), timeout)
        except TimeoutError:
            return []
        if isinstance(msg, StreamEnd):
            self._finish()
            if msg.error is not None:
                raise ShardexError.from_wire(msg.error.code, msg.error.message, msg.error.details)
            return None
        batches = self._inbox.credit_due()
        conn = self._inbox.conn
        if batches and conn is not None and not conn.closed:
            with contextlib.suppress(ShardexError):
                await conn.send(StreamCredit(stream_id=self.stream_id, batches=batches))
        return _items(self.partition, msg)

    async def cancel(self) -> None:
        if self.done:
            return
        self._finish()
        conn = self._inbox.conn
        if conn is not None and not conn.closed:
            # A request, not a one-way cancel: the opener learns the node stopped the stream.
            with contextlib.suppress(ShardexError):
                await conn.request(CancelStream(stream_id=self.stream_id), 5.0)

    def _finish(self) -> None:
        self.done = True
        self._inbox.finish()


def _items(partition: int, batch: StreamBatch) -> list[StreamItem]:
    out: list[StreamItem] = []
    if batch.marker is not None:
        start, end, uuid, backfill = batch.marker
        out.append(SnapshotMarker(partition, start, end, uuid, backfill))
    for seqno, docid, op, cas, body, flags, expiry in batch.changes:
        out.append(Change(partition, seqno, docid, op, cas, body, flags, expiry))
    return out


class ChangeStream:
    """Synchronous iterator over a ``RemoteStream`` (what ``Keyspace.stream`` returns).

    ``position`` is (seqno, uuid) of the last item yielded: where to resume. Use it as a
    context manager (or call ``close``) to cancel a stream that was not read to its end."""

    def __init__(
        self,
        remote: RemoteStream,
        run: Callable[[Coroutine[Any, Any, Any]], Any],
        opened: StreamOpened,
        from_seqno: int,
    ) -> None:
        self._remote = remote
        self._run = run
        self.opened = opened
        self.position: tuple[int, int] = (from_seqno, opened.uuid)
        self._pending: collections.deque[StreamItem] = collections.deque()

    @property
    def partition(self) -> int:
        return self._remote.partition

    def __iter__(self) -> Iterator[StreamItem]:
        while True:
            item = self.next(timeout=None)
            if item is None:
                return
            yield item

    def next(self, timeout: float | None = None) -> StreamItem | None:
        """The next item; None at the end of the stream or when ``timeout`` passes first
        (then ``done`` tells which)."""
        while not self._pending:
            batch = self._run(self._remote.next_batch(timeout))
            if batch is None:
                return None
            if not batch and timeout is not None:
                return None
            self._pending.extend(batch)
        item = self._pending.popleft()
        if isinstance(item, SnapshotMarker):
            self.position = (self.position[0], item.uuid)
        else:
            self.position = (item.seqno, self.position[1])
        return item

    @property
    def done(self) -> bool:
        return self._remote.done and not self._pending

    def close(self) -> None:
        self._run(self._remote.cancel())

    def __enter__(self) -> ChangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

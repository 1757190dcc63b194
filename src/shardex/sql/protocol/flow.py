"""Exchanges with credit-based flow control: the sender's ``Outbox``, the receiver's ``Inbox``
and the ``ExchangeMeter`` that measures bytes in flight.

A stream is ``(query, edge, sender member, receiver member)``: a gather edge has one
stream per sender, a broadcast or hash edge one per sender and reading member. Credits are
bytes of Arrow IPC payload. The receiver grants a cumulative ``credit_limit`` = bytes its
consumer has taken + ``window``, so whatever is in flight, ``sent - consumed <= window`` on
every stream: that is the invariant the simulation checks (``ExchangeMeter.max_in_flight``).

Grants go out each time the consumer has taken half a window since the last grant. The
sender cuts batches into pieces of at most half a window, which makes that rule deadlock-free:
a blocked sender has more than half a window unconsumed, so draining it crosses the threshold.

The accounting is ``shardex.net.credit_stream``'s (``SendWindow``, ``ReceiveWindow``), in
bytes rather than the messages change streams and scans count: an Arrow batch's size varies
by orders of magnitude, so only bytes bound what a stream holds. Grants are cumulative
limits, not increments, because they travel between members over links that may be
re-established: a repeated or reordered grant then changes nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pyarrow as pa

from shardex.api.query_ids import QueryId
from shardex.api.sql_protocol import QueryBatch
from shardex.errors import ErrorCode, ShardexError
from shardex.net.credit_stream import ReceiveWindow, SendWindow
from shardex.net.messages import Message
from shardex.sql.protocol.batches import decode_batch, split_to_fit

__all__ = ["MIN_WINDOW", "ExchangeMeter", "Inbox", "Outbox", "StreamKey", "StreamStats"]

StreamKey = tuple[QueryId, int, str, str]  # (query, edge, sender member, receiver member)

# An Arrow IPC stream of one small row is a few hundred bytes; half the window must hold one.
MIN_WINDOW = 4096


@dataclass
class StreamStats:
    window: int
    sent: int = 0
    consumed: int = 0
    max_in_flight: int = 0  # max of sent - consumed; exact when sender and receiver share a meter
    max_sender_bound: int = 0  # max of sent - (credit limit - window): what the sender can vouch
    stalls: int = 0  # times the sender waited for credits


class ExchangeMeter:
    """Bytes per stream. Give one meter to every member of a simulation and ``max_in_flight``
    is the true peak of bytes sent but not yet consumed; on one real node it sees only its own
    side, and ``max_sender_bound`` is the measure that holds there."""

    def __init__(self) -> None:
        self.streams: dict[StreamKey, StreamStats] = {}

    def _stats(self, key: StreamKey, window: int) -> StreamStats:
        st = self.streams.get(key)
        if st is None:
            st = self.streams[key] = StreamStats(window)
        return st

    def on_sent(self, key: StreamKey, window: int, size: int, bound: int) -> None:
        st = self._stats(key, window)
        st.sent += size
        st.max_in_flight = max(st.max_in_flight, st.sent - st.consumed)
        st.max_sender_bound = max(st.max_sender_bound, bound)

    def on_stall(self, key: StreamKey, window: int) -> None:
        self._stats(key, window).stalls += 1

    def on_consumed(self, key: StreamKey, window: int, size: int) -> None:
        self._stats(key, window).consumed += size


def _violation(message: str, key: StreamKey, **details: object) -> ShardexError:
    q, edge, sender, receiver = key
    return ShardexError(
        message,
        code=ErrorCode.PROTOCOL_ERROR,
        details={
            "query_id": str(q),
            "edge": edge,
            "sender": sender,
            "receiver": receiver,
            **details,
        },
    )


class Outbox:
    """The sending end of one stream. ``put`` waits while credits are short (backpressure on
    the fragment that produces the rows); ``finish`` sends the ``last`` marker."""

    def __init__(
        self,
        *,
        query_id: QueryId,
        edge_id: int,
        sender: str,
        receiver: str,
        window: int,
        send: Callable[[str, Message], Awaitable[None]],
        meter: ExchangeMeter,
    ) -> None:
        self.key: StreamKey = (query_id, edge_id, sender, receiver)
        self.receiver = receiver
        self.window = window
        self._send_fn = send
        self._meter = meter
        # The initial credits both sides agree on: the window. No cap: grants are limits.
        self.credit = SendWindow(window)
        self.seq = 0
        self.finished = False

    @property
    def sent_bytes(self) -> int:
        return self.credit.sent

    @property
    def credit_limit(self) -> int:
        return self.credit.limit

    async def put(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return  # nothing to say; an empty batch would only spend credits
        for data in split_to_fit(batch, self.window // 2):
            await self._send(data, last=False)

    async def finish(self, batch: pa.RecordBatch | None = None) -> None:
        """End the stream; ``batch`` (the producer's last one) rides on the ``last`` message
        instead of a message of its own: a one-batch result is one message, not two."""
        pieces = split_to_fit(batch, self.window // 2) if batch and batch.num_rows else []
        for data in pieces[:-1]:
            await self._send(data, last=False)
        await self._send(pieces[-1] if pieces else b"", last=True)
        self.finished = True

    def on_flow_control(self, credit_limit: int) -> None:
        self.credit.raise_limit(credit_limit)  # limits only grow; an old one changes nothing

    def _stalled(self) -> None:
        self._meter.on_stall(self.key, self.window)

    async def _send(self, data: bytes, *, last: bool) -> None:
        size = len(data)
        credit = self.credit
        if not credit.take(size):
            await credit.spend(size, self._stalled)
        q, edge, sender, _ = self.key
        msg = QueryBatch(
            query_id=q,
            edge_id=edge,
            sender=sender,
            seq=self.seq,
            data=data,
            last=last,
            remaining_credits=credit.available,
        )
        self.seq += 1
        # Counted before the send: from here on the bytes are the network's.
        bound = credit.sent - (credit.limit - self.window)
        self._meter.on_sent(self.key, self.window, size, bound)
        await self._send_fn(self.receiver, msg)


class _InStream:
    """One sender's stream into an ``Inbox``: its order, what arrived, and its credit."""

    __slots__ = ("credit", "last", "next_seq", "queue", "received")

    def __init__(self, window: int) -> None:
        self.next_seq = 0
        self.received = 0
        self.last = False
        self.credit = ReceiveWindow(window, every=window // 2)
        # Batches not consumed yet: (arrival number on the inbox, bytes, batch).
        self.queue: deque[tuple[int, int, pa.RecordBatch]] = deque()


class Inbox:
    """The receiving end of one edge on one member of its reader (``receiver``): the streams
    of every sender, merged in arrival order. ``on_batch`` is called by the message handler
    (never blocks); the consuming fragment iterates ``batches()``; grants go out through
    ``grant``."""

    def __init__(
        self,
        *,
        query_id: QueryId,
        edge_id: int,
        receiver: str,
        senders: tuple[str, ...],
        window: int,
        grant: Callable[[str, int], None],
        meter: ExchangeMeter,
    ) -> None:
        self.query_id = query_id
        self.edge_id = edge_id
        self.receiver = receiver
        self.window = window
        self._grant = grant
        self._meter = meter
        self._streams = {s: _InStream(window) for s in senders}
        self._arrivals = 0
        self._ready = asyncio.Event()

    @property
    def complete(self) -> bool:
        """Every sender's ``last`` batch has arrived."""
        return all(s.last for s in self._streams.values())

    def on_batch(self, msg: QueryBatch) -> None:
        """Take one batch; raises ``PROTOCOL_ERROR`` for a batch the stream cannot carry
        (unknown sender, a gap or repeat in ``seq``, after ``last``, over the credits)."""
        key = (self.query_id, self.edge_id, msg.sender, self.receiver)
        st = self._streams.get(msg.sender)
        if st is None:
            raise _violation(f"batch from {msg.sender}, not a sender of edge {self.edge_id}", key)
        if st.last:
            raise _violation("batch after the stream's last batch", key, seq=msg.seq)
        if msg.seq != st.next_seq:
            raise _violation(
                f"batch {msg.seq} where {st.next_seq} was expected (a batch was lost)",
                key,
                seq=msg.seq,
                expected=st.next_seq,
            )
        size = len(msg.data)
        limit = st.credit.limit
        if st.received + size > limit:
            raise _violation(
                f"sender exceeded its credits: {st.received + size} bytes > limit {limit}",
                key,
                limit=limit,
            )
        batch = decode_batch(msg.data) if size else None
        st.next_seq += 1
        st.received += size
        st.last = msg.last
        if batch is not None:
            st.queue.append((self._arrivals, size, batch))
            self._arrivals += 1
        self._ready.set()

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        """Every sender's batches, merged in arrival order."""
        while True:
            heads = [(st.queue[0][0], s) for s, st in self._streams.items() if st.queue]
            if heads:
                yield self._take(min(heads)[1])
            elif self.complete:
                return
            else:
                await self._wait()

    async def batches_from(self, sender: str) -> AsyncIterator[pa.RecordBatch]:
        """One sender's batches, in its order (a reader that merges sorted runs takes each
        sender's alone; the others' wait, within their windows, until it reads them)."""
        st = self._streams[sender]
        while True:
            if st.queue:
                yield self._take(sender)
            elif st.last:
                return
            else:
                await self._wait()

    async def _wait(self) -> None:
        # Every waiter wakes on any arrival and looks at its own queue again: no arrival
        # is missed, whichever consumer clears the event.
        self._ready.clear()
        await self._ready.wait()

    def _take(self, sender: str) -> pa.RecordBatch:
        _, size, batch = self._streams[sender].queue.popleft()
        self._consumed(sender, size)
        return batch

    def _consumed(self, sender: str, size: int) -> None:
        st = self._streams[sender]
        granted = st.credit.consume(size)
        key = (self.query_id, self.edge_id, sender, self.receiver)
        self._meter.on_consumed(key, self.window, size)
        # After the last batch nothing more comes: the new limit is nobody's business.
        if granted and not st.last:
            self._grant(sender, st.credit.limit)

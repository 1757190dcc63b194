"""The credit-stream layer alone (``shardex.net.credit_stream``): the two windows' accounting,
a sender waiting for credit, the end message after success, error and cancel, and the
receiving side's inbox, credit return and dead-connection end, over a fake connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import pytest

from shardex.errors import ConnectionClosed, ErrorCode, ShardexError
from shardex.net.credit_stream import (
    Inboxes,
    InStream,
    OutStream,
    OutStreams,
    ReceiveWindow,
    SendWindow,
)
from shardex.net.messages import Message

pytestmark = pytest.mark.timeout(20)


class Item(Message, tag="test.credit.Item"):
    stream_id: int
    n: int


class Done(Message, tag="test.credit.Done"):
    stream_id: int
    code: str | None = None


class Credit(Message, tag="test.credit.Credit"):
    stream_id: int
    amount: int


class Stop(Message, tag="test.credit.Stop"):
    stream_id: int


class FakeConn:
    """What the layer uses of a ``Connection``: ``send``, close callbacks, ``closed``."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.closed = False
        self.close_reason: ShardexError | None = None
        self._callbacks: list[Callable[[Any], None]] = []

    async def send(self, msg: Message) -> None:
        if self.closed:
            raise ConnectionClosed("closed")
        self.sent.append(msg)

    def add_close_callback(self, cb: Callable[[Any], None]) -> None:
        self._callbacks.append(cb)

    def die(self) -> None:
        self.closed = True
        self.close_reason = ConnectionClosed("peer went away")
        for cb in self._callbacks:
            cb(self)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# --- the windows -------------------------------------------------------------------------


def test_send_window_counts_and_caps_relative_grants() -> None:
    w = SendWindow(2, cap=3)
    assert w.take() and w.take() and not w.take()
    assert w.available == 0
    w.grant(10)  # capped: never more than 3 at hand
    assert w.available == 3
    w.grant(0)
    w.grant(-5)  # nothing for a non-positive grant
    assert w.available == 3
    assert w.take(3) and not w.take()


def test_send_window_cumulative_limits_only_grow() -> None:
    w = SendWindow(100)
    assert w.take(60) and not w.take(50)
    w.raise_limit(150)
    w.raise_limit(120)  # an older, smaller limit changes nothing
    assert w.limit == 150 and w.take(50) and w.available == 40


async def test_a_sender_waits_for_credit_and_counts_its_stalls() -> None:
    w = SendWindow(1)
    stalls: list[int] = []
    assert w.take()
    waiter = asyncio.create_task(w.spend(1, lambda: stalls.append(1)))
    await _settle()
    assert not waiter.done() and w.sent == 1 and stalls == [1]
    w.grant(1)
    await _settle()
    assert waiter.done() and w.sent == 2 and w.available == 0


def test_receive_window_grants_per_message() -> None:
    r = ReceiveWindow(4)
    assert [r.consume() for _ in range(5)] == [1, 1, 1, 1, 1]
    assert r.limit == 5 + 4  # consumed + window: the sender may have sent that many


def test_receive_window_grants_every_half_window_of_bytes() -> None:
    r = ReceiveWindow(100, every=50)
    assert r.consume(30) == 0 and r.limit == 100
    assert r.consume(30) == 60 and r.limit == 160  # 60 consumed + window
    assert r.consume(49) == 0
    assert r.consume(1) == 50 and r.limit == 210


def test_windows_keep_sent_minus_consumed_within_the_window() -> None:
    """Sender and receiver driven together (bytes, half-window grants): whatever the sizes,
    what is in flight never exceeds the window, and the sender is never stuck."""
    window = 64
    send, recv = SendWindow(window), ReceiveWindow(window, every=window // 2)
    in_flight: list[int] = []
    sizes = [5, 31, 32, 1, 17, 32, 32, 9, 30, 2] * 20
    for size in sizes:
        while not send.take(size):
            assert in_flight, "sender blocked with nothing left to consume"
            granted = recv.consume(in_flight.pop(0))
            if granted:
                send.raise_limit(recv.limit)
        in_flight.append(size)
        assert send.sent - recv.consumed <= window


# --- the sending side --------------------------------------------------------------------


def _outstreams(enrich: Callable[[ShardexError], ShardexError] | None = None) -> OutStreams[Any]:
    def end(stream: OutStream, error: ShardexError | None) -> Message:
        return Done(stream_id=stream.stream_id, code=None if error is None else error.code.value)

    def duplicate(stream_id: int) -> ShardexError:
        return ShardexError(f"stream {stream_id} is open", code=ErrorCode.BAD_REQUEST)

    return OutStreams(end=end, duplicate=duplicate, enrich=enrich)


async def test_a_stream_sends_its_credit_then_waits_and_ends_once() -> None:
    conn = FakeConn()
    streams = _outstreams()

    async def produce(s: OutStream) -> None:
        for n in range(5):
            await s.send_message(Item(stream_id=s.stream_id, n=n))

    stream = streams.start_stream(OutStream(conn, 7, 2, cap=8), produce, name="t", label="t")  # type: ignore[arg-type]
    await _settle()
    assert [m.n for m in conn.sent] == [0, 1]  # type: ignore[attr-defined]
    assert streams.open_streams == 1 and stream.credit.available == 0
    streams.grant(conn, 7, 2)  # type: ignore[arg-type]
    await _settle()
    assert [m.n for m in conn.sent] == [0, 1, 2, 3]  # type: ignore[attr-defined]
    streams.grant(conn, 7, 1)  # type: ignore[arg-type]
    await _settle()
    assert conn.sent[-1] == Done(stream_id=7) and len(conn.sent) == 6
    assert streams.open_streams == 0


async def test_a_duplicate_id_on_one_connection_is_refused() -> None:
    conn = FakeConn()
    streams = _outstreams()
    hold = asyncio.Event()

    async def produce(s: OutStream) -> None:
        await hold.wait()

    streams.start_stream(OutStream(conn, 1, 1, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    with pytest.raises(ShardexError) as info:
        streams.start_stream(OutStream(conn, 1, 1, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.BAD_REQUEST
    # The same id on another connection is another stream.
    streams.start_stream(OutStream(FakeConn(), 1, 1, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    assert streams.open_streams == 2
    await streams.close()
    assert streams.open_streams == 0


async def test_an_error_mid_stream_ends_it_with_the_error() -> None:
    conn = FakeConn()
    enriched: list[ShardexError] = []

    def enrich(e: ShardexError) -> ShardexError:
        enriched.append(e)
        return e

    streams = _outstreams(enrich)

    async def produce(s: OutStream) -> None:
        await s.send_message(Item(stream_id=s.stream_id, n=0))
        raise ShardexError("moved", code=ErrorCode.NOT_MY_PARTITION)

    streams.start_stream(OutStream(conn, 3, 4, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    await _settle()
    assert conn.sent == [Item(stream_id=3, n=0), Done(stream_id=3, code="NOT_MY_PARTITION")]
    assert len(enriched) == 1 and streams.open_streams == 0


async def test_a_bug_in_the_producer_ends_the_stream_as_internal() -> None:
    conn = FakeConn()
    streams = _outstreams()

    async def produce(s: OutStream) -> None:
        raise KeyError("oops")

    streams.start_stream(OutStream(conn, 3, 4, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    await _settle()
    assert conn.sent == [Done(stream_id=3, code="INTERNAL")]


async def test_cancel_stops_the_producer_and_sends_no_end() -> None:
    conn = FakeConn()
    streams = _outstreams()
    cancelled = asyncio.Event()

    async def produce(s: OutStream) -> None:
        try:
            while True:
                await s.send_message(Item(stream_id=s.stream_id, n=0))
        except asyncio.CancelledError:
            cancelled.set()
            raise

    streams.start_stream(OutStream(conn, 9, 1, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    await _settle()  # sent its one credit, now waiting for more
    streams.cancel(conn, 9)  # type: ignore[arg-type]
    await _settle()
    assert cancelled.is_set() and conn.sent == [Item(stream_id=9, n=0)]
    assert streams.open_streams == 0


async def test_a_closed_connection_cancels_its_streams_only() -> None:
    dead, alive = FakeConn(), FakeConn()
    streams = _outstreams()
    hold = asyncio.Event()

    async def produce(s: OutStream) -> None:
        await hold.wait()

    a = streams.start_stream(OutStream(dead, 1, 1, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    b = streams.start_stream(OutStream(alive, 1, 1, cap=4), produce, name="t", label="t")  # type: ignore[arg-type]
    dead.die()
    await _settle()
    assert a.task is not None and a.task.cancelled()
    assert b.task is not None and not b.task.done() and streams.open_streams == 1
    hold.set()
    await _settle()
    assert alive.sent == [Done(stream_id=1)] and dead.sent == []


# --- the receiving side ------------------------------------------------------------------


def _inboxes() -> Inboxes[InStream[Any]]:
    return Inboxes(
        new=InStream,
        key=attrgetter("stream_id"),
        lost=lambda sid, reason: Done(stream_id=sid, code=reason.code.value),
    )


async def test_messages_overtaking_the_reader_are_kept_in_order() -> None:
    inboxes = _inboxes()
    stream = inboxes.open()
    conn = FakeConn()
    stream.attach(conn)  # type: ignore[arg-type]
    router = inboxes.route(Item, Done)
    handler = router.lookup(Item)
    assert handler is not None
    await handler(Item(stream_id=stream.stream_id, n=1), conn)  # type: ignore[arg-type]
    await handler(Item(stream_id=stream.stream_id + 100, n=9), conn)  # type: ignore[arg-type]
    reader = asyncio.create_task(stream.next_msg())
    assert await reader == Item(stream_id=stream.stream_id, n=1)
    reader = asyncio.create_task(stream.next_msg())
    await _settle()
    assert not reader.done()  # waits for the next one (the unknown stream's was dropped)
    stream.deliver(Item(stream_id=stream.stream_id, n=2))
    assert await reader == Item(stream_id=stream.stream_id, n=2)


async def test_a_dead_connection_ends_its_streams_with_its_reason() -> None:
    inboxes = _inboxes()
    conn, other = FakeConn(), FakeConn()
    a, b, c = inboxes.open(), inboxes.open(), inboxes.open()
    a.attach(conn)  # type: ignore[arg-type]
    b.attach(conn)  # type: ignore[arg-type]
    c.attach(other)  # type: ignore[arg-type]
    waiting = asyncio.create_task(a.next_msg())
    await _settle()
    conn.die()
    assert await waiting == Done(stream_id=a.stream_id, code="CONNECTION_CLOSED")
    assert await b.next_msg() == Done(stream_id=b.stream_id, code="CONNECTION_CLOSED")
    assert not c._msgs


async def test_cancel_sends_the_cancel_once_and_stops_routing() -> None:
    inboxes = _inboxes()
    conn = FakeConn()
    stream = inboxes.open()
    stream.attach(conn)  # type: ignore[arg-type]
    await stream.cancel_with(Stop(stream_id=stream.stream_id))
    await stream.cancel_with(Stop(stream_id=stream.stream_id))  # ended: nothing more
    assert conn.sent == [Stop(stream_id=stream.stream_id)]
    assert stream.done and inboxes.get(stream.stream_id) is None
    conn.die()  # detached: the dead connection delivers nothing to it
    assert not stream._msgs


def test_a_stream_opened_off_the_loop_waits_on_the_loop_that_reads_it() -> None:
    """A synchronous caller opens the inbox in its own thread; its loop reads it later."""
    inboxes = _inboxes()
    stream = inboxes.open()  # no running loop here

    async def read() -> Message:
        reader = asyncio.create_task(stream.next_msg())
        await _settle()
        assert not reader.done()
        stream.deliver(Item(stream_id=stream.stream_id, n=5))
        return await reader

    assert asyncio.run(read()) == Item(stream_id=stream.stream_id, n=5)


def test_a_reader_returns_one_credit_per_message_it_takes() -> None:
    stream = _inboxes().open()
    assert [stream.credit_due() for _ in range(3)] == [1, 1, 1]

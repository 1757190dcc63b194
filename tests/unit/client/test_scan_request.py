"""The client's scan request and inbox, as the per-scan fast paths build them.

``build_request`` builds ``IndexScan`` positionally and ``to_user_spans`` skips the ABC checks
for lists and dicts: both must give exactly what the plain forms give (a continuation is bound
to a bound's text), and refuse what they refused. ``InStream``'s inbox is a deque and a
waiter instead of an ``asyncio.Queue``: blocks in order whether they come before or while the
reader waits, and a reader that gave up leaves the stream readable. ``IndexScanStarted.ts``
stays encoded until read, with the frame's bytes those of the plain field.
"""

from __future__ import annotations

import asyncio
import json
from types import MappingProxyType
from typing import Any

import pytest

from shardex.api.records import MutationResult
from shardex.api.scan import (
    IndexScan,
    IndexScanStarted,
    ScanBlock,
    ScanEnd,
    UserSpan,
    raw_ts,
    ts_of,
)
from shardex.api.scan_streams import Inboxes
from shardex.api.spans import to_user_spans
from shardex.client.scan import CREDIT, ScanResult, build_request
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.net.messages import Envelope, Kind, decode_frame, encode_frame


def _kwargs_form(**kw: Any) -> IndexScan:
    return IndexScan(
        scan_id=0,
        keyspace=kw["keyspace"],
        index=kw["index"],
        spans=to_user_spans(kw["spans"]),
        consistency=kw["consistency"],
        stability=kw["stability"],
        at=kw.get("at"),
        pinned=kw.get("pinned"),
        limit=kw["limit"],
        offset=kw["offset"],
        ordered=kw["ordered"],
        credit=CREDIT,
        timeout=kw["timeout"],
    )


def test_the_positional_request_is_the_keyword_one() -> None:
    spans = [{"low": ["Oslo", 30], "high": ["Oslo", 40], "inclusion": "low"}]
    got = build_request("users", "by_city", spans, "not_bounded", None, 100, 5, False, None, 7)
    want = _kwargs_form(
        keyspace="users",
        index="by_city",
        spans=spans,
        consistency="not_bounded",
        stability="none",
        limit=100,
        offset=5,
        ordered=False,
        timeout=7.0,
    )
    assert got == want and type(got.timeout) is float
    write = MutationResult(partition=3, seqno=9, uuid=77, cas=1)
    pinned = Timestamp({0: (4, 2)})
    got = build_request("ks", "ix", None, "at_plus", write, None, None, True, "query", 2.5, pinned)
    want = _kwargs_form(
        keyspace="ks",
        index="ix",
        spans=None,
        consistency="at_plus",
        stability="query",
        at={3: (9, 77)},
        pinned={0: (4, 2)},
        limit=None,
        offset=0,
        ordered=True,
        timeout=2.5,
    )
    assert got == want


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"limit": -1}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
        ({"limit": 2.0}, "limit must be an integer"),
        ({"offset": "3"}, "offset must be an integer"),
        ({"ordered": 1}, "ordered must be True or False"),
        ({"timeout": 0.0}, "timeout must be a positive number"),
        ({"timeout": True}, "timeout must be a positive number"),
        ({"timeout": "5"}, "timeout must be a positive number"),
    ],
)
def test_bad_scan_arguments_are_still_refused(change: dict[str, Any], fragment: str) -> None:
    args: dict[str, Any] = {"limit": 10, "offset": None, "ordered": True, "timeout": 30.0}
    args.update(change)
    with pytest.raises(ShardexError) as info:
        build_request(
            "ks", "ix", None, "not_bounded", None, args["limit"], args["offset"],
            args["ordered"], None, args["timeout"],
        )  # fmt: skip
    assert info.value.code is ErrorCode.BAD_REQUEST and fragment in info.value.message


BOUNDS: list[Any] = [
    [30],
    ["Oslo", 30],
    [None, True, False, -7, 2**70],
    ["a b~!"],
    ["Zürich"],  # non-ASCII: json's escapes, not msgspec's UTF-8
    ["tab\there"],  # not printable
    [1.5, 30],  # floats: json's form
    [[1, 2], {"a": 1}],
    ("Oslo", 30),  # any sequence, not only a list
]


@pytest.mark.parametrize("bound", BOUNDS, ids=repr)
def test_a_bound_is_the_text_json_dumps_writes(bound: Any) -> None:
    want = json.dumps(list(bound), allow_nan=False, separators=(",", ":"))
    (span,) = to_user_spans([{"low": bound, "high": bound}])
    assert span == UserSpan(want, want, "both")


def test_spans_in_other_mapping_and_sequence_types() -> None:
    want = [UserSpan("[1]", None, "high")]
    assert to_user_spans({"low": [1], "inclusion": "high"}) == want  # one span given bare
    assert to_user_spans((MappingProxyType({"low": [1], "inclusion": "high"}),)) == want
    with pytest.raises(ShardexError, match="unknown field"):
        to_user_spans([{"low": [1], "hgh": [2]}])


async def test_an_inbox_gives_blocks_in_order_before_and_while_its_reader_waits() -> None:
    inboxes = Inboxes()
    stream = inboxes.open()
    on_msg = inboxes.handlers().lookup(ScanBlock)
    await on_msg(ScanBlock(scan_id=stream.scan_id, entries=[b"a"]), None)
    assert stream.ready()
    assert await stream.next_block() == [b"a"]
    assert not stream.ready()
    reader = asyncio.ensure_future(stream.next_block())
    await asyncio.sleep(0)  # the reader now waits on its future
    assert not reader.done()
    await on_msg(ScanBlock(scan_id=stream.scan_id, entries=[b"b", b"c"]), None)
    async with asyncio.timeout(5):  # a reader never woken fails here, not by hanging
        assert await reader == [b"b", b"c"]
    # A reader that gives up (the scan's block timeout) leaves the stream readable.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await stream.next_block()
    await on_msg(ScanBlock(scan_id=stream.scan_id, entries=[b"d"]), None)
    await on_msg(ScanEnd(scan_id=stream.scan_id, rows=4), None)
    assert await stream.next_block() == [b"d"]
    assert await stream.next_block() is None
    assert stream.done and inboxes.get(stream.scan_id) is None  # detached at its end


async def test_a_stream_answered_in_its_reply_is_detached_at_once() -> None:
    inboxes = Inboxes()
    stream = inboxes.open()
    assert inboxes.get(stream.scan_id) is stream
    stream.put_head([b"x"], done=True)
    assert inboxes.get(stream.scan_id) is None
    assert stream.poll() == (True, [b"x"]) and stream.poll() == (True, None)


def test_the_reply_ts_is_kept_encoded_and_its_wire_bytes_are_unchanged() -> None:
    wire_ts = {p: (100 + p, 9_000_000_000 + p) for p in range(64)}
    for ts in (wire_ts, None):
        new = IndexScanStarted(scan_id=1, index_id="ix", desc=[False], ts=raw_ts(ts))
        # What a peer that sends the plain field writes (the field was ``WireTs | None``).
        old = IndexScanStarted(scan_id=1, index_id="ix", desc=[False], ts=ts)  # type: ignore[arg-type]
        frame = encode_frame(Envelope(Kind.RESPONSE, 7, new))
        assert frame == encode_frame(Envelope(Kind.RESPONSE, 7, old))
        got = decode_frame(frame).body
        assert isinstance(got, IndexScanStarted) and ts_of(got.ts) == ts
    assert ts_of(IndexScanStarted(scan_id=1, index_id="ix", desc=[]).ts) is None


def test_a_scan_result_decodes_its_ts_when_asked() -> None:
    started = IndexScanStarted(
        scan_id=1, index_id="ix", desc=[False], ts=raw_ts({3: (5, 6)}), done=True
    )
    result = ScanResult(_no_loop, _NoStream(), started, covering=True)
    assert result.ts == Timestamp({3: (5, 6)})
    assert result.ts is result.ts  # decoded once
    tips = IndexScanStarted(scan_id=1, index_id="ix", desc=[False], done=True)
    assert ScanResult(_no_loop, _NoStream(), tips, covering=True).ts is None


def _no_loop(coro: Any) -> Any:
    coro.close()
    raise AssertionError("no trip to the loop expected")


class _NoStream:
    done = True
    complete = True


class _Conn:
    """What ``Inboxes`` asks of a connection: close callbacks, and whether it is closed."""

    closed = False
    close_reason = None

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_close_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)


async def test_a_finished_scan_leaves_no_trace_in_its_connections_set() -> None:
    inboxes = Inboxes()
    conn = _Conn()
    ended, answered, live = inboxes.open(), inboxes.open(), inboxes.open()
    for stream in (ended, answered, live):
        stream.attach(conn)  # type: ignore[arg-type]
    await inboxes.handlers().lookup(ScanEnd)(ScanEnd(scan_id=ended.scan_id), conn)
    assert await ended.next_block() is None
    answered.put_head([b"x"], done=True)
    assert inboxes._by_conn[conn] == {live.scan_id}  # type: ignore[index]
    # The connection dies: the scan still listening ends with its error.
    conn.close_reason = ShardexError("gone", code=ErrorCode.CONNECTION_CLOSED)  # type: ignore[assignment]
    conn.callbacks[0](conn)
    with pytest.raises(ShardexError) as err:
        await live.next_block()
    assert err.value.code is ErrorCode.CONNECTION_CLOSED
    assert len(inboxes) == 0 and not inboxes._by_conn

"""A SQL statement's reply carries its stability TS encoded (``SqlStarted.ts``): the node
sends its snapshot's bytes, the client decodes them only when ``metrics.ts`` is read."""

from __future__ import annotations

import msgspec

from shardex.api.scan import NO_TS
from shardex.api.sql_exec import SqlStarted
from shardex.client.query import QueryMetrics
from shardex.core.timestamp import Timestamp
from shardex.net.messages import Envelope, Kind, decode_frame, encode_frame


def test_the_reply_ts_wire_bytes_are_those_of_the_plain_field() -> None:
    ts = Timestamp({p: (100 + p, 9_000_000_000 + p) for p in range(64)})
    for raw, plain in ((msgspec.Raw(ts.packed()), dict(ts.to_wire())), (NO_TS, None)):
        new = SqlStarted(stream_id=3, statement="select", ts=raw, rows=[b"r"], done=True)
        # What a node that sends the plain field writes (the field was ``WireTs | None``).
        old = SqlStarted(stream_id=3, statement="select", ts=plain, rows=[b"r"], done=True)  # type: ignore[arg-type]
        frame = encode_frame(Envelope(Kind.RESPONSE, 7, new))
        assert frame == encode_frame(Envelope(Kind.RESPONSE, 7, old))
        got = decode_frame(frame).body
        assert isinstance(got, SqlStarted) and bytes(got.ts) == bytes(raw)


def test_metrics_decode_the_ts_once_when_asked() -> None:
    ts = Timestamp({0: (5, 6), 7: (9, 10)})
    metrics = QueryMetrics(elapsed=0.1, result_count=1, bytes=10, packed_ts=ts.packed())
    assert metrics.ts == ts
    assert metrics.ts is metrics.ts  # decoded once
    assert QueryMetrics(elapsed=0.1, result_count=0, bytes=0).ts is None

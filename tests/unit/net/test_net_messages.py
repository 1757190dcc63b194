"""Typed messages, the tagged union and framing."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.errors import ErrorCode, ProtocolError
from shardex.net.messages import (
    TAG_FIELD,
    Ack,
    Envelope,
    ErrorReply,
    Kind,
    Message,
    Ping,
    UndecodableBody,
    decode_frame,
    encode_frame,
    registered_messages,
)


class MsgPut(Message):
    key: str
    value: bytes = b""
    tags: list[str] = msgspec.field(default_factory=list)


class MsgRenamed(Message, tag="msg.renamed.v1"):
    n: int


def test_protocol_messages_are_registered() -> None:
    reg = registered_messages()
    for name in ("Challenge", "AuthResponse", "AuthOk", "ErrorReply", "Ping", "Pong", "Ack"):
        assert name in reg
    assert reg["MsgPut"] is MsgPut
    assert reg["msg.renamed.v1"] is MsgRenamed
    assert "Message" not in reg  # the base is abstract


@pytest.mark.parametrize("kind", list(Kind))
def test_round_trip_every_kind(kind: Kind) -> None:
    env = Envelope(kind, 7, MsgPut(key="k", value=b"\x00\xff", tags=["a"]))
    assert decode_frame(encode_frame(env)) == env


def test_wire_shape_is_array_with_tagged_map() -> None:
    frame = encode_frame(Envelope(Kind.REQUEST, 3, MsgRenamed(n=5)))
    assert msgspec.msgpack.decode(frame) == [0, 3, {TAG_FIELD: "msg.renamed.v1", "n": 5}]


def test_subclass_registered_later_is_decodable() -> None:
    frame_before = encode_frame(Envelope(Kind.ONEWAY, 0, Ping()))
    decode_frame(frame_before)  # builds the decoder

    class MsgLate(Message):
        x: int

    env = Envelope(Kind.ONEWAY, 0, MsgLate(x=1))
    assert decode_frame(encode_frame(env)).body == MsgLate(x=1)


def test_duplicate_tag_is_rejected_at_class_creation() -> None:
    with pytest.raises(TypeError, match="already used"):

        class MsgPutClash(Message, tag="MsgPut"):
            y: int


def test_extra_envelope_fields_are_ignored_for_forward_compatibility() -> None:
    raw = msgspec.msgpack.encode([1, 9, {TAG_FIELD: "Ack"}, {"deadline": 3.5}])
    assert decode_frame(raw) == Envelope(Kind.RESPONSE, 9, Ack())


def test_unknown_message_type_is_reported_with_its_request_id() -> None:
    raw = msgspec.msgpack.encode([0, 42, {TAG_FIELD: "NoSuchThing", "a": 1}])
    with pytest.raises(UndecodableBody) as info:
        decode_frame(raw)
    err = info.value
    assert err.code is ErrorCode.UNKNOWN_MESSAGE
    assert (err.kind, err.request_id, err.type_name) == (Kind.REQUEST, 42, "NoSuchThing")


def test_invalid_fields_of_known_type_are_bad_request() -> None:
    raw = msgspec.msgpack.encode([0, 5, {TAG_FIELD: "MsgPut", "key": 17}])
    with pytest.raises(UndecodableBody) as info:
        decode_frame(raw)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.request_id == 5
    assert "key" in info.value.message


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        b"\x93\x00",
        msgspec.msgpack.encode([9, 1, {TAG_FIELD: "Ack"}]),  # bad kind
        msgspec.msgpack.encode([0, -1, {TAG_FIELD: "Ack"}]),  # negative id
        msgspec.msgpack.encode({"kind": 0}),
        msgspec.msgpack.encode([0, 1.5, {TAG_FIELD: "Ack"}]),  # float id
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4G elements
    ],
)
def test_garbled_frames_raise_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_frame(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_ever_raise_protocol_error(raw: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_frame(raw)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=32), st.integers(0, 200))
def test_corrupted_valid_frames_only_raise_protocol_error(noise: bytes, at: int) -> None:
    frame = encode_frame(Envelope(Kind.REQUEST, 1, MsgPut(key="abc", tags=["x", "y"])))
    at = at % (len(frame) + 1)
    with contextlib.suppress(ProtocolError):
        decode_frame(frame[:at] + noise + frame[at + len(noise) :])


def test_unencodable_field_raises_protocol_error() -> None:
    bad = ErrorReply(code="INTERNAL", message="m", details={"obj": object()})
    with pytest.raises(ProtocolError, match="cannot encode ErrorReply"):
        encode_frame(Envelope(Kind.ERROR, 1, bad))


class Get(Message):
    key: str


def test_documented_example_bytes() -> None:
    """The worked example of docs/protocol.md, byte for byte (length prefix included)."""

    def framed(env: Envelope) -> str:
        payload = encode_frame(env)
        return (len(payload).to_bytes(4, "big") + payload).hex(" ")

    assert framed(Envelope(Kind.REQUEST, 1, Get(key="k1"))) == (
        "00 00 00 15 93 00 01 82 a5 40 74 79 70 65 a3 47 65 74 a3 6b 65 79 a2 6b 31"
    )
    error = ErrorReply(code="INDEX_NOT_FOUND", message="no index ix", details={"index": "ix"})
    assert framed(Envelope(Kind.ERROR, 1, error)).startswith("00 00 00 50 93 02 01 84 a5")
    assert decode_frame(encode_frame(Envelope(Kind.ERROR, 1, error))).body == error
    assert framed(Envelope(Kind.RESPONSE, 2, Ack())) == (
        "00 00 00 0e 93 01 02 81 a5 40 74 79 70 65 a3 41 63 6b"
    )


def test_a_large_frame_decodes_with_the_collector_paused_and_the_state_restored() -> None:
    """Decoding a frame of thousands of rows sets off no collection (each one would walk the
    young list whole) but the one young collection at the end; a small frame decodes as
    before; a caller that paused the collector finds it still paused."""
    import gc

    from shardex.api.delivery import DeliverKeyVersions
    from shardex.core.gcpause import gc_paused
    from shardex.net.messages import GC_PAUSE_BYTES, Envelope, Kind, decode_frame, encode_frame

    rows = [("ix", i % 4, 0, b"e" * 40, f"doc{i}", i % 64, i + 1) for i in range(20_000)]
    frame = encode_frame(Envelope(Kind.REQUEST, 1, DeliverKeyVersions("ks", 1, rows)))
    assert len(frame) >= GC_PAUSE_BYTES
    collections: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        got = decode_frame(frame).body
        # The pause's closing young collection (and at most what another thread of the test
        # process sets off after it); unpaused, the decode alone sets off dozens.
        assert 1 <= len(collections) <= 3
        assert gc.isenabled()
        assert got.rows[-1] == rows[-1] and len(got.rows) == len(rows)
        collections.clear()
        with gc_paused():
            decode_frame(frame)
            assert not gc.isenabled()  # the outer holder still holds it
        assert gc.isenabled()
        small = encode_frame(Envelope(Kind.REQUEST, 2, DeliverKeyVersions("ks", 1, rows[:10])))
        assert len(small) < GC_PAUSE_BYTES
        assert decode_frame(small).body.rows == rows[:10]
    finally:
        gc.callbacks.remove(seen)

"""The continuation key: round trip, tamper evidence, versioning, binding, size."""

from __future__ import annotations

import asyncio
import base64
import string

import pytest

from shardex.core.topology import Topology, TopologyHistory
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.continuation import (
    Continuation,
    ContinuationCodec,
    Cursor,
    VirtualScan,
    scan_digest,
)
from shardex.scan.paging import PageCoordinator
from shardex.scan.paging_wire import ShardBatch, ShardBatchResult

SECRET = "continuation-test-secret"
ALPHABET = string.ascii_letters + string.digits + "-_"
DIGEST = scan_digest(b"ks/idx/[spans]/unordered")


def busy_state() -> Continuation:
    """A mid-scan state with resume keys as long as real index entries."""
    return Continuation(
        base_topo=17,
        shard_idx=4,
        resume=b"\x05user-00004711\x00\x02doc::4711",
        vsm=[
            VirtualScan(pid=3, shard="n3", resume=None),
            VirtualScan(pid=11, shard="n4", resume=b"\x05user-00001234\x00\x02doc::1234"),
            VirtualScan(pid=42, shard="n4", resume=b"\x05user-00002222\x00\x02doc::2222"),
        ],
        vs_pid=3,
        scan_digest=DIGEST,
    )


def expect_bad(codec: ContinuationCodec, text: object, fragment: str = "") -> ShardexError:
    with pytest.raises(ShardexError) as info:
        codec.decode(text, expect_digest=DIGEST)
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert "continuation" in info.value.details and "hint" in info.value.details
    assert fragment in info.value.message
    return info.value


def test_round_trip_keeps_every_field() -> None:
    codec = ContinuationCodec(SECRET)
    for ck in (
        Continuation(base_topo=3, scan_digest=DIGEST),
        busy_state(),
        Continuation(
            base_topo=9,
            ordered=True,
            cursors=[Cursor(resume=b"k1", done=False), Cursor(resume=None, done=True)],
            vsm=[VirtualScan(pid=7, shard="n2", resume=b"k0", done=True)],
            scan_digest=DIGEST,
        ),
    ):
        text = codec.encode(ck)
        assert isinstance(text, str) and set(text) <= set(ALPHABET)
        assert codec.decode(text, expect_digest=DIGEST) == ck


def test_flipping_any_character_is_refused() -> None:
    codec = ContinuationCodec(SECRET)
    text = codec.encode(busy_state())
    for i, ch in enumerate(text):
        for other in {ALPHABET[(ALPHABET.index(ch) + step) % 64] for step in (1, 7, 32)}:
            expect_bad(codec, text[:i] + other + text[i + 1 :])


def test_flipping_any_bit_of_the_bytes_is_refused() -> None:
    codec = ContinuationCodec(SECRET)
    raw = base64.urlsafe_b64decode(codec.encode(busy_state()) + "==")
    for i in range(len(raw)):
        for bit in range(8):
            edited = bytearray(raw)
            edited[i] ^= 1 << bit
            expect_bad(codec, base64.urlsafe_b64encode(bytes(edited)).rstrip(b"=").decode())


def test_truncated_extended_and_garbage_texts_are_refused() -> None:
    codec = ContinuationCodec(SECRET)
    text = codec.encode(busy_state())
    expect_bad(codec, text[:-1])
    expect_bad(codec, text[:-4])
    expect_bad(codec, text + "A")
    expect_bad(codec, "", "too short")
    expect_bad(codec, "not base64 at all!", "base64")
    expect_bad(codec, text + "=", "base64")
    expect_bad(codec, 12345, "not a string")


def test_an_edited_field_reencoded_without_the_key_is_refused() -> None:
    codec = ContinuationCodec(SECRET)
    forged = busy_state()
    forged.shard_idx = 0  # e.g. rewind to re-read a shard, or skip virtual scans
    expect_bad(codec, ContinuationCodec("a guessed secret").encode(forged), "integrity")
    # Same header and tag as a genuine key, edited payload.
    genuine = base64.urlsafe_b64decode(codec.encode(busy_state()) + "==")
    swapped = base64.urlsafe_b64decode(ContinuationCodec("x").encode(forged) + "==")
    spliced = swapped[:-16] + genuine[-16:]
    expect_bad(codec, base64.urlsafe_b64encode(spliced).rstrip(b"=").decode(), "integrity")


def test_another_format_version_is_refused_by_name() -> None:
    newer = ContinuationCodec(SECRET, version=2).encode(busy_state())
    err = expect_bad(ContinuationCodec(SECRET), newer, "version 2")
    assert err.details["expected_version"] == 1


def test_a_key_from_another_scan_is_refused() -> None:
    codec = ContinuationCodec(SECRET)
    text = codec.encode(busy_state())
    with pytest.raises(ShardexError, match="different scan") as info:
        codec.decode(text, expect_digest=scan_digest(b"ks/other-index/[spans]/unordered"))
    assert info.value.code == ErrorCode.BAD_REQUEST


def test_the_key_stays_compact() -> None:
    codec = ContinuationCodec(SECRET)
    first = codec.encode(Continuation(base_topo=3, shard_idx=1, scan_digest=DIGEST))
    assert len(first) <= 64, first
    busy = codec.encode(busy_state())
    assert len(busy) <= 200, (len(busy), busy)
    # Many virtual scans with similar resume keys: zlib earns its keep.
    many = busy_state()
    many.vsm = [
        VirtualScan(pid=p, shard=f"n{p % 4}", resume=b"\x05user-0000%04d\x00\x02doc" % p)
        for p in range(64)
    ]
    raw_len = len(__import__("msgspec").msgpack.encode(many))
    assert len(base64.urlsafe_b64decode(codec.encode(many) + "==")) < raw_len


def test_the_empty_secret_is_a_config_error() -> None:
    with pytest.raises(ShardexError) as info:
        ContinuationCodec("")
    assert info.value.code == ErrorCode.CONFIG_ERROR


def test_a_tampered_page_request_touches_no_shard() -> None:
    """The coordinator refuses a bad key before any node is asked for a batch."""
    history = TopologyHistory([Topology(seq_num=1, assignment={0: "n1", 1: "n2"})])
    calls: list[ShardBatch] = []

    async def call(node: str, req: ShardBatch) -> ShardBatchResult:
        calls.append(req)
        return ShardBatchResult(rows=[], resume=None, vsm=req.vsm, exhausted=True)

    codec = ContinuationCodec(SECRET)
    coord = PageCoordinator(history, call, codec)

    async def run() -> None:
        page = await coord.page(b"spec", 10, None, ordered=False)
        assert page.continuation is None and len(calls) == 2
        calls.clear()
        good = codec.encode(Continuation(base_topo=1, scan_digest=scan_digest(b"spec/unordered")))
        bad = good[:5] + ("A" if good[5] != "A" else "B") + good[6:]
        with pytest.raises(ShardexError) as info:
            await coord.page(b"spec", 10, bad, ordered=False)
        assert info.value.code == ErrorCode.BAD_REQUEST
        with pytest.raises(ShardexError, match="different scan"):
            await coord.page(b"spec", 10, good, ordered=True)
        with pytest.raises(ShardexError, match="page_size"):
            await coord.page(b"spec", 0, good, ordered=False)
        assert calls == []

    asyncio.run(run())

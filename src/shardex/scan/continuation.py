"""The continuation key of a paginated, elasticity-safe scan (``elastic-all-shard-queries.md``).

The key carries exactly the state the algorithm's pseudo-code keeps between batches: the base
topology number, the index of the shard being scanned, its resume key, the virtual-scan map
(partitions found to have left their base shard: partition, new owner, resume key) and the
virtual-scan partition. Beyond the specification, an ORDERED (merging) scan keeps one cursor
per base shard, and each virtual scan's own cursor lives in its map entry.

On the wire the key is opaque text: ``base64url(version | flags | payload | tag)`` where the
payload is msgpack (zlib-compressed when that is shorter) and the tag is a truncated
HMAC-SHA256 under a key derived from the cluster secret. A client that edits one byte gets a
``BAD_REQUEST`` error naming the continuation, never the rows of a different position. The
key is also bound to the scan it came from (a digest of the scan's spec), so replaying it on
another index or span is refused too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import zlib
from typing import Any

import msgspec

from shardex.errors import ErrorCode, ShardexError

# Bumped on any incompatible change of the payload layout. A server refuses other versions
# with a clear error (the client restarts the scan) instead of guessing.
CONTINUATION_VERSION = 1
_FLAG_ZLIB = 0x01
_TAG_BYTES = 16  # 128 bits of HMAC-SHA256: forging is out of reach, the key stays short
_HEADER_BYTES = 2
_SCAN_DIGEST_BYTES = 8
_HINT = "pass the continuation returned by the previous page unchanged, or start a new scan"


class VirtualScan(msgspec.Struct, array_like=True):
    """A partition that left its base shard: scan ``shard`` for ``pid``'s entries only.

    Unordered scans: ``resume`` is where the virtual scan *starts* (the source shard's resume
    key when the move was seen); the moving position is the continuation's ``resume``.
    Ordered scans: ``resume`` is this stream's own cursor and ``done`` says it is finished.
    """

    pid: int
    shard: str
    resume: bytes | None = None
    done: bool = False


class Cursor(msgspec.Struct, array_like=True):
    """One base shard's position in an ordered scan: rows up to ``resume`` were returned."""

    resume: bytes | None = None
    done: bool = False


class Continuation(msgspec.Struct, array_like=True):
    """The decoded state of a paginated scan (the algorithm's CK)."""

    base_topo: int = -1  # -1: the first page has not picked its base topology yet
    shard_idx: int = 0  # into SHARDS = base shards (sorted) + virtual scans (map order)
    resume: bytes | None = None  # unordered: position in SHARDS[shard_idx]
    vsm: list[VirtualScan] = msgspec.field(default_factory=list)  # in creation order
    vs_pid: int = -1  # the partition of the virtual shard being scanned, -1 for a base shard
    ordered: bool = False
    cursors: list[Cursor] = msgspec.field(default_factory=list)  # ordered: one per base shard
    scan_digest: bytes = b""  # binds the key to one scan spec (index, spans, ordering)
    # What the first page fixed for every later one (opaque to the protocol: a real scan
    # keeps its index id and pinned stability TS here, so every page reads the same snapshot)
    context: bytes = b""

    def clone(self) -> Continuation:
        """A deep copy (the RN keeps a saved copy to repeat a batch from)."""
        return Continuation(
            base_topo=self.base_topo,
            shard_idx=self.shard_idx,
            resume=self.resume,
            vsm=[clone_vs(v) for v in self.vsm],
            vs_pid=self.vs_pid,
            ordered=self.ordered,
            cursors=[Cursor(resume=c.resume, done=c.done) for c in self.cursors],
            scan_digest=self.scan_digest,
            context=self.context,
        )

    def virtual(self, pid: int) -> VirtualScan | None:
        for vs in self.vsm:
            if vs.pid == pid:
                return vs
        return None


def clone_vs(vs: VirtualScan) -> VirtualScan:
    return VirtualScan(pid=vs.pid, shard=vs.shard, resume=vs.resume, done=vs.done)


def scan_digest(spec: bytes) -> bytes:
    """The short digest a continuation stores of its scan's spec (any stable bytes)."""
    return hashlib.sha256(b"shardex/scan-spec/" + spec).digest()[:_SCAN_DIGEST_BYTES]


def bad_continuation(reason: str, value: Any = None, **details: Any) -> ShardexError:
    shown = value if not isinstance(value, str) or len(value) <= 48 else value[:45] + "..."
    return ShardexError(
        f"invalid continuation: {reason}",
        code=ErrorCode.BAD_REQUEST,
        details={"continuation": shown, "reason": reason, "hint": _HINT, **details},
    )


class ContinuationCodec:
    """Encodes and checks continuations under one cluster secret.

    The HMAC key is derived from the secret with a fixed label, so the continuation tag can
    never be replayed as a proof in the cluster's authentication handshake, or vice versa.
    """

    def __init__(self, secret: str | bytes, *, version: int = CONTINUATION_VERSION) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        if not raw:
            raise ShardexError(
                "the continuation secret is empty",
                code=ErrorCode.CONFIG_ERROR,
                details={"hint": "use the cluster secret"},
            )
        self._key = hashlib.sha256(b"shardex/continuation/v1/" + raw).digest()
        if not 0 <= version <= 255:
            raise ValueError(f"version {version} does not fit a byte")
        self._version = version
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Continuation)

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:_TAG_BYTES]

    def encode(self, ck: Continuation) -> str:
        payload = self._encoder.encode(ck)
        flags = 0
        packed = zlib.compress(payload, 9)
        if len(packed) < len(payload):  # small keys are not worth zlib's 6-byte frame
            payload, flags = packed, _FLAG_ZLIB
        body = bytes((self._version, flags)) + payload
        return base64.urlsafe_b64encode(body + self._tag(body)).rstrip(b"=").decode("ascii")

    def decode(self, text: Any, *, expect_digest: bytes | None = None) -> Continuation:
        """The continuation in ``text``; ``BAD_REQUEST`` for anything not made by ``encode``."""
        if not isinstance(text, str):
            raise bad_continuation("not a string", repr(text)[:48])
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise bad_continuation("not base64url text", text) from None
        # base64 tolerates stray trailing bits: demand the canonical spelling so that every
        # edited character is refused, not just the ones that change a decoded byte.
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
            raise bad_continuation("not canonical base64url text", text)
        if len(raw) < _HEADER_BYTES + _TAG_BYTES + 1:
            raise bad_continuation("too short", text, length=len(raw))
        body, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(body)):
            raise bad_continuation(
                "the integrity check failed (edited, truncated or from another cluster)", text
            )
        version, flags = body[0], body[1]
        if version != self._version:
            raise bad_continuation(
                f"format version {version}, this server reads version {self._version}",
                text,
                version=version,
                expected_version=self._version,
            )
        payload = body[_HEADER_BYTES:]
        if flags & ~_FLAG_ZLIB:
            raise bad_continuation(f"unknown flags {flags:#x}", text)
        try:
            if flags & _FLAG_ZLIB:
                payload = zlib.decompress(payload)
            ck = self._decoder.decode(payload)
        except (zlib.error, msgspec.DecodeError) as e:
            # Only reachable with a valid tag, i.e. a server bug, never a client's edit.
            raise bad_continuation(f"undecodable payload ({e})", text) from None
        if expect_digest is not None and ck.scan_digest != expect_digest:
            raise bad_continuation(
                "it belongs to a different scan (index, spans or ordering differ)", text
            )
        return ck

"""Typed messages: one tagged union of msgspec Structs, encoded as msgpack.

Every ``Message`` subclass anywhere in the code base registers itself when its class is
created (a metaclass hook); the frame decoder is built over the union of all registered
classes on first use and rebuilt when a new class registers. So a service defines its
messages next to its code and never touches a central list.

A frame is an ``Envelope`` encoded as a msgpack array ``[kind, id, body]``; ``body`` is a map
whose ``"@type"`` key is the message's tag (its class name unless the class says
``tag="..."``). Readers ignore array elements after ``body`` so a later version can append
envelope fields (deadline, trace id) without breaking older peers.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, ClassVar, Union

import msgspec

from shardex.core.gcpause import gc_paused
from shardex.errors import ErrorCode, ProtocolError

# Bumped on an incompatible change of the envelope or the handshake; checked at handshake.
PROTOCOL_VERSION = 1

# The tag key inside each body. "@" keeps it clear of every Python field name, so no message
# may ever collide with it (a plain "type" would forbid fields named ``type``).
TAG_FIELD = "@type"

# A frame this large (hundreds of rows and up) is decoded with the cyclic collector paused
# (``runtime/gcpause.py``); below it the pause would cost more than the collections it saves.
GC_PAUSE_BYTES = 64 * 1024


class Kind(enum.IntEnum):
    """What an envelope is. Request ids are scoped per direction: a RESPONSE/ERROR answers
    the *receiver's* earlier REQUEST with the same id."""

    REQUEST = 0
    RESPONSE = 1
    ERROR = 2
    ONEWAY = 3


_registry: dict[str, type[Message]] = {}
_tag_by_class: dict[type, str] = {}  # on every request's path; __struct_config__ allocates
_registry_version = 0
_lock = threading.Lock()


class _MessageMeta(msgspec.StructMeta):
    """Registers every subclass of ``Message`` as it is created.

    A metaclass rather than ``__init_subclass__``: msgspec fills in a class's tag config
    after ``__init_subclass__`` runs, and registration must see the final tag to reject
    duplicates at import time.
    """

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _MessageMeta:
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if any(isinstance(b, _MessageMeta) for b in bases):  # not the base itself
            _register(cls)  # type: ignore[arg-type]
        return cls


class Message(msgspec.Struct, metaclass=_MessageMeta, tag=True, tag_field=TAG_FIELD, kw_only=True):
    """Base of every message. Subclass it; the subclass is on the wire at once.

    Fields must be msgpack-encodable types msgspec understands (str, int, float, bool,
    bytes, None, list, dict, tuple, Structs, enums, ...). Add new fields with defaults so
    older peers (which omit them) still decode.
    """


def _register(cls: type[Message]) -> None:
    global _registry_version
    config = cls.__struct_config__
    if config.tag_field != TAG_FIELD:
        raise TypeError(f"{cls.__qualname__}: messages must keep tag_field {TAG_FIELD!r}")
    tag = config.tag
    if not isinstance(tag, str):
        raise TypeError(f"{cls.__qualname__}: message tags must be strings, got {tag!r}")
    with _lock:
        old = _registry.get(tag)
        if old is not None and (old.__module__, old.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            # Two classes with one tag would make decoding ambiguous; fail at import time.
            raise TypeError(
                f"message tag {tag!r} of {cls.__module__}.{cls.__qualname__} is already used "
                f"by {old.__module__}.{old.__qualname__}; pass tag='...' to disambiguate"
            )
        # Same module and name again (a reload): the new class replaces the old one.
        _registry[tag] = cls
        _tag_by_class[cls] = tag
        _registry_version += 1


def registered_messages() -> dict[str, type[Message]]:
    """Snapshot of tag -> class for every registered message."""
    with _lock:
        return dict(_registry)


def message_type_name(msg: Message | type[Message]) -> str:
    """The wire tag of a message or message class (used in errors and logs)."""
    cls = msg if isinstance(msg, type) else type(msg)
    tag = _tag_by_class.get(cls)
    if tag is None:  # not a registered class (e.g. the base): ask msgspec
        tag = str(cls.__struct_config__.tag)
    return tag


# --- the protocol's own messages -------------------------------------------------------


class Challenge(Message):
    """Server -> client, first frame on every connection."""

    server_name: str
    protocol_version: int
    nonce: bytes


class AuthResponse(Message):
    """Client -> server: its own nonce and proof that it knows the cluster secret."""

    client_name: str
    protocol_version: int
    nonce: bytes
    proof: bytes


class UserHello(Message):
    """Client -> server, instead of ``AuthResponse`` for a user: who, and its nonce."""

    username: str
    protocol_version: int
    nonce: bytes


class UserSalt(Message):
    """Server -> client: the user's salt and Argon2id parameters (invented, the same every
    time, for a name that is not a user: a login does not tell which names exist)."""

    salt: bytes
    time_cost: int
    memory_cost: int
    parallelism: int


class UserProof(Message):
    """Client -> server: ClientKey XOR HMAC(StoredKey, auth message)."""

    proof: bytes


class AuthOk(Message):
    """Server -> client: the server's proof, so the client authenticates the server too
    (for a user: HMAC(ServerKey, auth message))."""

    proof: bytes


class ErrorReply(Message):
    """A failed request (envelope kind ERROR) or a notice before a close (kind ONEWAY/ERROR,
    id 0). ``code`` is an ``ErrorCode`` name; unknown names map to INTERNAL on receipt."""

    code: str
    message: str
    details: dict[str, Any] = {}


class Ping(Message):
    """Liveness probe; every connection answers it with ``Pong`` unless a handler is routed."""

    payload: bytes = b""


class Pong(Message):
    payload: bytes = b""


class Ack(Message):
    """The response sent when a request handler returns ``None``."""


# --- envelope and framing --------------------------------------------------------------


class Envelope(msgspec.Struct, array_like=True, frozen=True):
    kind: Kind
    id: int
    body: Message


class _RawEnvelope(msgspec.Struct, array_like=True):
    kind: Kind
    id: int
    body: msgspec.Raw


_TagOnly = msgspec.defstruct("_TagOnly", [("tag", str)], rename={"tag": TAG_FIELD})


class UndecodableBody(ProtocolError):
    """The envelope was fine but its body was not: an unknown message type (code
    UNKNOWN_MESSAGE) or a known type with invalid fields (code BAD_REQUEST). Frame boundaries
    are intact, so the connection can answer this one request and carry on."""

    def __init__(
        self, message: str, *, code: ErrorCode, kind: Kind, request_id: int, type_name: str | None
    ) -> None:
        super().__init__(message, code=code, details={"type": type_name, "kind": kind.name.lower()})
        self.kind = kind
        self.request_id = request_id
        self.type_name = type_name


class _Codec:
    """Encoder plus a body decoder that follows the registry."""

    encoder: ClassVar[msgspec.msgpack.Encoder] = msgspec.msgpack.Encoder()
    envelope_decoder: ClassVar[msgspec.msgpack.Decoder[_RawEnvelope]] = msgspec.msgpack.Decoder(
        _RawEnvelope
    )
    tag_decoder: ClassVar[msgspec.msgpack.Decoder[Any]] = msgspec.msgpack.Decoder(_TagOnly)
    body_decoder: ClassVar[msgspec.msgpack.Decoder[Any] | None] = None
    # Envelope and body in one pass (the common case); the two-stage decoders above only
    # classify a frame this one refused.
    frame_decoder: ClassVar[msgspec.msgpack.Decoder[Any] | None] = None
    body_version: ClassVar[int] = -1

    @classmethod
    def _rebuild(cls) -> None:
        with _lock:
            version = _registry_version
            types = tuple(_registry.values())
        union = Union[types]  # noqa: UP007 (runtime union)
        whole = msgspec.defstruct(
            "_WholeEnvelope", [("kind", Kind), ("id", int), ("body", union)], array_like=True
        )
        cls.body_decoder = msgspec.msgpack.Decoder(union)
        cls.frame_decoder = msgspec.msgpack.Decoder(whole)
        cls.body_version = version

    @classmethod
    def body(cls) -> msgspec.msgpack.Decoder[Any]:
        if cls.body_decoder is None or cls.body_version != _registry_version:
            cls._rebuild()
        assert cls.body_decoder is not None
        return cls.body_decoder

    @classmethod
    def frame(cls) -> msgspec.msgpack.Decoder[Any]:
        if cls.frame_decoder is None or cls.body_version != _registry_version:
            cls._rebuild()
        assert cls.frame_decoder is not None
        return cls.frame_decoder


def encode_frame(envelope: Envelope) -> bytes:
    """Envelope -> frame payload. Raises ``ProtocolError`` if a field cannot be encoded."""
    try:
        return _Codec.encoder.encode(envelope)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as e:
        raise ProtocolError(
            f"cannot encode {message_type_name(envelope.body)}: {e}",
            details={"type": message_type_name(envelope.body)},
        ) from e


def decode_frame(data: bytes | bytearray | memoryview) -> Envelope:
    """Frame payload -> Envelope.

    Raises ``UndecodableBody`` (a ``ProtocolError``) when only the body is bad and plain
    ``ProtocolError`` for anything else; never another exception type, whatever the bytes.
    """
    try:
        if len(data) >= GC_PAUSE_BYTES:
            with gc_paused():  # ``runtime/gcpause.py``: what a large frame decodes all lives on
                whole = _Codec.frame().decode(data)
        else:
            whole = _Codec.frame().decode(data)
    except Exception:
        pass  # find out what is wrong with it below
    else:
        if whole.id >= 0:
            return Envelope(whole.kind, whole.id, whole.body)
    try:
        raw = _Codec.envelope_decoder.decode(data)
    except Exception as e:  # msgspec errors, and anything else garbage might provoke
        raise ProtocolError(f"undecodable frame: {e}", details={"size": len(data)}) from None
    if raw.id < 0:
        raise ProtocolError(f"negative request id {raw.id}", details={"id": raw.id})
    try:
        body = _Codec.body().decode(raw.body)
    except Exception as e:
        raise _undecodable_body(raw, e) from None
    return Envelope(raw.kind, raw.id, body)


def _undecodable_body(raw: _RawEnvelope, err: Exception) -> UndecodableBody:
    try:
        tag: str | None = _Codec.tag_decoder.decode(raw.body).tag
    except Exception:
        tag = None
    if tag is not None and tag not in _registry:
        return UndecodableBody(
            f"unknown message type {tag!r}",
            code=ErrorCode.UNKNOWN_MESSAGE,
            kind=raw.kind,
            request_id=raw.id,
            type_name=tag,
        )
    return UndecodableBody(
        f"invalid {tag or 'message'}: {err}",
        code=ErrorCode.BAD_REQUEST,
        kind=raw.kind,
        request_id=raw.id,
        type_name=tag,
    )

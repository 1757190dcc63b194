"""Timestamps: vectors partition -> (seqno, partition uuid).

A timestamp (TS) says, per data partition, how far a history has been seen: the seqno of the
last mutation and the uuid of the history branch it belongs to. Comparisons are per partition
and only meaningful on the same branch: a seqno on another uuid says nothing about ours, which
is exactly when a consumer must roll back (see ``ROLLBACK`` / ``INDEX_IN_ROLLBACK``).

Offsets of the Spark change-stream source round-trip through JSON, where integer keys come back
as strings, so ``to_json``/``from_json`` use string partition ids in ascending numeric order.

A TS is held in its wire form, ``{partition: (seqno, uuid)}`` in ascending partition order:
every request_plus scan converts a few of them to and from messages (the keyspace's high
seqnos, the snapshot read), so ``from_wire``/``to_wire``, ``covers``, equality and hashing work
on plain tuples in C-level dict operations. The ``SeqnoEntry`` objects the ``Mapping`` view
hands out are built once per TS, on first use.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, overload

import msgspec

from shardex.errors import ErrorCode, ShardexError

__all__ = ["SeqnoEntry", "Timestamp"]

_D = TypeVar("_D")
Wire = dict[int, tuple[int, int]]


class _WireBox(msgspec.Struct, array_like=True):
    """``from_wire``'s check in C: int partitions, (seqno >= 0, uuid) int pairs. The type
    is held by a Struct because msgspec caches a Struct's compiled type info on the
    class, whereas a bare generic alias passed to ``msgspec.convert`` is re-analysed (hashed,
    its ``Annotated`` metadata walked) on every call: 2-10x (by the machine's load) the
    cost of converting a one-partition TS. ``from_wire`` converts ``(data,)`` to this."""

    wire: dict[int, tuple[Annotated[int, msgspec.Meta(ge=0)], int]]


# ``packed``/``from_packed``: one encoder and one typed decoder for every TS (msgspec keeps
# the compiled type on a Decoder, as on ``_WireBox``).
_PACKER = msgspec.msgpack.Encoder()
_UNPACKER = msgspec.msgpack.Decoder(dict[int, tuple[Annotated[int, msgspec.Meta(ge=0)], int]])


@dataclass(frozen=True, slots=True)
class SeqnoEntry:
    seqno: int
    uuid: int


def _negative(p: int, seqno: int) -> ShardexError:
    return ShardexError(
        f"negative seqno {seqno} for partition {p}",
        code=ErrorCode.BAD_REQUEST,
        details={"partition": p, "seqno": seqno},
    )


class Timestamp(Mapping[int, SeqnoEntry]):
    """An immutable partition -> SeqnoEntry vector. Absent partitions mean "nothing seen"."""

    __slots__ = ("_hash", "_objs", "_packed", "_wire")

    _wire: Wire
    _objs: dict[int, SeqnoEntry] | None
    _hash: int | None
    _packed: bytes | None

    def __init__(self, entries: Mapping[int, SeqnoEntry | tuple[int, int]] | None = None) -> None:
        norm: Wire = {}
        for p, e in (entries or {}).items():
            if isinstance(e, SeqnoEntry):
                norm[int(p)] = (int(e.seqno), int(e.uuid))
            else:
                norm[int(p)] = (int(e[0]), int(e[1]))
        self._set(norm)

    @classmethod
    def _of(cls, wire: Wire, *, checked: bool = False) -> Timestamp:
        """A TS over ``wire`` (normalised: int keys, (int, int) values), which it owns;
        ``checked``: its seqnos are known to be >= 0."""
        ts = cls.__new__(cls)
        ts._set(wire, checked=checked)
        return ts

    def _set(self, wire: Wire, *, checked: bool = False) -> None:
        if not checked:
            for p, (seqno, _) in wire.items():
                if seqno < 0:
                    raise _negative(p, seqno)
        keys = list(wire)
        if keys != sorted(keys):
            wire = dict(sorted(wire.items()))
        self._wire = wire
        self._objs = None
        self._hash = None
        self._packed = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Timestamp._of, (dict(self._wire),))

    # Mapping protocol -------------------------------------------------------------------
    def _entries(self) -> dict[int, SeqnoEntry]:
        objs = self._objs
        if objs is None:
            objs = self._objs = {p: SeqnoEntry(s, u) for p, (s, u) in self._wire.items()}
        return objs

    def __getitem__(self, partition: int) -> SeqnoEntry:
        return self._entries()[partition]

    def __iter__(self) -> Iterator[int]:
        return iter(self._wire)

    def __len__(self) -> int:
        return len(self._wire)

    def __contains__(self, partition: object) -> bool:
        return partition in self._wire

    @overload
    def get(self, partition: int, /) -> SeqnoEntry | None: ...
    @overload
    def get(self, partition: int, /, default: SeqnoEntry | _D) -> SeqnoEntry | _D: ...
    def get(self, partition: int, default: Any = None) -> Any:
        return self._entries().get(partition, default)

    def items(self) -> ItemsView[int, SeqnoEntry]:
        return self._entries().items()

    def values(self) -> ValuesView[SeqnoEntry]:
        return self._entries().values()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Timestamp):
            return self._wire == other._wire
        return NotImplemented

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash(tuple(self._wire.items()))
        return h

    def __repr__(self) -> str:
        body = ", ".join(f"{p}:{s}@{u:x}" for p, (s, u) in self._wire.items())
        return f"Timestamp({{{body}}})"

    def seqno(self, partition: int) -> int:
        e = self._wire.get(partition)
        return e[0] if e is not None else 0

    # comparisons the scan and stability rules need -------------------------------------
    def covers(self, other: Timestamp) -> bool:
        """At least as recent as ``other`` in every partition ``other`` names, on the same
        branch. A partition of ``other`` with seqno 0 is covered trivially (nothing to see)."""
        mine = self._wire
        if mine == other._wire:  # the common case of a scan on an idle keyspace: C speed
            return True
        for p, (seqno, uuid) in other._wire.items():
            if seqno == 0:
                continue
            m = mine.get(p)
            if m is None or m[1] != uuid or m[0] < seqno:
                return False
        return True

    def diverged_from(self, other: Timestamp) -> list[int]:
        """Partitions present in both whose branch uuid differs (history diverged)."""
        theirs = other._wire
        return [p for p, (_, u) in self._wire.items() if p in theirs and theirs[p][1] != u]

    def merge_max(self, other: Timestamp) -> Timestamp:
        """Per-partition maximum. On a branch conflict the entry with the higher seqno wins
        (the newer history); ties keep ``other``, the value being merged in."""
        out = dict(self._wire)
        for p, theirs in other._wire.items():
            mine = out.get(p)
            if mine is None or theirs[0] >= mine[0]:
                out[p] = theirs
        return Timestamp._of(out)

    def seqno_moves(self, target: Timestamp) -> tuple[bool, list[int]]:
        """(whether ``target`` is past ``self`` in some partition, the partitions where it is
        below ``self``), by seqno alone, over the partitions ``target`` names (absent from
        ``self``: seqno 0). A slice's stabilise asks this of every round's TS against its
        applied one: one pass over the wire tuples, no entry objects (64 partitions, twice
        per slice per round, were ~60 us through ``__getitem__`` and ``seqno``)."""
        mine = self._wire
        theirs = target._wire
        if mine == theirs:
            return False, []
        ahead = False
        back: list[int] = []
        for p, (seqno, _) in theirs.items():
            m = mine.get(p)
            have = 0 if m is None else m[0]
            if seqno > have:
                ahead = True
            elif seqno < have:
                back.append(p)
        return ahead, back

    def updated(self, other: Timestamp) -> Timestamp:
        """``self`` with every partition ``other`` names replaced by ``other``'s entry
        (seqno and uuid; the partitions ``other`` does not name kept as they are)."""
        return Timestamp._of({**self._wire, **other._wire}, checked=True)

    def behind(self, target: Timestamp) -> dict[int, int]:
        """How many seqnos ``self`` lacks to cover ``target``, per partition (only those
        behind; a partition on another branch counts its whole target seqno)."""
        out: dict[int, int] = {}
        mine_all = self._wire
        for p, (seqno, uuid) in target._wire.items():
            mine = mine_all.get(p)
            if mine is None or mine[1] != uuid:
                if seqno > 0:
                    out[p] = seqno
            elif mine[0] < seqno:
                out[p] = seqno - mine[0]
        return out

    def total_behind(self, target: Timestamp) -> int:
        return sum(self.behind(target).values())

    def with_entry(self, partition: int, seqno: int, uuid: int) -> Timestamp:
        out = dict(self._wire)
        out[int(partition)] = (int(seqno), int(uuid))
        return Timestamp._of(out)

    # encodings ------------------------------------------------------------------------------
    def to_wire(self) -> Wire:
        """``{partition: (seqno, uuid)}``, ascending: a fresh dict (the caller may keep it)."""
        return dict(self._wire)

    @classmethod
    def from_wire(cls, data: Mapping[Any, Any]) -> Timestamp:
        """The inverse of ``to_wire``. A message's decoded ``WireTs`` is checked in C
        (``msgspec.convert``); anything else is coerced to ints in Python, which also names
        the partition of a negative seqno."""
        try:
            wire = msgspec.convert((data,), _WireBox).wire
        except msgspec.ValidationError:
            return cls._of({int(p): (int(v[0]), int(v[1])) for p, v in data.items()})
        return cls._of(wire, checked=True)

    def packed(self) -> bytes:
        """``to_wire()`` msgpack-encoded, built once per TS object (a snapshot's TS is one
        object in the ring, so once per stabilise, not per scan). Canonical: the wire dict
        is in ascending partition order and msgpack ints take their shortest form, so equal
        TSs give equal bytes - a scan coordinator compares its slices' TSs as bytes, and
        the bytes are those of a message's plain ``WireTs`` field."""
        b = self._packed
        if b is None:
            b = self._packed = _PACKER.encode(self._wire)
        return b

    @classmethod
    def from_packed(cls, data: bytes | memoryview) -> Timestamp:
        """The inverse of ``packed`` (any msgpack ``WireTs``, in any order); BAD_REQUEST
        naming the problem when ``data`` is not one."""
        try:
            wire = _UNPACKER.decode(data)
        except msgspec.DecodeError as exc:  # ValidationError included
            raise ShardexError(
                f"malformed timestamp: {exc}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": bytes(data[:64]).hex(), "hint": "{partition: [seqno, uuid]}"},
            ) from exc
        return cls._of(wire, checked=True)

    def to_json(self) -> dict[str, list[int]]:
        """JSON-safe form with string partition ids (Spark offsets stringify keys)."""
        return {str(p): [s, u] for p, (s, u) in self._wire.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timestamp:
        try:
            return cls._of({int(p): (int(v[0]), int(v[1])) for p, v in data.items()})
        except (TypeError, ValueError, IndexError) as exc:
            raise ShardexError(
                f"malformed timestamp: {exc}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": repr(data)[:200], "hint": '{"<partition>": [seqno, uuid]}'},
            ) from exc

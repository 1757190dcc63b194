"""Timestamps: vectors partition -> (seqno, partition uuid).

A timestamp (TS) says, per data partition, how far a history has been seen: the seqno of the
last mutation and the uuid of the history branch it belongs to. Comparisons are per partition
and only meaningful on the same branch: a seqno on another uuid says nothing about ours, which
is exactly when a consumer must roll back (see ``ROLLBACK`` / ``INDEX_IN_ROLLBACK``).

Offsets of the Spark change-stream source round-trip through JSON, where integer keys come back
as strings, so ``to_json``/``from_json`` use string partition ids in ascending numeric order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardex.errors import ErrorCode, ShardexError


@dataclass(frozen=True, slots=True)
class SeqnoEntry:
    seqno: int
    uuid: int


class Timestamp(Mapping[int, SeqnoEntry]):
    """An immutable partition -> SeqnoEntry vector. Absent partitions mean "nothing seen"."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[int, SeqnoEntry | tuple[int, int]] | None = None) -> None:
        norm: dict[int, SeqnoEntry] = {}
        for p, e in (entries or {}).items():
            entry = e if isinstance(e, SeqnoEntry) else SeqnoEntry(int(e[0]), int(e[1]))
            if entry.seqno < 0:
                raise ShardexError(
                    f"negative seqno {entry.seqno} for partition {p}",
                    code=ErrorCode.BAD_REQUEST,
                    details={"partition": p, "seqno": entry.seqno},
                )
            norm[int(p)] = entry
        self._entries = dict(sorted(norm.items()))

    # Mapping protocol -------------------------------------------------------------------
    def __getitem__(self, partition: int) -> SeqnoEntry:
        return self._entries[partition]

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Timestamp):
            return self._entries == other._entries
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._entries.items()))

    def __repr__(self) -> str:
        body = ", ".join(f"{p}:{e.seqno}@{e.uuid:x}" for p, e in self._entries.items())
        return f"Timestamp({{{body}}})"

    def seqno(self, partition: int) -> int:
        e = self._entries.get(partition)
        return e.seqno if e is not None else 0

    # comparisons the seeds need ---------------------------------------------------------
    def covers(self, other: Timestamp) -> bool:
        """At least as recent as ``other`` in every partition ``other`` names, on the same
        branch. A partition of ``other`` with seqno 0 is covered trivially (nothing to see)."""
        for p, theirs in other._entries.items():
            if theirs.seqno == 0:
                continue
            mine = self._entries.get(p)
            if mine is None or mine.uuid != theirs.uuid or mine.seqno < theirs.seqno:
                return False
        return True

    def diverged_from(self, other: Timestamp) -> list[int]:
        """Partitions present in both whose branch uuid differs (history diverged)."""
        return [
            p
            for p, mine in self._entries.items()
            if p in other._entries and other._entries[p].uuid != mine.uuid
        ]

    def merge_max(self, other: Timestamp) -> Timestamp:
        """Per-partition maximum. On a branch conflict the entry with the higher seqno wins
        (the newer history); ties keep ``other``, the value being merged in."""
        out = dict(self._entries)
        for p, theirs in other._entries.items():
            mine = out.get(p)
            if mine is None or theirs.seqno >= mine.seqno:
                out[p] = theirs
        return Timestamp(out)

    def behind(self, target: Timestamp) -> dict[int, int]:
        """How many seqnos ``self`` lacks to cover ``target``, per partition (only those
        behind; a partition on another branch counts its whole target seqno)."""
        out: dict[int, int] = {}
        for p, theirs in target._entries.items():
            mine = self._entries.get(p)
            if mine is None or mine.uuid != theirs.uuid:
                if theirs.seqno > 0:
                    out[p] = theirs.seqno
            elif mine.seqno < theirs.seqno:
                out[p] = theirs.seqno - mine.seqno
        return out

    def total_behind(self, target: Timestamp) -> int:
        return sum(self.behind(target).values())

    def with_entry(self, partition: int, seqno: int, uuid: int) -> Timestamp:
        out = dict(self._entries)
        out[partition] = SeqnoEntry(seqno, uuid)
        return Timestamp(out)

    # encodings ------------------------------------------------------------------------------
    def to_wire(self) -> dict[int, tuple[int, int]]:
        return {p: (e.seqno, e.uuid) for p, e in self._entries.items()}

    @classmethod
    def from_wire(cls, data: Mapping[Any, Any]) -> Timestamp:
        return cls({int(p): (int(v[0]), int(v[1])) for p, v in data.items()})

    def to_json(self) -> dict[str, list[int]]:
        """JSON-safe form with string partition ids (Spark offsets stringify keys)."""
        return {str(p): [e.seqno, e.uuid] for p, e in self._entries.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timestamp:
        try:
            return cls({int(p): (int(v[0]), int(v[1])) for p, v in data.items()})
        except (TypeError, ValueError, IndexError) as exc:
            raise ShardexError(
                f"malformed timestamp: {exc}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": repr(data)[:200], "hint": '{"<partition>": [seqno, uuid]}'},
            ) from exc

"""What the protocol runs: fragments, as factories registered by name on every member.

The protocol does not know what a fragment computes. A fragment is
``fn(ctx) -> AsyncIterator[pyarrow.RecordBatch]``: it reads its inputs (one async iterator
of batches per inbound edge, all senders merged) and yields its output batches, which go to
its outbound edge (each of the reader's members, for a broadcast) or, for the root
fragment, to the caller; a fragment whose output is a hash exchange yields
``(partition, batch)`` pairs instead (``FragmentContext.partitions``).
``FragmentSpec.kind`` names the factory; the SQL operators register theirs, tests register
small ones (emit, filter, sum).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from shardex.api.query_ids import QueryId
from shardex.api.sql_protocol import FragmentSpec
from shardex.errors import ErrorCode, ShardexError

__all__ = ["Fragment", "FragmentContext", "FragmentRegistry"]


@dataclass
class FragmentContext:
    query_id: QueryId
    member_id: str
    fragment: FragmentSpec
    participants: tuple[str, ...]
    parameters: list[Any] | dict[str, Any]
    inputs: dict[int, AsyncIterator[pa.RecordBatch]]
    # The members a hash exchange's output is partitioned among (1 for any other output):
    # such a fragment yields ``(partition, batch)`` with 0 <= partition < partitions.
    partitions: int = 1
    # Each sender's batches of an input edge alone, one iterator per sender in the writing
    # fragment's member order (``inputs`` merges them): for a reader merging sorted runs.
    by_sender: Callable[[int], list[AsyncIterator[pa.RecordBatch]]] | None = None

    @property
    def args(self) -> dict[str, Any]:
        return self.fragment.args

    @property
    def instance(self) -> int:
        """This member's position among the fragment's members (0-based)."""
        return self.fragment.members.index(self.member_id)

    def input(self) -> AsyncIterator[pa.RecordBatch]:
        """The only input of a single-input fragment."""
        if len(self.inputs) != 1:
            raise ShardexError(
                f"fragment {self.fragment.kind} has {len(self.inputs)} inputs, expected one",
                code=ErrorCode.BAD_REQUEST,
                details={"value": sorted(self.inputs), "hint": "use ctx.inputs[edge_id]"},
            )
        return next(iter(self.inputs.values()))


# Batches, or (partition, batch) pairs for a hash exchange's sender.
Fragment = Callable[[FragmentContext], AsyncIterator[Any]]


class FragmentRegistry:
    """Fragment kind -> factory, the same on every member."""

    def __init__(self, fragments: dict[str, Fragment] | None = None) -> None:
        self._fragments: dict[str, Fragment] = {}
        for kind, fn in (fragments or {}).items():
            self.register(kind, fn)

    def register(self, kind: str, fn: Fragment) -> None:
        if kind in self._fragments:
            raise ValueError(f"fragment kind {kind!r} is already registered")
        self._fragments[kind] = fn

    def __contains__(self, kind: object) -> bool:
        return kind in self._fragments

    def get(self, kind: str) -> Fragment:
        fn = self._fragments.get(kind)
        if fn is None:
            raise ShardexError(
                f"unknown fragment kind {kind!r}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": kind, "hint": f"known kinds: {sorted(self._fragments)}"},
            )
        return fn

"""An in-memory stand-in for ``IndexerEngine``'s slice catalogue, for simulated nodes.

The simulator forbids threads and file I/O in the loop, and a run should cost milliseconds,
so simulated indexers keep their slices in a dict that lives in the node's simulated disk
(``ClusterNode.disk``): a slice created before a crash is still there after the restart, as
with the real engine, whose ``create_slice`` is durable when it returns. The checkers read
the same dicts to see which slices exist on every node, crashed or not. Only the DDL surface
is modelled (create, drop, list); ``tests/sim/test_index_ddl_sim.py`` also runs the real
engine in one scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexDefinition, validate_definition

__all__ = ["FakeSlice", "MemorySliceEngine"]


@dataclass(frozen=True)
class FakeSlice:
    definition: IndexDefinition
    partition: int
    state: str = "created"

    @property
    def index_id(self) -> str:
        return self.definition.id


class MemorySliceEngine:
    """``create_slice`` / ``drop_index`` / ``slices`` / ``close`` over ``store``, a dict
    (index id, partition) -> FakeSlice that survives the engine object."""

    def __init__(self, store: dict[tuple[str, int], FakeSlice] | None = None) -> None:
        self.store: dict[tuple[str, int], FakeSlice] = {} if store is None else store
        self.closed = False

    def create_slice(self, definition: IndexDefinition, partition: int) -> FakeSlice:
        definition = validate_definition(definition)
        if not 0 <= partition < definition.num_partition:
            raise ShardexError(
                f"index {definition.id} has no partition {partition}",
                code=ErrorCode.BAD_REQUEST,
                details={"partition": partition},
            )
        key = (definition.id, partition)
        old = self.store.get(key)
        if old is not None:
            if old.definition != definition:
                raise ShardexError(
                    f"slice {definition.id}/{partition} exists with another definition",
                    code=ErrorCode.INDEX_EXISTS,
                    details={"index": definition.id},
                )
            return old
        sl = FakeSlice(definition, partition)
        self.store[key] = sl
        return sl

    def drop_index(self, index_id: str) -> int:
        keys = [k for k in self.store if k[0] == index_id]
        for k in keys:
            del self.store[k]
        return len(keys)

    def slices(self, index_id: str | None = None) -> list[FakeSlice]:
        return [s for k, s in sorted(self.store.items()) if index_id is None or k[0] == index_id]

    def close(self) -> None:
        self.closed = True

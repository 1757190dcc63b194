"""Index records in the coordinator's ``StateContext`` and helpers to read them.

``StateContext.indexes`` maps index id -> ``IndexRecord``; ``StateContext.index_topologies``
maps index id -> the index's topology history (index partition -> indexer node, ascending
``seq_num``, the last one current). Both are replicated with the rest of the state, so every
manager answers ``list_indexes`` from its own copy.

States (``docs/decisions/0036-index-ddl.md``)::

    INIT --allocate all slices--> READY --BUILD / not deferred--> BUILDING --pipeline--> ACTIVE
      \\                                                              |  ^
       `--allocation failed--> DELETED --> (removed)       MarkIndexError  BUILD INDEX
    DROP INDEX: any --> DELETED --drop slices--> (removed)          v  |
                                                                    ERROR

INIT and DELETED are transient: the op that entered them leaves them before it replies, and
a newly promoted master finishes them (``index_ddl.IndexDDL.recover``) before it serves ops.

Index ids embed the version of the state the CREATE was built on: ``<epoch>.<cas>.<random>``.
That lets an indexer decide, from nothing but a state and a slice's id, whether a missing
index was removed or the state is simply older than the index (``creation_base``): every
state of a version above the base either holds the index or was made after it was removed.
"""

from __future__ import annotations

from typing import Final

import msgspec

from shardex.core.topology import Topology
from shardex.meta.index_definition import IndexDefinition

__all__ = [
    "ACTIVE",
    "BUILDING",
    "DELETED",
    "ERROR",
    "INDEX_STATES",
    "INIT",
    "LIVE_STATES",
    "PRIMARY_NAME",
    "READY",
    "SERVING_STATES",
    "IndexRecord",
    "creation_base",
    "find_index",
    "find_primary",
    "latest_index_topology",
    "make_index_id",
    "state_rank",
]

INIT: Final = "INIT"
READY: Final = "READY"
BUILDING: Final = "BUILDING"
ACTIVE: Final = "ACTIVE"
DELETED: Final = "DELETED"
ERROR: Final = "ERROR"
INDEX_STATES: Final = (INIT, READY, BUILDING, ACTIVE, DELETED, ERROR)
# An indexer keeps the slices of these (ERROR keeps its slices: a new BUILD reuses them).
LIVE_STATES: Final = frozenset({INIT, READY, BUILDING, ACTIVE, ERROR})
# Every slice of an index in these states exists on its indexer (the DDL invariant).
SERVING_STATES: Final = frozenset({READY, BUILDING, ACTIVE})
PRIMARY_NAME: Final = "#primary"

_RANK = {INIT: 0, READY: 1, BUILDING: 2, ACTIVE: 3}


class IndexRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One index as the coordinator knows it.

    ``request_id`` / ``drop_request_id``: the client requests that created / are dropping
    it; a master that finishes the work after a failover records the reply under them, so
    the client's retry gets the answer instead of a second CREATE (or INDEX_NOT_FOUND).
    ``build_ts``, ``stability_ts``, ``items_count``, ``progress`` are written by the index
    pipeline through ``IndexBuildProgress`` / ``MarkIndexActive``, and an ACTIVE index's
    ``items_count`` by the timekeeper through ``RecordIndexItems``; timestamps in
    wire form (data partition -> (seqno, partition uuid)).
    """

    definition: IndexDefinition
    state: str
    error: str = ""
    defer_build: bool = False
    nodes: list[str] | None = None  # WITH {"nodes": ...}: the placement was pinned
    # WITH {"num_replica": n}: the configured copies per index partition beyond the first
    # (the topology's ``replicas`` may hold fewer after a node loss, until a rebalance).
    num_replica: int = 0
    request_id: str | None = None
    drop_request_id: str | None = None
    build_ts: dict[int, tuple[int, int]] | None = None
    stability_ts: dict[int, tuple[int, int]] | None = None
    items_count: int = 0
    progress: float = 0.0

    @property
    def id(self) -> str:
        return self.definition.id

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def keyspace(self) -> str:
        return self.definition.keyspace


def make_index_id(base_epoch: int, base_cas: int, unique: str) -> str:
    """``<epoch>.<cas>.<unique>``: see the module docstring."""
    return f"{base_epoch}.{base_cas}.{unique}"


def creation_base(index_id: str) -> tuple[int, int] | None:
    """The (epoch, cas) an index id was created on, or None for an id of another form (an
    indexer never drops such slices on its own)."""
    parts = index_id.split(".", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def find_index(indexes: dict[str, IndexRecord], keyspace: str, name: str) -> IndexRecord | None:
    """The index called ``name`` on ``keyspace`` (names are unique per keyspace)."""
    for rec in indexes.values():
        if rec.definition.keyspace == keyspace and rec.definition.name == name:
            return rec
    return None


def find_primary(indexes: dict[str, IndexRecord], keyspace: str) -> IndexRecord | None:
    for rec in indexes.values():
        if rec.definition.keyspace == keyspace and rec.definition.is_primary:
            return rec
    return None


def latest_index_topology(topologies: dict[str, list[Topology]], index_id: str) -> Topology | None:
    history = topologies.get(index_id)
    return history[-1] if history else None


def state_rank(state: str) -> int | None:
    """Order of the forward states (INIT < READY < BUILDING < ACTIVE); None for the rest."""
    return _RANK.get(state)

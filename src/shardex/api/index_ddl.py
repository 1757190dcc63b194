"""Index DDL ops (client -> any manager node -> the coordinator master) and their replies.

Every op carries an optional ``request_id``: the client makes one uuid per call and reuses it
on every retry, and the coordinator returns the stored reply for an id it already applied
(``coordinator.py``, "Dedup"). The pipeline hooks (``IndexBuildProgress``,
``MarkIndexActive``, ``MarkIndexError``) are for the index pipeline's build; see
``manager/index_ddl.py`` and ``docs/decisions/0036-index-ddl.md``.
"""

from __future__ import annotations

import re

import msgspec

from shardex.api.errors import BadRequest
from shardex.core.topology import Topology
from shardex.meta.index_definition import IndexKey
from shardex.meta.index_state import PRIMARY_NAME, IndexRecord
from shardex.net.messages import Message

__all__ = [
    "BuildIndex",
    "CreateIndex",
    "DropIndex",
    "DropIndexCopies",
    "IndexBuildProgress",
    "IndexCopiesDropped",
    "IndexCreated",
    "IndexDropped",
    "IndexUpdated",
    "IndexesBuilding",
    "MarkIndexActive",
    "MarkIndexError",
    "RecordIndexItems",
]


class CreateIndex(Message, tag="manager.CreateIndex"):
    """CREATE [PRIMARY] INDEX. ``num_partition`` None: 1 without ``partition_by``, else
    ``DEFAULT_PARTITIONED`` (8). ``nodes`` pins the placement to those indexers."""

    keyspace: str
    name: str | None = None  # None only for a primary index (named "#primary")
    keys: list[IndexKey] = msgspec.field(default_factory=list)
    where: str | None = None
    partition_by: list[str] | None = None
    num_partition: int | None = None
    defer_build: bool = False
    nodes: list[str] | None = None
    is_primary: bool = False
    request_id: str | None = None
    num_replica: int = 0  # copies of every index partition beyond the first, on other nodes


class IndexCreated(Message, tag="manager.IndexCreated"):
    index: IndexRecord  # as of the op's last commit (READY if deferred, else BUILDING)
    topology: Topology


class BuildIndex(Message, tag="manager.BuildIndex"):
    """BUILD INDEX: READY (deferred) or ERROR -> BUILDING; already building or active
    indexes are left alone and named in the reply."""

    keyspace: str
    names: list[str]
    request_id: str | None = None


class IndexesBuilding(Message, tag="manager.IndexesBuilding"):
    indexes: list[IndexRecord]  # every named index, as of the commit
    started: list[str]  # the names this request moved to BUILDING


class DropIndex(Message, tag="manager.DropIndex"):
    """DROP INDEX; ``name`` None with ``is_primary``: the keyspace's primary index."""

    keyspace: str
    name: str | None = None
    is_primary: bool = False
    request_id: str | None = None


class IndexDropped(Message, tag="manager.IndexDropped"):
    index_id: str
    keyspace: str
    name: str
    # indexers that did not confirm the drop: they drop the slices when they reconcile
    pending_nodes: list[str] = msgspec.field(default_factory=list)


class IndexBuildProgress(Message, tag="manager.IndexBuildProgress"):
    """Pipeline -> coordinator while an initial build runs (BUILDING only). Commits a new
    state each time: call it about once a second at most, not per micro-batch."""

    index_id: str
    progress: float  # 0.0 .. 1.0
    items_count: int = 0
    build_ts: dict[int, tuple[int, int]] | None = None  # the snapshot TS being loaded
    request_id: str | None = None


class MarkIndexActive(Message, tag="manager.MarkIndexActive"):
    """Pipeline -> coordinator: the initial build at ``build_ts`` is loaded in every slice
    and the index has joined the maintenance stream. BUILDING -> ACTIVE (idempotent for
    the same ``build_ts``)."""

    index_id: str
    build_ts: dict[int, tuple[int, int]]
    items_count: int = 0
    stability_ts: dict[int, tuple[int, int]] | None = None
    request_id: str | None = None


class RecordIndexItems(Message, tag="manager.RecordIndexItems"):
    """The timekeeper -> the master: an ACTIVE index's entries over all slices have moved
    away from ``IndexRecord.items_count`` (``manager/index_items.py``); record
    ``items_count``. A no-op (nothing committed) for another state or the same count."""

    index_id: str
    items_count: int
    request_id: str | None = None


class MarkIndexError(Message, tag="manager.MarkIndexError"):
    """Pipeline -> coordinator: the build failed. BUILDING -> ERROR; BUILD INDEX retries."""

    index_id: str
    error: str
    request_id: str | None = None


class IndexUpdated(Message, tag="manager.IndexUpdated"):
    index: IndexRecord


DEFAULT_PARTITIONED = 8  # num_partition of a PARTITION BY index that names none (as N1QL)


def check_index_name(name: object, *, primary: bool = False) -> str:
    if primary and name == PRIMARY_NAME:
        return PRIMARY_NAME
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"index name must be a non-empty string, got {name!r}",
            details={"name": repr(name), "hint": "CREATE INDEX name ON keyspace(...)"},
        )
    if len(name) > MAX_INDEX_NAME or not INDEX_NAME.fullmatch(name):
        raise BadRequest(
            f"invalid index name {name!r}",
            details={
                "name": name[:120],
                "hint": f"1-{MAX_INDEX_NAME} characters: a letter or _ first, then letters, "
                "digits, _ or -",
            },
        )
    return name


INDEX_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # fullmatch: "$" passes "x\n"


MAX_INDEX_NAME = 100


class DropIndexCopies(Message, tag="manager.DropIndexCopies"):
    """The timekeeper -> the master: these copies (index partition, node) missed a stability
    round that is about to be published without them; take them out of the index topology
    (a primary is replaced by its first remaining replica) so that no later round and no
    scan uses them. Never drops a partition's last copy. ``targets``: (index partition,
    node) of index-move targets (catching-up copies, not in the topology) that did not
    answer the round: their moves fail."""

    index_id: str
    copies: list[tuple[int, str]]
    ts: dict[int, tuple[int, int]] | None = None  # the round's TS (for the log)
    request_id: str | None = None
    targets: list[tuple[int, str]] = msgspec.field(default_factory=list)


class IndexCopiesDropped(Message, tag="manager.IndexCopiesDropped"):
    index_id: str
    topology: Topology  # the latest topology after the op
    dropped: list[tuple[int, str]]  # the copies this op took out (already gone: not listed)
    failed_moves: list[str] = msgspec.field(
        default_factory=list
    )  # migration ids of the index moves this op failed

"""What the pipeline driver knows of a keyspace's indexes, and which ones the stream maintains.

The coordinator state says which indexes exist and where their slices live; the driver adds
what only it knows: which indexes have *joined* the maintenance stream (their slices hold an
applied TS the stream can continue from), that applied TS (the lowest over the slices), and
the index's *ahead* TS: the highest TS any of its slices may have applied (the highest over
the slices at start, raised by every stabilise this driver attempts, ``attempted``), which a
batch's stabilise must reach so that no slice is asked to go back (``docs/decisions/
0074-stability-rounds-between-batches.md``).

Rules (``docs/decisions/0029-index-pipeline-micro-batch.md``):

* An ACTIVE index is maintained. A BUILDING index is maintained once its initial build has
  loaded every slice (applied TS = the build's T0); before that the stream leaves it out.
* At start (and after a restart of the driver) an index's applied TS is read from its
  slices: every slice active => joined at the lowest applied TS; otherwise it needs a build.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardex.api.index import SliceInfo
from shardex.client import Client
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.core.topology import Topology
from shardex.index.records import STATE_ACTIVE
from shardex.meta.index_definition import IndexDefinition
from shardex.meta.index_rebalance_state import routed_targets
from shardex.meta.index_state import ACTIVE, BUILDING, IndexRecord, latest_index_topology
from shardex.pipeline.indexers import index_state, list_slices
from shardex.pipeline.project.router import IndexRoute

__all__ = ["IndexRegistry", "IndexView", "max_applied", "min_applied"]

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 0.5  # seconds between coordinator-state reads on the batch path


@dataclass(frozen=True)
class IndexView:
    record: IndexRecord
    topology: Topology
    # index partition -> target of its move (routed to both ends; ``index_rebalance_state``)
    moving: Mapping[int, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def definition(self) -> IndexDefinition:
        return self.record.definition

    @property
    def nodes(self) -> list[str]:
        """Every node holding a slice of the index: primaries and replica copies."""
        return self.topology.copy_nodes()

    def route(self) -> IndexRoute:
        return IndexRoute.of(self.definition, self.topology, self.moving)

    def slices(self) -> list[tuple[str, int, str]]:
        """(index id, index partition, node) of every slice, replica copies included."""
        return [(self.id, p, n) for p, n in self.copies()]

    def copies(self) -> list[tuple[int, str]]:
        """(index partition, node) of every copy: each partition's primary, then its replicas."""
        topo = self.topology
        return [(p, n) for p in sorted(topo.assignment) for n in topo.chain(p)]


def min_applied(infos: list[SliceInfo]) -> Timestamp:
    """Per data partition the lowest applied seqno over the slices (a partition a slice
    has never seen counts as 0)."""
    tss = [Timestamp.from_wire(s.applied) for s in infos]
    parts = {p for t in tss for p in t}
    out: dict[int, SeqnoEntry] = {}
    for p in parts:
        low = min((t.get(p, SeqnoEntry(0, 0)) for t in tss), key=lambda e: e.seqno)
        out[p] = low
    return Timestamp(out)


def max_applied(infos: list[SliceInfo]) -> Timestamp:
    """Per data partition the highest applied seqno over the slices: how far a stabilise
    that reached only some slices (a round that failed half way) may have taken them."""
    out: dict[int, SeqnoEntry] = {}
    for s in infos:
        for p, e in Timestamp.from_wire(s.applied).items():
            if p not in out or e.seqno > out[p].seqno:
                out[p] = e
    return Timestamp(out)


class IndexRegistry:
    """The indexes of one keyspace as the driver sees them. Thread-safe (the build thread
    joins indexes while the stream's batches read them)."""

    def __init__(self, client: Client, keyspace: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self._lock = threading.Lock()
        self._views: dict[str, IndexView] = {}
        self._joined: dict[str, Timestamp] = {}
        # The highest TS a slice of the index may have applied, when above ``_joined``.
        self._ahead: dict[str, Timestamp] = {}
        self._checked: set[str] = set()  # indexes whose slices were inspected at start
        self._fetched_at = 0.0
        self._cas = -1  # of the state the views come from: never replaced by an older one
        self.keyspace_uuid: str | None = None
        self.timekeeper = ""  # the coordinator master: where stabilise rounds go

    # -- state ---------------------------------------------------------------------------------
    def refresh(self, *, force: bool = False) -> dict[str, IndexView]:
        now = time.monotonic()
        if not force and now - self._fetched_at < REFRESH_INTERVAL:
            return self.views()
        state = index_state(self.client)
        meta = state.keyspaces.get(self.keyspace)
        views: dict[str, IndexView] = {}
        routed = routed_targets(state.rebalance.index_moves if state.rebalance else [])
        for rec in state.indexes.values():
            if rec.keyspace != self.keyspace or rec.state not in (BUILDING, ACTIVE):
                continue
            topo = latest_index_topology(state.index_topologies, rec.id)
            if topo is not None:
                views[rec.id] = IndexView(rec, topo, routed.get(rec.id, {}))
        with self._lock:
            if state.cas < self._cas:
                # A slower concurrent refresh: a batch must never route with an older view
                # than an earlier batch or idle round did (``rounds/moves.py``).
                return dict(self._views)
            self._cas = state.cas
            self._views = views
            self.keyspace_uuid = None if meta is None else meta.uuid
            self.timekeeper = state.master
            for gone in set(self._joined) - set(views):
                del self._joined[gone]
                self._ahead.pop(gone, None)
            self._fetched_at = now
        self._inspect_new(views)
        return dict(views)

    def views(self) -> dict[str, IndexView]:
        with self._lock:
            return dict(self._views)

    def _inspect_new(self, views: dict[str, IndexView]) -> None:
        """First sight of an index: join it if every slice is already loaded (a driver
        restart, or a build that finished before the driver died)."""
        for view in views.values():
            if view.id in self._checked:
                continue
            try:
                infos = list_slices(self.client, view.nodes, view.id)
            except Exception as exc:  # an indexer is down: look again next refresh
                log.info("cannot inspect the slices of %s yet: %s", view.id, exc)
                continue
            self._checked.add(view.id)
            # A moving partition's target holds a copy still loading: not the index's state.
            infos = [s for s in infos if s.partition not in view.moving or s.state == STATE_ACTIVE]
            parts = {s.partition for s in infos}
            loaded = parts == set(view.topology.assignment) and all(
                s.state == STATE_ACTIVE for s in infos
            )
            if loaded:
                self.join(view.id, min_applied(infos), ahead=max_applied(infos))
                log.info("index %s joins the stream at its slices' applied TS", view.id)

    # -- the stream's set ----------------------------------------------------------------------
    def join(self, index_id: str, applied: Timestamp, *, ahead: Timestamp | None = None) -> None:
        with self._lock:
            self._joined[index_id] = applied
            if ahead is None:
                self._ahead.pop(index_id, None)
            else:
                self._ahead[index_id] = ahead

    def maintained(self) -> list[IndexView]:
        with self._lock:
            return [v for i, v in sorted(self._views.items()) if i in self._joined]

    def needs_build(self) -> list[IndexView]:
        """Indexes the stream does not maintain (inspected, not loaded): BUILDING ones, and
        ACTIVE ones whose slices a rollback sent to ``needs_rebuild``."""
        with self._lock:
            return [
                v
                for i, v in sorted(self._views.items())
                if i not in self._joined and i in self._checked
            ]

    def applied(self, index_id: str) -> Timestamp:
        with self._lock:
            return self._joined[index_id]

    def ahead(self, index_id: str) -> Timestamp:
        """The highest TS any slice of the index may have applied (at least ``applied``)."""
        with self._lock:
            applied = self._joined[index_id]
            ahead = self._ahead.get(index_id)
        return applied if ahead is None else applied.merge_max(ahead)

    def attempted(self, index_ids: list[str], ts: Timestamp) -> None:
        """A stabilise at ``ts`` is about to reach these indexes' slices (some may apply it
        even if the round then fails): a later stabilise must not be below it."""
        with self._lock:
            for i in index_ids:
                if i in self._joined:
                    before = self._ahead.get(i)
                    self._ahead[i] = ts if before is None else before.merge_max(ts)

    def advanced(self, index_ids: list[str], ts: Timestamp) -> None:
        """``ts`` is published for these indexes: every slice has applied it."""
        with self._lock:
            for i in index_ids:
                if i in self._joined:
                    self._joined[i] = self._joined[i].merge_max(ts)

    def rebase(self, partition: int, old_uuid: int, new_uuid: int, upto: int) -> None:
        """``partition`` continues on branch ``new_uuid``, whose history equals ``old_uuid``'s
        up to seqno ``upto`` at least (checked by the caller, ``branches.py``): applied and
        ahead entries on the old uuid at or below it name the new one."""

        def moved(ts: Timestamp) -> Timestamp:
            entry = ts.get(partition)
            if entry is None or entry.uuid != old_uuid or entry.seqno > upto:
                return ts
            wire = dict(ts.to_wire())
            wire[partition] = (entry.seqno, new_uuid)
            return Timestamp.from_wire(wire)

        with self._lock:
            self._joined = {i: moved(t) for i, t in self._joined.items()}
            self._ahead = {i: moved(t) for i, t in self._ahead.items()}

    def forget(self, index_id: str) -> None:
        """The index must be built again (rollback, or its slices were lost)."""
        with self._lock:
            self._joined.pop(index_id, None)
            self._ahead.pop(index_id, None)
            self._checked.discard(index_id)

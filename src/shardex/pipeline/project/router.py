"""Router core: key versions -> per-indexer-node batches. Pure functions, no network.

Destinations (``mutation-flow.md`` and the pipeline notes, "Router and moving keys"):

* ``UPSERT`` -> the node owning its index partition. When the index's partition key can
  change (``PARTITION BY HASH(expr)`` with expr not the docid), the entry may have lived in
  another slice before, and the projector does not know the old value, so the router also
  sends an ``UPSERT_DELETION`` for the same (docid, partition, seqno) to **every other
  slice**. Each slice's back index turns one for a docid it does not hold into nothing.
* ``UPSERT_DELETION`` / ``DELETE`` with a known slice (unpartitioned, or partitioned by docid)
  -> that slice's owner only. With ``BROADCAST`` (-1) -> **every slice** of the index.
* ``ERROR`` rows (inline error reports) are never routed; they are counted.
* Every row for slice p also goes to p's replica copies (``Topology.replicas``: the same
  index partition on other nodes) and to the target of p's move, if any: a copy receives
  exactly the rows its primary does, so both stabilise to the same entries at one TS.

Every row that leaves the router names a concrete slice (index id + index partition), so an
indexer node enqueues each row into exactly one of its slices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index.keyversion import BROADCAST, ERROR, UPSERT, UPSERT_DELETION, KeyVersion
from shardex.meta.index_definition import IndexDefinition, partition_key_is_docid

__all__ = ["IndexRoute", "RouteResult", "frames", "route", "routes_for"]

_UNSET: object = object()


@dataclass(frozen=True, slots=True)
class IndexRoute:
    """Placement of one index: index partition -> indexer node, and whether entries move."""

    index_id: str
    num_partition: int
    owners: tuple[str, ...]  # owners[p] = node hosting slice p
    moving: bool
    # index partition -> the target of its move: every row for slice p goes there too (the
    # target's catching-up copy, ``shardex.index.slice_copy``)
    also: Mapping[int, str] = field(default_factory=dict)
    # index partition -> the nodes of its replica copies (every row for p goes there too)
    replicas: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def extra(self) -> dict[int, tuple[str, ...]]:
        """index partition -> every node besides its owner that receives its rows."""
        out = {p: tuple(ns) for p, ns in self.replicas.items() if ns}
        for p, node in self.also.items():
            if node not in out.get(p, ()):
                out[p] = (*out.get(p, ()), node)
        return out

    @classmethod
    def of(
        cls,
        defn: IndexDefinition,
        topology: Topology | Mapping[int, str],
        also: Mapping[int, str] | None = None,
    ) -> IndexRoute:
        assignment = topology.assignment if isinstance(topology, Topology) else topology
        replicas = topology.replicas if isinstance(topology, Topology) else {}
        try:
            owners = tuple(assignment[p] for p in range(defn.num_partition))
        except KeyError as exc:
            raise ShardexError(
                f"index {defn.id} partition {exc.args[0]} has no indexer node",
                code=ErrorCode.BAD_REQUEST,
                details={"index": defn.id, "partition": exc.args[0]},
            ) from None
        return cls(
            defn.id,
            defn.num_partition,
            owners,
            not partition_key_is_docid(defn),
            dict(also or {}),
            {p: tuple(ns) for p, ns in replicas.items() if ns},
        )


def routes_for(
    definitions: Iterable[IndexDefinition], topologies: Mapping[str, Topology | Mapping[int, str]]
) -> dict[str, IndexRoute]:
    """``IndexRoute`` per index id from the definitions and each index's topology."""
    return {d.id: IndexRoute.of(d, topologies[d.id]) for d in definitions}


@dataclass(slots=True)
class RouteResult:
    """Rows per destination node (each row with a concrete slice) and what was not routed."""

    by_node: dict[str, list[KeyVersion]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # ERROR rows per index id

    def rows_for(self, node: str) -> list[KeyVersion]:
        return self.by_node.get(node, [])


def route(rows: Iterable[KeyVersion], routes: Mapping[str, IndexRoute]) -> RouteResult:
    """Group key versions by destination node, expanding broadcasts to concrete slices.

    Row order per node follows input order, so a node receives each data partition's key
    versions in the order the projector emitted them (not required for correctness: slices
    deduplicate and order by seqno, but it keeps queues cheap).
    """
    res = RouteResult()
    by_node = res.by_node
    lists: dict[str, list[KeyVersion]] = {}

    def dest(node: str) -> list[KeyVersion]:
        lst = lists.get(node)
        if lst is None:
            lst = lists[node] = by_node[node] = []
        return lst

    extras: dict[str, dict[int, tuple[str, ...]]] = {}  # per index, built once per call
    # Per index whose rows go to one node each (no copies, no move target, entries never
    # move between slices): slice -> the append of its owner's list (bound at the slice's
    # first row, so ``by_node`` still lists only nodes with rows, in first-row order). Such
    # an index's row with a known slice (the common case: an Upsert, or a removal of an
    # index partitioned by docid or not at all) is routed with one call; every other row
    # takes the general loop below.
    direct: dict[str, list[Callable[[KeyVersion], None] | None] | None] = {}

    for row in rows:
        index_id, ip, kind = row[0], row[1], row[2]
        if ip >= 0 and kind != ERROR:
            appends = direct.get(index_id, _UNSET)
            if appends is _UNSET:
                r = routes.get(index_id)
                appends = direct[index_id] = (
                    [None] * r.num_partition
                    if r is not None and not r.moving and not r.also and not r.replicas
                    else None
                )
            if appends is not None:
                add = appends[ip]  # type: ignore[index]
                if add is None:
                    add = appends[ip] = dest(routes[index_id].owners[ip]).append  # type: ignore[index]
                add(row)
                continue
        _, _, _, _entry, docid, part, seqno = row
        if kind == ERROR:
            res.errors[index_id] = res.errors.get(index_id, 0) + 1
            continue
        r = routes.get(index_id)
        if r is None:
            raise ShardexError(
                f"no route for index {index_id}",
                code=ErrorCode.INDEX_NOT_FOUND,
                details={"index": index_id},
            )
        owners = r.owners
        # Replica copies and a moving partition's target: its rows go to every copy.
        also = extras.get(index_id)
        if also is None:
            also = extras[index_id] = r.extra() if (r.also or r.replicas) else {}
        if kind == UPSERT:
            dest(owners[ip]).append(row)
            if also and ip in also:
                for n in also[ip]:
                    dest(n).append(row)
            if r.moving:
                for q in range(r.num_partition):
                    if q != ip:
                        kv = (index_id, q, UPSERT_DELETION, b"", docid, part, seqno)
                        dest(owners[q]).append(kv)
                        if also and q in also:
                            for n in also[q]:
                                dest(n).append(kv)
        elif ip == BROADCAST:
            for q in range(r.num_partition):
                kv = (index_id, q, kind, b"", docid, part, seqno)
                dest(owners[q]).append(kv)
                if also and q in also:
                    for n in also[q]:
                        dest(n).append(kv)
        else:
            dest(owners[ip]).append(row)
            if also and ip in also:
                for n in also[ip]:
                    dest(n).append(row)
    return res


def frames(rows: list[KeyVersion], max_rows: int = 65536) -> Iterator[list[KeyVersion]]:
    """Split one node's rows into frames of at most ``max_rows`` (large frames, few sends)."""
    for i in range(0, len(rows), max_rows):
        yield rows[i : i + max_rows]

"""The expected load of index slices: what placement and the index rebalance balance.

An indexer's work is the key versions it applies and the entries it keeps, and every index of
a keyspace sees each of the keyspace's mutations. So an index's load does not depend on how
many slices it has: a slice of an index partitioned N ways carries about 1/N of it (hash
partitioning spreads documents evenly), an unpartitioned index's one slice all of it.
Counting slices instead put an unpartitioned index's whole load on a par with one eighth of a
partitioned one's, and left one indexer holding most key versions.

The weight of an index, in integer units (exact sums, so every master plans the same moves
from the same state), is ``UNIT`` for an index nothing is known about, ``ARRAY_FACTOR`` times
that for an array index (one entry per element: more bytes and entries per document). Where
the cluster has measured an index (``IndexRecord.items_count``: entries over all its slices,
written by the build, then by the timekeeper as it drifts: ``manager/index_items.py``), the
measured indexes share ``UNIT`` per index among them in proportion to their entries: a
measured index twice the average weighs ``2 * UNIT``, and an unmeasured one is taken for an
average one. A slice's weight is its index's weight divided by
the index's partition count (at least 1); every copy of a partition (replicas too) weighs the
same, since each applies every key version of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from shardex.core.topology import Topology
from shardex.meta.index_definition import IndexDefinition
from shardex.meta.index_state import DELETED, IndexRecord

__all__ = [
    "ARRAY_FACTOR",
    "UNIT",
    "copies_load",
    "expected_weight",
    "index_weights",
    "slice_weight",
    "slice_weights",
]

UNIT = 1_000_000  # the load of one average index
ARRAY_FACTOR = 2  # an unmeasured array index against an unmeasured scalar one


def index_weights(indexes: Mapping[str, IndexRecord]) -> dict[str, int]:
    """index id -> the load of the whole index in units (module docstring), for every index
    that is not being dropped."""
    live = {i: r for i, r in indexes.items() if r.state != DELETED}
    measured = {i: r.items_count for i, r in live.items() if r.items_count > 0}
    total = sum(measured.values())
    out: dict[str, int] = {}
    for index_id, rec in live.items():
        if index_id in measured:
            out[index_id] = max(1, UNIT * measured[index_id] * len(measured) // total)
        else:
            out[index_id] = expected_weight(rec.definition)
    return out


def expected_weight(definition: IndexDefinition) -> int:
    """The load of an index nothing has been measured of (a new one)."""
    return UNIT * (ARRAY_FACTOR if definition.array_pos >= 0 else 1)


def slice_weight(index_weight: int, num_partition: int) -> int:
    """The load of one copy of one partition of an index weighing ``index_weight``."""
    return max(1, index_weight // max(1, num_partition))


def slice_weights(indexes: Mapping[str, IndexRecord]) -> dict[str, int]:
    """index id -> the load of one copy of one of its slices, for every index that is not
    being dropped."""
    return {
        index_id: slice_weight(w, indexes[index_id].definition.num_partition)
        for index_id, w in index_weights(indexes).items()
    }


def copies_load(
    indexes: Mapping[str, IndexRecord],
    topologies: Mapping[str, list[Topology]],
    counts: Callable[[IndexRecord], bool],
) -> Counter[str]:
    """Units per node over every copy (primary and replicas) in the latest topology of the
    indexes ``counts`` accepts (never one being dropped)."""
    weights = slice_weights(indexes)
    load: Counter[str] = Counter()
    for index_id in sorted(indexes):
        rec = indexes[index_id]
        history = topologies.get(index_id)
        if not history or index_id not in weights or not counts(rec):
            continue
        topo = history[-1]
        for p in topo.assignment:
            for node in topo.chain(p):
                load[node] += weights[index_id]
    return load

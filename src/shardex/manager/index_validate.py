"""CREATE INDEX before anything is created: validation and placement (pure functions).

``validate_create`` refuses a definition that cannot work with the error the issue names
(KEYSPACE_NOT_FOUND, INDEX_EXISTS, EXPRESSION_SYNTAX / BAD_REQUEST for expressions,
BAD_REQUEST for partition counts and nodes, NODE_UNAVAILABLE when no indexer is up), each
with ``details`` naming the bad part and, where there is one, a ``hint``. It runs on the
master under the op lock, so the checks and the INIT commit see one state.

Placement (``place_partitions``): index partitions go to the up indexers by load, not by
slice count (``meta/slice_weight.py``): every copy of a slice weighs its index's load divided
by its partition count, and each partition goes to the node with the least load so far over
every index that is not being dropped, then the fewest slices of this index, then the name.
An unpartitioned index thus goes to the least loaded node, and a partitioned one fills the
nodes that carry less, spreading over them as they even out. ``nodes`` pins the placement:
the partitions are dealt round-robin over exactly those nodes, least loaded first, and every
named node gets at least one slice (so more nodes than slices is refused).

Replicas (``num_replica``, ``place_replicas``): each index partition's replica copies go, one
rank at a time, to the candidate that holds no copy of that partition yet and the fewest
slices of this index, then the least load over all live indexes (primaries and replicas;
ties by name), so every pinned node gets a slice when there are enough.
A partition's copies are thus on distinct nodes, and a node's count of this index's slices
stays within one of the others' where that rule allows. Fewer candidates than copies is
refused (a second copy on one node protects nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shardex.api.errors import BadRequest, KeyspaceNotFound
from shardex.api.index_ddl import DEFAULT_PARTITIONED, CreateIndex, check_index_name
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.meta.index_definition import (
    DOCID_EXPR,
    MAX_INDEX_PARTITIONS,
    IndexDefinition,
    IndexKey,
    check_num_replica,
    validate_definition,
)
from shardex.meta.index_state import (
    PRIMARY_NAME,
    find_index,
    find_primary,
)
from shardex.meta.slice_weight import copies_load, expected_weight, slice_weight
from shardex.meta.state import StateContext

__all__ = [
    "CreatePlan",
    "place_partitions",
    "place_replicas",
    "slice_load",
    "validate_create",
]

_PENDING_ID = "pending"  # validate_definition needs an id; the real one comes after


@dataclass(frozen=True)
class CreatePlan:
    definition: IndexDefinition  # canonical, id still a placeholder
    assignment: dict[int, str]  # index partition -> indexer node
    defer_build: bool
    nodes: list[str] | None
    num_replica: int = 0
    replicas: dict[int, list[str]] = field(default_factory=dict)  # partition -> replica nodes


def _num_partition(msg: CreateIndex) -> int:
    n = msg.num_partition
    if n is None:
        return 1 if msg.partition_by is None else DEFAULT_PARTITIONED
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INDEX_PARTITIONS:
        raise BadRequest(
            f"num_partition must be an integer in 1..{MAX_INDEX_PARTITIONS}, got {n!r}",
            details={
                "num_partition": repr(n),
                "max": MAX_INDEX_PARTITIONS,
                "hint": "fewer partitions than indexer cores is usually plenty",
            },
        )
    if msg.partition_by is None and n != 1:
        raise BadRequest(
            f"num_partition is {n} but the index has no PARTITION BY: an unpartitioned index "
            "has exactly one partition",
            details={
                "num_partition": n,
                "hint": "add PARTITION BY HASH(META().id) (partition_by=['META().id']), or "
                "drop num_partition",
            },
        )
    return n


def _check_replicas(num_replica: int, candidates: Sequence[str], pinned: bool) -> None:
    if num_replica + 1 <= len(set(candidates)):
        return
    where = "named in nodes" if pinned else "up"
    raise BadRequest(
        f"num_replica {num_replica} needs {num_replica + 1} indexers for the copies of each "
        f"partition, but only {len(set(candidates))} are {where}",
        details={
            "num_replica": num_replica,
            "indexers": sorted(set(candidates)),
            "hint": "lower num_replica, or start (or name) more indexers",
        },
    )


def _check_nodes(
    nodes: list[str] | None, n: int, indexers: Sequence[str], up: Sequence[str]
) -> list[str] | None:
    if nodes is None:
        return None
    if isinstance(nodes, str) or not isinstance(nodes, list) or not nodes:
        raise BadRequest(
            f"nodes must be a non-empty list of node names, got {nodes!r}",
            details={"nodes": repr(nodes), "hint": 'WITH {"nodes": ["node1", "node2"]}'},
        )
    if len(set(nodes)) != len(nodes):
        raise BadRequest(f"nodes lists a node twice: {nodes}", details={"nodes": nodes})
    for node in nodes:
        if node not in indexers:
            raise BadRequest(
                f"node {node!r} is not an indexer",
                details={
                    "node": node,
                    "indexers": sorted(indexers),
                    "hint": "name nodes that run the index service (shardex cluster status)",
                },
            )
        if node not in up:
            raise BadRequest(
                f"indexer {node!r} is down",
                details={
                    "node": node,
                    "up_indexers": sorted(up),
                    "hint": "name indexers that are up, or leave nodes out to place the index "
                    "on the ones that are",
                },
            )
    if len(nodes) > n:
        raise BadRequest(
            f"nodes names {len(nodes)} indexers but the index has {n} slice(s): every "
            "named node must host at least one",
            details={
                "nodes": nodes,
                "slices": n,
                "hint": "raise num_partition or num_replica",
            },
        )
    return list(nodes)


def _check_primary(msg: CreateIndex, name: str) -> None:
    if msg.where is not None:
        raise BadRequest("a primary index has no WHERE clause", details={"name": name})
    keys = list(msg.keys)
    if keys and [(k.expr.strip(), k.desc) for k in keys] != [(DOCID_EXPR, False)]:
        raise BadRequest(
            "a primary index takes no keys (its key is META().id)", details={"name": name}
        )


def _definition(msg: CreateIndex, name: str, n: int) -> IndexDefinition:
    keys = [IndexKey(expr=DOCID_EXPR)] if msg.is_primary else list(msg.keys)
    defn = IndexDefinition(
        id=_PENDING_ID,
        name=name,
        keyspace=msg.keyspace,
        keys=keys,
        where=msg.where,
        partition_by=list(msg.partition_by) if msg.partition_by is not None else None,
        num_partition=n,
        is_primary=msg.is_primary,
    )
    try:
        return validate_definition(defn)
    except ShardexError as e:
        e.details.setdefault("keyspace", msg.keyspace)
        e.details.setdefault("index", name)
        if e.code is ErrorCode.EXPRESSION_SYNTAX:
            e.details.setdefault("hint", "index expressions use the SQL++ expression language")
        raise


def validate_create(
    msg: CreateIndex, state: StateContext, indexers: Sequence[str], up: Sequence[str]
) -> CreatePlan:
    """Every check of a CREATE INDEX, then the placement. ``indexers``: every member that
    runs the index service; ``up``: those up in the master's view."""
    keyspace = msg.keyspace
    if keyspace not in state.keyspaces:
        raise KeyspaceNotFound(
            f"keyspace {keyspace!r} not found",
            details={
                "keyspace": keyspace,
                "keyspaces": sorted(state.keyspaces)[:20],
                "hint": "create it first (shardex keyspace create)",
            },
        )
    if msg.is_primary:
        name = check_index_name(msg.name or PRIMARY_NAME, primary=True)
        _check_primary(msg, name)
        old = find_primary(state.indexes, keyspace)
        if old is not None:
            raise ShardexError(
                f"keyspace {keyspace!r} already has a primary index ({old.name!r})",
                code=ErrorCode.INDEX_EXISTS,
                details={"keyspace": keyspace, "name": old.name, "state": old.state},
            )
    else:
        name = check_index_name(msg.name)
    old = find_index(state.indexes, keyspace, name)
    if old is not None:
        raise ShardexError(
            f"index {name!r} already exists on {keyspace!r} (state {old.state})",
            code=ErrorCode.INDEX_EXISTS,
            details={"keyspace": keyspace, "name": name, "state": old.state, "id": old.id},
        )
    if not isinstance(msg.defer_build, bool):
        raise BadRequest(
            f"defer_build must be true or false, got {msg.defer_build!r}",
            details={"defer_build": repr(msg.defer_build)},
        )
    n = _num_partition(msg)
    definition = _definition(msg, name, n)
    num_replica = check_num_replica(msg.num_replica)
    nodes = _check_nodes(msg.nodes, n * (1 + num_replica), indexers, up)
    if nodes is None and not up:
        raise NodeUnavailable(
            "no indexer is up to place the index on",
            details={
                "reason": "no_indexer",
                "keyspace": keyspace,
                "indexers": sorted(indexers),
                "hint": "start a node with the index service",
            },
        )
    candidates = nodes if nodes is not None else up
    _check_replicas(num_replica, candidates, nodes is not None)
    load = slice_load(state)
    weight = slice_weight(expected_weight(definition), n)
    assignment = place_partitions(n, candidates, load, nodes, weight=weight)
    replicas = place_replicas(assignment, num_replica, candidates, load, weight=weight)
    return CreatePlan(
        definition=definition,
        assignment=assignment,
        defer_build=msg.defer_build,
        nodes=nodes,
        num_replica=num_replica,
        replicas=replicas,
    )


def slice_load(state: StateContext) -> Counter[str]:
    """Load per node (``slice_weight`` units) over every copy of every index that is not
    being dropped (latest topologies)."""
    return copies_load(state.indexes, state.index_topologies, lambda _rec: True)


def place_partitions(
    num_partition: int,
    candidates: Iterable[str],
    load: Counter[str],
    pinned: Sequence[str] | None = None,
    *,
    weight: int,
) -> dict[int, str]:
    """See the module docstring: ``load`` per node and ``weight`` per slice of the new index
    in the same units. Deterministic for a given state and membership view."""
    nodes = sorted(set(candidates))
    if not nodes:
        raise ShardexError("no nodes to place the index on", code=ErrorCode.BAD_REQUEST)
    if pinned is not None:
        order = sorted(nodes, key=lambda n: (load[n], n))
        return {p: order[p % len(order)] for p in range(num_partition)}
    total = Counter({n: load[n] for n in nodes})
    mine: Counter[str] = Counter()  # this index's slices per node
    assignment: dict[int, str] = {}
    for p in range(num_partition):
        node = min(nodes, key=lambda n: (total[n], mine[n], n))
        assignment[p] = node
        total[node] += weight
        mine[node] += 1
    return assignment


def place_replicas(
    assignment: dict[int, str],
    num_replica: int,
    candidates: Iterable[str],
    load: Counter[str],
    *,
    weight: int,
) -> dict[int, list[str]]:
    """Replica nodes per index partition (module docstring); {} without replicas.
    ``load`` is not changed. Deterministic for a given state and membership view."""
    if num_replica <= 0:
        return {}
    nodes = sorted(set(candidates))
    total = Counter({n: load[n] for n in nodes})
    mine = Counter(assignment.values())  # this index's slices per node
    for node, k in mine.items():
        total[node] += weight * k
    replicas: dict[int, list[str]] = {p: [] for p in sorted(assignment)}
    for _rank in range(num_replica):
        for p in sorted(assignment):
            taken = {assignment[p], *replicas[p]}
            free = [n for n in nodes if n not in taken]
            if not free:
                continue  # too few nodes: refused before placement by validate_create
            node = min(free, key=lambda n: (mine[n], total[n], n))
            replicas[p].append(node)
            total[node] += weight
            mine[node] += 1
    _even_out(assignment, replicas, nodes, mine)
    return replicas


def _even_out(
    assignment: dict[int, str],
    replicas: dict[int, list[str]],
    nodes: list[str],
    mine: Counter[str],
) -> None:
    """Move replicas from the node with the most slices of this index to the one with the
    fewest while they differ by more than one: the greedy pass can leave the last partitions
    only nodes already full (three partitions on three nodes, one replica each)."""
    for _ in range(sum(len(r) for r in replicas.values())):
        hi = max(nodes, key=lambda n: (mine[n], n))
        lo = min(nodes, key=lambda n: (mine[n], n))
        if mine[hi] - mine[lo] <= 1:
            return
        movable = [
            p
            for p in sorted(replicas)
            if hi in replicas[p] and lo != assignment[p] and lo not in replicas[p]
        ]
        if not movable:
            return
        p = movable[0]
        replicas[p] = [lo if n == hi else n for n in replicas[p]]
        mine[hi] -= 1
        mine[lo] += 1

"""Topologies: numbered placement maps, and the history that keeps every one published.

One ``Topology`` type serves both placements the brief names: data partitions -> data node
and index partitions -> indexer node. Every change publishes ``seq_num + 1``; the history
keeps them all because a paginated query pins its *base* topology by number for its whole
life (``elastic-all-shard-queries.md``), however many rebalances happen meanwhile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from shardex.errors import ErrorCode, ShardexError


class Topology(msgspec.Struct, frozen=True, kw_only=True):
    seq_num: int
    assignment: dict[int, str]  # partition -> node name (the active copy)
    # partition -> the nodes holding its replica copies, in promotion order (data topologies
    # of keyspaces with replicas; empty otherwise). Never the partition's active node.
    replicas: dict[int, list[str]] = {}

    def chain(self, partition: int) -> list[str]:
        """The partition's copies: the active node first, then its replicas."""
        return [self.owner(partition), *self.replicas.get(partition, ())]

    def replicas_of(self, node: str) -> list[int]:
        """The partitions ``node`` holds a replica copy of."""
        return sorted(p for p, nodes in self.replicas.items() if node in nodes)

    def copies_of(self, node: str) -> list[int]:
        """The partitions ``node`` holds any copy of (active or replica)."""
        return sorted({*self.partitions_of(node), *self.replicas_of(node)})

    def copy_nodes(self) -> list[str]:
        """Every node holding a copy of some partition (actives and replicas)."""
        return sorted(
            {*self.assignment.values(), *(n for ns in self.replicas.values() for n in ns)}
        )

    def owner(self, partition: int) -> str:
        try:
            return self.assignment[partition]
        except KeyError:
            raise ShardexError(
                f"partition {partition} is not in topology {self.seq_num}",
                code=ErrorCode.BAD_REQUEST,
                details={"partition": partition, "seq_num": self.seq_num},
            ) from None

    def partitions_of(self, node: str) -> list[int]:
        return sorted(p for p, n in self.assignment.items() if n == node)

    def nodes(self) -> list[str]:
        """The nodes holding an active copy."""
        return sorted(set(self.assignment.values()))

    def moved_since(self, base: Topology) -> dict[int, tuple[str, str]]:
        """partition -> (node in base, node now) for every partition whose owner changed."""
        return {
            p: (base.assignment[p], n)
            for p, n in self.assignment.items()
            if p in base.assignment and base.assignment[p] != n
        }

    def with_moves(self, moves: Mapping[int, str]) -> Topology:
        """The next topology (``seq_num + 1``) with ``moves`` (partition -> new node) applied."""
        assignment = dict(self.assignment)
        for p, node in moves.items():
            if p not in assignment:
                raise ShardexError(
                    f"cannot move unknown partition {p}",
                    code=ErrorCode.BAD_REQUEST,
                    details={"partition": p, "seq_num": self.seq_num},
                )
            assignment[p] = node
        # A replica on the node the active moves to would be a second copy on one node.
        replicas = {
            p: [n for n in nodes if n != assignment[p]] for p, nodes in self.replicas.items()
        }
        return Topology(seq_num=self.seq_num + 1, assignment=assignment, replicas=replicas)


def balanced_assignment(num_partitions: int, nodes: Sequence[str]) -> dict[int, str]:
    """Round-robin over the nodes in sorted order: counts differ by at most one."""
    if num_partitions <= 0:
        raise ShardexError(
            f"num_partitions must be positive, got {num_partitions}",
            code=ErrorCode.BAD_REQUEST,
            details={"value": num_partitions},
        )
    if not nodes:
        raise ShardexError("no nodes to place partitions on", code=ErrorCode.BAD_REQUEST)
    ordered = sorted(set(nodes))
    return {p: ordered[p % len(ordered)] for p in range(num_partitions)}


def rebalance_moves(assignment: Mapping[int, str], nodes: Iterable[str]) -> dict[int, str]:
    """The fewest moves that leave every node in ``nodes`` within one partition of the others.

    Partitions on nodes that are not in ``nodes`` (removed nodes) always move. Deterministic:
    donors give their highest-numbered partitions to the least-loaded receivers in name order.
    """
    targets = sorted(set(nodes))
    if not targets:
        raise ShardexError("no nodes to rebalance onto", code=ErrorCode.BAD_REQUEST)
    total = len(assignment)
    base, extra = divmod(total, len(targets))
    load = Counter({n: 0 for n in targets})
    homeless: list[int] = []
    by_node: dict[str, list[int]] = {n: [] for n in targets}
    for p in sorted(assignment):
        n = assignment[p]
        if n in by_node:
            by_node[n].append(p)
            load[n] += 1
        else:
            homeless.append(p)
    # Nodes already holding more than ``base`` keep one extra each, as long as extras remain:
    # the most loaded keep theirs first, so the fewest partitions move.
    quota: dict[str, int] = {}
    extras_left = extra
    for n in sorted(targets, key=lambda n: (-load[n], n)):
        if extras_left > 0 and load[n] > base:
            quota[n] = base + 1
            extras_left -= 1
        else:
            quota[n] = base
    for n in sorted(targets, key=lambda n: (load[n], n)):
        if extras_left == 0:
            break
        if quota[n] == base:
            quota[n] = base + 1
            extras_left -= 1
    moves: dict[int, str] = {}
    spare = list(homeless)
    for n in targets:
        while load[n] > quota[n]:
            spare.append(by_node[n].pop())
            load[n] -= 1
    spare.sort()
    for n in targets:
        while load[n] < quota[n]:
            p = spare.pop(0)
            moves[p] = n
            load[n] += 1
    return moves


class TopologyHistory:
    """Every published topology by ``seq_num``; append-only, gap-free."""

    def __init__(self, topologies: Iterable[Topology] = ()) -> None:
        self._by_seq: dict[int, Topology] = {}
        for t in topologies:
            self.append(t)

    def append(self, topology: Topology) -> None:
        latest = self.latest
        if latest is not None and topology.seq_num != latest.seq_num + 1:
            raise ShardexError(
                f"topology {topology.seq_num} does not follow {latest.seq_num}",
                code=ErrorCode.STALE_TOPOLOGY,
                details={"seq_num": topology.seq_num, "latest": latest.seq_num},
            )
        self._by_seq[topology.seq_num] = topology

    def get(self, seq_num: int) -> Topology:
        try:
            return self._by_seq[seq_num]
        except KeyError:
            raise ShardexError(
                f"topology {seq_num} is not in the history",
                code=ErrorCode.TOPOLOGY_NOT_FOUND,
                details={"seq_num": seq_num, "known": sorted(self._by_seq)[-5:]},
            ) from None

    @property
    def latest(self) -> Topology | None:
        if not self._by_seq:
            return None
        return self._by_seq[max(self._by_seq)]

    def __len__(self) -> int:
        return len(self._by_seq)

    def all(self) -> list[Topology]:
        return [self._by_seq[s] for s in sorted(self._by_seq)]

"""Where a keyspace's replica copies go: chains placed at create, restored after a failover.

A data partition's chain is its active node followed by its replica nodes, in promotion order
(``Topology.chain``). The rules, in priority order:

1. the copies of one partition are on distinct nodes (a second copy on the same node
   protects nothing);
2. they are on distinct server groups (racks, zones) when the nodes carry group labels and
   there are at least as many groups as copies; with fewer groups they spread over as many
   groups as there are, and the placement says so in a warning;
3. every node holds about as many replica copies as every other (within one where the first
   two rules allow), so that a failover spreads the promoted actives and the catch-up
   traffic evenly.

Fewer nodes than copies: as many replicas as the nodes allow, and a warning (Couchbase does
the same: "not enough nodes to place all replicas"). The actives stay where
``balanced_assignment`` puts them; replicas never move an active.

Everything is a pure, deterministic function of its arguments: the master computes the
placement once and commits it, and the unit tests check the rules over many cluster shapes.
A node without a group label counts as a group of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from shardex.core.topology import Topology, balanced_assignment
from shardex.errors import ErrorCode, ShardexError

MAX_REPLICAS = 3  # Couchbase's limit too: a chain is at most four copies

# Repair passes are bounded: each one moves a replica from a most-loaded node to a
# least-loaded one, so the spread shrinks; the bound only guards against a bug looping.
_MAX_REPAIRS = 100_000


class ChainPlacement(NamedTuple):
    """The placement of a new keyspace: actives, replicas, and what could not be honoured."""

    assignment: dict[int, str]  # partition -> active node
    replicas: dict[int, list[str]]  # partition -> replica nodes, in promotion order
    warnings: list[str]


def check_num_replicas(value: object) -> int:
    """0..MAX_REPLICAS; anything else is BAD_REQUEST naming the value and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPLICAS:
        raise ShardexError(
            f"num_replicas must be an integer from 0 to {MAX_REPLICAS}, got {value!r}",
            code=ErrorCode.BAD_REQUEST,
            details={
                "num_replicas": repr(value),
                "hint": f"give 0 (no replica copies) to {MAX_REPLICAS}, or leave it out for "
                "the default (1 with two or more data nodes up, else 0)",
            },
        )
    return value


def default_num_replicas(data_nodes_up: int) -> int:
    """One replica when there is a second node to put it on, else none."""
    return 1 if data_nodes_up >= 2 else 0


class Placer:
    """The shared state of one placement: node order, groups and replica loads."""

    def __init__(self, nodes: Sequence[str], groups: Mapping[str, str]) -> None:
        self.ordered = sorted(set(nodes))
        self.index = {n: i for i, n in enumerate(self.ordered)}
        # Every node's label, the placed-on ones and others (a down active's group counts).
        self.labels = dict(groups)
        self.num_groups = len({self.group_of(n) for n in self.ordered})
        self.load: Counter[str] = Counter({n: 0 for n in self.ordered})

    def group_of(self, node: str) -> str:
        # An unlabelled node is a group of its own: with no labels at all the group rule is
        # the distinct-node rule.
        return self.labels.get(node) or f"\0{node}"

    def distinct_groups(self, chain: Sequence[str]) -> int:
        return len({self.group_of(n) for n in chain})

    def pick(self, partition: int, chain: list[str]) -> str | None:
        """The best node to add to ``chain``: a new group first, then the least replica
        load, then the nearest after the active in name order (so that the replicas of
        neighbouring partitions rotate over the nodes instead of piling on one)."""
        used_groups = {self.group_of(n) for n in chain}
        n = len(self.ordered)
        anchor = self.index.get(chain[0], partition % n) if chain else partition % n
        candidates = [c for c in self.ordered if c not in chain]
        if not candidates:
            return None
        return min(
            candidates,
            key=lambda c: (
                self.group_of(c) in used_groups,
                self.load[c],
                (self.index[c] - anchor) % n,
            ),
        )

    def repair(
        self,
        assignment: Mapping[int, str],
        replicas: dict[int, list[str]],
        movable: dict[int, set[str]],
        cheap: dict[int, set[str]] | None = None,
        avoid: Mapping[int, str] | None = None,
    ) -> None:
        """Move replicas (``movable``: partition -> the replica nodes that may move) from the
        most to the least loaded nodes while that narrows the spread without giving up a
        distinct group. A moved replica keeps its place in the promotion order.

        ``cheap`` (a part of ``movable``): the replicas tried first, copies not built yet, so
        that moving them costs nothing; ``avoid``: partition -> a node that must not receive
        its replica unless nothing else narrows the spread (a moving active's source, which drops
        its copy)."""
        for _ in range(_MAX_REPAIRS):
            if not self._repair_one(assignment, replicas, movable, cheap or {}, avoid or {}):
                return

    def _repair_one(
        self,
        assignment: Mapping[int, str],
        replicas: dict[int, list[str]],
        movable: dict[int, set[str]],
        cheap: dict[int, set[str]],
        avoid: Mapping[int, str],
    ) -> bool:
        low = min(self.load.values(), default=0)
        high = max(self.load.values(), default=0)
        if high - low <= 1:
            return False
        maps = (movable, cheap)
        # Node pairs two or more apart, the widest gap first (with groups, a node may only
        # take replicas from nodes of its own group: the overall spread can stay wide while
        # each pair that can trade narrows); every move lowers the sum of squared loads.
        pairs = sorted(
            (
                (d, r)
                for d in self.ordered
                for r in self.ordered
                if self.load[d] >= self.load[r] + 2
            ),
            key=lambda dr: (
                self.load[dr[1]] - self.load[dr[0]],
                self.index[dr[0]],
                self.index[dr[1]],
            ),
        )
        tiers = [_by_node(t) for t in ((cheap, movable) if cheap else (movable,))]
        shuns = (avoid, {}) if avoid else (avoid,)  # avoided nodes only as a last resort
        for tier in tiers:
            for shun in shuns:
                for donor, receiver in pairs:
                    p = self._fit(assignment, replicas, tier, donor, receiver, shun)
                    if p is not None:
                        self._move(replicas, maps, p, donor, receiver)
                        return True
        # Two hops: the donor's replica to a node that can hold it, and one of that node's
        # replicas to the receiver (the middle node's load unchanged): when the groups of
        # the donor's chains keep the receiver out of all of them.
        for tier in tiers:
            for donor, receiver in pairs:
                for middle in self.ordered:
                    if middle in (donor, receiver):
                        continue
                    p = self._fit(assignment, replicas, tier, donor, middle, avoid)
                    if p is None:
                        continue
                    q = self._fit(assignment, replicas, tier, middle, receiver, avoid, p)
                    if q is None:
                        continue
                    self._move(replicas, maps, p, donor, middle)
                    self._move(replicas, maps, q, middle, receiver)
                    return True
        return False

    def _fit(
        self,
        assignment: Mapping[int, str],
        replicas: dict[int, list[str]],
        held: Mapping[str, list[int]],
        donor: str,
        receiver: str,
        avoid: Mapping[int, str],
        skip: int | None = None,
    ) -> int | None:
        """The first partition whose replica on ``donor`` (``held``: node -> the partitions
        whose replica there may move) may go to ``receiver``: not in its chain, not
        avoided, no distinct group given up."""
        for p in held.get(donor, ()):
            if p == skip or receiver == avoid.get(p):
                continue
            chain = [assignment[p], *replicas[p]]
            if receiver in chain:
                continue
            swapped = [receiver if n == donor else n for n in chain]
            if self.distinct_groups(swapped) >= self.distinct_groups(chain):
                return p
        return None

    def _move(
        self,
        replicas: dict[int, list[str]],
        maps: tuple[dict[int, set[str]], ...],
        p: int,
        donor: str,
        receiver: str,
    ) -> None:
        replicas[p] = [receiver if n == donor else n for n in replicas[p]]
        for m in maps:
            if donor in m.get(p, ()):
                m[p] = (m[p] - {donor}) | {receiver}
        self.load[donor] -= 1
        self.load[receiver] += 1


def _by_node(movable: Mapping[int, set[str]]) -> dict[str, list[int]]:
    """node -> the partitions (ascending) whose replica on it ``movable`` lets move."""
    out: dict[str, list[int]] = {}
    for p in sorted(movable):
        for n in movable[p]:
            out.setdefault(n, []).append(p)
    return out


def chain_assignment(
    num_partitions: int,
    nodes: Sequence[str],
    num_replicas: int,
    groups: Mapping[str, str],
) -> ChainPlacement:
    """Actives round-robin (``balanced_assignment``) and ``num_replicas`` replicas per
    partition placed by the rules of this module. ``groups`` maps node -> group label
    (missing or "": no group)."""
    check_num_replicas(num_replicas)
    assignment = balanced_assignment(num_partitions, nodes)
    placer = Placer(nodes, groups)
    warnings = _shortfall_warnings(placer, num_replicas)
    wanted = min(num_replicas, len(placer.ordered) - 1)
    replicas: dict[int, list[str]] = {}
    if wanted > 0:
        for p in range(num_partitions):
            chain = [assignment[p]]
            for _ in range(wanted):
                node = placer.pick(p, chain)
                assert node is not None  # wanted < number of nodes
                chain.append(node)
                placer.load[node] += 1
            replicas[p] = chain[1:]
        placer.repair(assignment, replicas, {p: set(r) for p, r in replicas.items()})
    return ChainPlacement(assignment, replicas, warnings)


def restore_replicas(
    topology: Topology,
    nodes_up: Sequence[str],
    num_replicas: int,
    groups: Mapping[str, str],
) -> Topology:
    """The next topology (``seq_num + 1``) with every chain back to ``num_replicas``
    replicas on the nodes of ``nodes_up`` (the up data nodes, failed-over ones excluded).

    Replicas on nodes not in ``nodes_up`` are removed; the replicas that stay are kept
    (each one is a copy that need not be rebuilt) and the missing ones are added where the
    placement rules say, balanced among the new ones. Actives never move. ``topology``
    itself is returned when nothing changes (no new topology to publish)."""
    check_num_replicas(num_replicas)
    placer = Placer(nodes_up, groups)
    up = set(placer.ordered)
    kept: dict[int, list[str]] = {}
    for p in sorted(topology.assignment):
        active = topology.assignment[p]
        chain = [active]
        for n in topology.replicas.get(p, ()):
            if n in up and n not in chain and len(chain) <= num_replicas:
                chain.append(n)
        kept[p] = chain[1:]
        for n in kept[p]:
            placer.load[n] += 1
    added: dict[int, set[str]] = {}
    for p in sorted(kept):
        chain = [topology.assignment[p], *kept[p]]
        while len(chain) - 1 < num_replicas:
            node = placer.pick(p, chain)
            if node is None:
                break
            chain.append(node)
            placer.load[node] += 1
            added.setdefault(p, set()).add(node)
        kept[p] = chain[1:]
    # Only the replicas just added may move for balance: the kept ones hold data already.
    placer.repair(topology.assignment, kept, added)
    return _next(topology, {p: r for p, r in kept.items() if r})


def chains_after_moves(
    topology: Topology,
    remaining: Sequence[str],
    num_replicas: int,
    groups: Mapping[str, str],
    targets: Mapping[int, str] | None = None,
) -> dict[int, list[str]]:
    """partition -> the chain (active first) it will have once an eject (or one admin move)
    is over: the actives at ``targets`` (the planned moves), the replicas on the
    ``remaining`` nodes (the serving data nodes minus the ejected ones) by the rules of this
    module (``restore_replicas``: the replicas that stay, stay).

    A target that held a replica is the active after its move and so no longer a replica
    (the migration drops that replica copy when it starts): its replacement is in the
    chain, to be built first (``widened``), so that during the copy and after it the
    partition keeps ``num_replicas`` caught-up replicas."""
    moved = dict(targets or {})
    after = Topology(
        seq_num=topology.seq_num,
        assignment={**topology.assignment, **moved},
        replicas={
            p: [n for n in r if n != moved.get(p, topology.assignment[p])]
            for p, r in topology.replicas.items()
        },
    )
    wanted = restore_replicas(after, remaining, num_replicas, groups)
    return {p: [a, *wanted.replicas.get(p, [])] for p, a in sorted(after.assignment.items())}


def widened(topology: Topology, chains: Mapping[int, Sequence[str]]) -> Topology:
    """The next topology with every chain *appended* the replicas of its planned chain
    (``chains``: partition -> active then replicas, as a rebalance or an eject will leave it)
    that it lacks, while every copy it has stays in it until the new ones have caught up
    (``narrowed`` then removes the rest). A planned active not in the chain is left out: it
    arrives by migration.

    A chain may be longer than ``num_replicas`` for a while: a majority is still counted over
    the configured chain (1 + num_replicas), so an extra replica only adds
    acknowledgements. ``topology`` itself when nothing is to be added."""
    replicas: dict[int, list[str]] = {}
    for p in sorted(topology.assignment):
        chain = topology.chain(p)
        added = [n for n in chains.get(p, ())[1:] if n not in chain]
        if chain[1:] or added:
            replicas[p] = [*chain[1:], *added]
    return _next(topology, replicas)


def narrowed(topology: Topology, chains: Mapping[int, Sequence[str]]) -> Topology:
    """The next topology with every replica its planned chain (``chains``, as given to
    ``widened``) does not name removed, but only from a chain that holds every planned
    replica already (a failover meanwhile may have promoted one, or the planned replica is
    the node the active is leaving: that chain is left as it is, for the next pass). A
    replica on the node its active is about to move to stays: the migration drops it.
    ``topology`` itself when nothing leaves."""
    replicas: dict[int, list[str]] = {}
    for p in sorted(topology.assignment):
        have = topology.replicas.get(p, [])
        planned = chains.get(p)
        # A planned replica on the active's own node (it moves away and its node keeps a
        # copy) exists only after the move: until then the chain keeps what it has.
        if planned is not None and all(n in have for n in planned[1:]):
            have = [n for n in have if n in planned]
        if have:
            replicas[p] = have
    return _next(topology, replicas)


def _next(topology: Topology, replicas: dict[int, list[str]]) -> Topology:
    """``topology`` with ``replicas`` as topology ``seq_num + 1``; itself when unchanged."""
    if replicas == {p: r for p, r in topology.replicas.items() if r}:
        return topology
    return Topology(
        seq_num=topology.seq_num + 1, assignment=dict(topology.assignment), replicas=replicas
    )


def added_replicas(before: Topology, after: Topology) -> dict[int, list[str]]:
    """partition -> the replica nodes ``after`` names that ``before`` did not (the copies a
    widened chain is waiting for)."""
    out: dict[int, list[str]] = {}
    for p, nodes in sorted(after.replicas.items()):
        new = [n for n in nodes if n not in before.replicas.get(p, ())]
        if new:
            out[p] = new
    return out


def placement_warnings(
    nodes: Sequence[str], groups: Mapping[str, str], num_replicas: int
) -> list[str]:
    """What chains of ``num_replicas`` replicas cannot honour on ``nodes`` (too few nodes
    or server groups): the warnings of ``chain_assignment``."""
    return _shortfall_warnings(Placer(nodes, groups), num_replicas)


def _shortfall_warnings(placer: Placer, num_replicas: int) -> list[str]:
    """What the placement cannot honour with these nodes and groups."""
    out: list[str] = []
    n = len(placer.ordered)
    copies = 1 + num_replicas
    if num_replicas and n < copies:
        out.append(
            f"not enough data nodes to place all replicas: {n} node(s) up, a chain of "
            f"{copies} copies needs {copies}; placing {n - 1} replica(s) per partition "
            "until nodes are added and a rebalance restores the rest"
        )
    labelled = placer.num_groups < n
    if num_replicas and labelled and placer.num_groups < min(copies, n):
        out.append(
            f"only {placer.num_groups} server group(s) for chains of {min(copies, n)} "
            "copies: some copies of a partition share a group (distinct nodes still)"
        )
    return out

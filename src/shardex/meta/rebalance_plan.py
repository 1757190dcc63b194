"""What a rebalance makes of every chain: where each partition's active and replicas go.

A rebalance balances both kinds of copy over the serving data nodes: every node within one
active and within one replica copy of the others (where the distinct-node and group rules of
``replica_placement`` allow), moving as few copies as it can. Two pure steps, both
deterministic, so that the master can plan at the start and compute the same chains again
when it runs the plan:

1. ``plan_actives``: the fewest active moves (``rebalance_moves``'s quotas), each sent, where
   a choice exists, to a node outside the partition's chain and outside its replicas' server
   groups. A move onto a node holding a replica of the same partition costs that replica
   (the migration copies the partition again over it, and a replacement replica must be
   built first) and leaves, while its copy runs, one caught-up copy fewer; so partitions
   and targets are paired to avoid it (two moves swap targets, or another node with as
   many actives gives one up instead), keeping the number of moves and the balance.
2. ``plan_replicas``: the replica nodes of every chain once the moves are done. The replicas
   that can stay stay (each is a copy that need not be built); chains are filled and spread
   over distinct groups by the placement rules; then replicas move from the most to the
   least loaded nodes, the not-yet-built ones first, until the spread is at most one.

How the plan runs (new replicas added and caught up before any old one leaves its chain):
``manager/rebalance.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from shardex.core.topology import Topology, rebalance_moves
from shardex.meta.replica_placement import Placer, check_num_replicas

_MAX_PASSES = 10_000  # pairing improvements; each strictly lowers the plan's cost


def plan_actives(
    topology: Topology, nodes_up: Sequence[str], groups: Mapping[str, str]
) -> dict[int, str]:
    """partition -> new active node: as many moves as ``rebalance_moves`` plans, paired
    with targets outside each chain (module docstring) where swapping two moves' targets, or
    moving another partition of the same source instead, makes that possible."""
    moves = rebalance_moves(topology.assignment, nodes_up)
    if not any(topology.replicas.values()):
        return moves
    placer = Placer(nodes_up, groups)

    def cost(p: int, target: str) -> int:
        chain = topology.chain(p)
        if target in chain:
            return 2
        same_group = {placer.group_of(n) for n in chain[1:]}
        return 1 if placer.group_of(target) in same_group else 0

    up = set(placer.ordered)
    for _ in range(_MAX_PASSES):
        if not _improve(moves, topology, up, cost):
            break
    return moves


def _improve(
    moves: dict[int, str],
    topology: Topology,
    up: set[str],
    cost: Callable[[int, str], int],
) -> bool:
    """One change that lowers the total cost of ``moves`` (in place) and keeps their number
    and the balance of the actives; False when none does."""
    final = Counter(moves.get(p, n) for p, n in topology.assignment.items())
    for p in sorted(moves):
        target = moves[p]
        here = cost(p, target)
        if here == 0:
            continue
        for q in sorted(moves):  # swap the targets of two moves: both keep their counts
            if q == p or moves[q] == target:
                continue
            if cost(p, moves[q]) + cost(q, target) < here + cost(q, moves[q]):
                moves[p], moves[q] = moves[q], target
                return True
        source = topology.assignment[p]
        if source not in up:
            continue  # a partition of a removed node moves whatever it costs
        for q in sorted(topology.assignment):  # another node gives one up instead
            giver = topology.assignment[q]
            if q in moves or giver == target or cost(q, target) >= here:
                continue
            after = final.copy()
            after[source] += 1
            after[giver] -= 1
            if max(after[n] for n in up) - min(after[n] for n in up) > 1:
                continue
            del moves[p]
            moves[q] = target
            return True
    return False


def plan_replicas(
    topology: Topology,
    assignment: Mapping[int, str],
    nodes_up: Sequence[str],
    num_replicas: int,
    groups: Mapping[str, str],
) -> dict[int, list[str]]:
    """partition -> its replica nodes, in promotion order, once the actives are at
    ``assignment`` (the topology's own, or with ``plan_actives``'s moves applied): module
    docstring, step 2. Replicas kept keep their order; new ones follow."""
    check_num_replicas(num_replicas)
    placer = Placer(nodes_up, groups)
    up = set(placer.ordered)
    replicas: dict[int, list[str]] = {}
    for p in sorted(assignment):
        chain = [assignment[p]]
        for n in topology.replicas.get(p, ()):
            if n in up and n not in chain and len(chain) <= num_replicas:
                chain.append(n)
        replicas[p] = chain[1:]
        placer.load.update(chain[1:])
    # A moving active's source drops its copy once the move is published: a replica there
    # is a copy built after the move, when every other node could have had it built before.
    avoid = {
        p: topology.assignment[p]
        for p in assignment
        if topology.assignment.get(p, assignment[p]) != assignment[p]
    }
    added: dict[int, set[str]] = {p: set() for p in replicas}
    for p in sorted(replicas):
        chain = [assignment[p], *replicas[p]]
        while len(chain) - 1 < num_replicas:
            shunned = [avoid[p]] if p in avoid else []
            node = placer.pick(p, chain + shunned) or (placer.pick(p, chain) if shunned else None)
            if node is None:
                break
            chain.append(node)
            placer.load[node] += 1
            added[p].add(node)
        replicas[p] = chain[1:]
    _spread_groups(placer, assignment, replicas, added, avoid)
    movable = {p: set(r) for p, r in replicas.items()}
    placer.repair(assignment, replicas, movable, cheap=added, avoid=avoid)
    _undo_detours(placer, topology, assignment, replicas)
    return {p: r for p, r in replicas.items() if r}


def _undo_detours(
    placer: Placer,
    topology: Topology,
    assignment: Mapping[int, str],
    replicas: dict[int, list[str]],
) -> None:
    """A node that gets a new replica copy (of ``p``) while one it held (of ``q``) went to
    another node ``m`` did two copies' work for nothing: ``q`` keeps its replica there and
    ``m`` takes ``p``'s instead, when the chains allow (distinct nodes, no group given up).
    Loads are unchanged."""
    for _ in range(_MAX_PASSES):
        if not _undo_one(placer, topology, assignment, replicas):
            return


def _undo_one(
    placer: Placer,
    topology: Topology,
    assignment: Mapping[int, str],
    replicas: dict[int, list[str]],
) -> bool:
    for q in sorted(replicas):
        old_chain = topology.chain(q) if q in topology.assignment else []
        chain_q = [assignment[q], *replicas[q]]
        lost = [n for n in old_chain[1:] if n in placer.index and n not in chain_q]
        new_q = [m for m in replicas[q] if m not in old_chain]
        for n in lost:
            for p in sorted(replicas):
                chain_p = [assignment[p], *replicas[p]]
                if p == q or n not in replicas[p] or n in topology.chain(p):
                    continue  # ``n`` must have gained a copy of ``p``
                for m in new_q:
                    if m in chain_p:
                        continue
                    swapped_p = [m if x == n else x for x in chain_p]
                    swapped_q = [n if x == m else x for x in chain_q]
                    if placer.distinct_groups(swapped_p) < placer.distinct_groups(chain_p):
                        continue
                    if placer.distinct_groups(swapped_q) < placer.distinct_groups(chain_q):
                        continue
                    replicas[p], replicas[q] = swapped_p[1:], swapped_q[1:]
                    return True
    return False


def _spread_groups(
    placer: Placer,
    assignment: Mapping[int, str],
    replicas: dict[int, list[str]],
    added: dict[int, set[str]],
    avoid: Mapping[int, str],
) -> None:
    """Chains whose copies share a server group while a group they do not use has a node
    to spare get a replica moved there (the new copies first, then the last in promotion
    order): groups before balance, as at placement."""
    for p in sorted(replicas):
        while True:
            chain = [assignment[p], *replicas[p]]
            if placer.distinct_groups(chain) >= min(len(chain), placer.num_groups):
                break
            seen: set[str] = set()
            doubled: list[str] = []
            for n in chain:
                g = placer.group_of(n)
                if g in seen:
                    doubled.append(n)
                seen.add(g)
            free = [c for c in placer.ordered if placer.group_of(c) not in seen and c not in chain]
            free = [c for c in free if c != avoid.get(p)] or free
            if not free:
                break
            donor = min(doubled, key=lambda n: (n not in added[p], -chain.index(n)))
            receiver = min(free, key=lambda c: (placer.load[c], c))
            replicas[p] = [receiver if n == donor else n for n in replicas[p]]
            added[p] = (added[p] - {donor}) | {receiver}
            placer.load[donor] -= 1
            placer.load[receiver] += 1


def final_chains(
    topology: Topology,
    moves: Mapping[int, str],
    nodes_up: Sequence[str],
    num_replicas: int,
    groups: Mapping[str, str],
) -> dict[int, list[str]]:
    """partition -> the whole chain the plan ends with (active first): ``moves`` applied and
    ``plan_replicas`` over them. What ``widened``/``narrowed`` steer the chains to."""
    assignment = {**topology.assignment, **moves}
    replicas = plan_replicas(topology, assignment, nodes_up, num_replicas, groups)
    return {p: [assignment[p], *replicas.get(p, [])] for p in sorted(assignment)}

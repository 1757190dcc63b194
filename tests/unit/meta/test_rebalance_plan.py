"""Rebalance planning over whole chains (pure, property-style loops over cluster shapes):
actives and replicas each balanced within one, copies on distinct nodes and groups, active
targets outside their chains, as few copies moved as the balance needs, and the steps that
run the plan (widen, narrow, the moves) never leaving a chain shorter than configured."""

from __future__ import annotations

from collections import Counter

from shardex.core.topology import Topology, rebalance_moves
from shardex.meta.rebalance_plan import final_chains, plan_actives, plan_replicas
from shardex.meta.replica_placement import chain_assignment, narrowed, restore_replicas, widened

PARTITIONS = (1, 4, 7, 16, 33, 64)


def names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def placed(num_partitions: int, nodes: list[str], r: int, groups: dict[str, str]) -> Topology:
    chains = chain_assignment(num_partitions, nodes, r, groups)
    return Topology(seq_num=1, assignment=chains.assignment, replicas=chains.replicas)


def loads(chains: dict[int, list[str]], nodes: list[str]) -> tuple[Counter[str], Counter[str]]:
    """(actives per node, replicas per node) of ``chains``."""
    actives: Counter[str] = Counter(dict.fromkeys(nodes, 0))
    replicas: Counter[str] = Counter(dict.fromkeys(nodes, 0))
    for chain in chains.values():
        actives[chain[0]] += 1
        replicas.update(chain[1:])
    return actives, replicas


def spread(load: Counter[str]) -> int:
    return max(load.values()) - min(load.values())


def group_of(groups: dict[str, str], node: str) -> str:
    return groups.get(node) or node


def check_chains(
    chains: dict[int, list[str]], up: list[str], r: int, groups: dict[str, str], shape: object
) -> None:
    """Balanced actives and replicas, full chains on distinct nodes and groups."""
    actives, replicas = loads(chains, up)
    assert spread(actives) <= 1, shape
    assert spread(replicas) <= 1 or groups, (shape, replicas)
    num_groups = len({group_of(groups, n) for n in up})
    for p, chain in chains.items():
        assert len(set(chain)) == len(chain) and set(chain) <= set(up), (shape, p, chain)
        assert len(chain) == 1 + min(r, len(up) - 1), (shape, p, chain)
        distinct = len({group_of(groups, n) for n in chain})
        assert distinct == min(len(chain), num_groups), (shape, p, chain)


def check_plan(
    before: Topology, up: list[str], r: int, groups: dict[str, str], *, fewest: bool = False
) -> dict[int, list[str]]:
    """The rules every plan keeps; returns its final chains. ``fewest``: no node both gains
    a new replica copy and gives up one it held (a copy moved for nothing), which holds
    when empty nodes join."""
    moves = plan_actives(before, up, groups)
    chains = final_chains(before, moves, up, r, groups)
    shape = (len(up), r, len(before.assignment), groups)
    # as few active moves as a balance of the actives needs
    assert len(moves) == len(rebalance_moves(before.assignment, up)), shape
    check_chains(chains, up, r, groups, shape)
    if fewest:
        gained: Counter[str] = Counter()
        lost: Counter[str] = Counter()
        for p, chain in chains.items():
            old = before.chain(p)
            gained.update(n for n in chain[1:] if n not in old)
            lost.update(n for n in old[1:] if n in up and n not in chain)
        assert not [n for n in up if gained[n] and lost[n]], (shape, gained, lost)
    return chains


def run_plan(before: Topology, up: list[str], r: int, groups: dict[str, str]) -> Topology:
    """The plan applied as the master runs it: widen, narrow, each move published, a second
    widen / narrow planned on the result, the final restore; no committed topology leaves a
    chain with fewer live copies than it had (or than configured) unless its active moves
    onto a node of its chain with no node outside the chain left."""
    moves = plan_actives(before, up, groups)
    want = 1 + min(r, len(up) - 1)

    def full(t: Topology) -> None:
        for p in t.assignment:
            live = [n for n in t.chain(p) if n in up]
            had = [n for n in before.chain(p) if n in up]
            assert len(live) >= min(want, len(had)), (t.seq_num, p, t.chain(p))

    def steer(t: Topology, moves: dict[int, str]) -> Topology:
        chains = final_chains(t, moves, up, r, groups)
        wide = widened(t, chains)
        full(wide)
        narrow = narrowed(wide, chains)
        full(narrow)
        return narrow

    topo = steer(before, moves)
    for p, target in sorted(moves.items()):
        inside = target in topo.chain(p)
        topo = topo.with_moves({p: target})
        if not inside:
            full(topo)
    topo = restore_replicas(steer(topo, {}), up, r, groups)
    full(topo)
    check_chains({p: topo.chain(p) for p in topo.assignment}, up, r, groups, "after the run")
    return topo


def test_adding_nodes_moves_actives_and_replicas_onto_them() -> None:
    for n in range(1, 6):
        for added in (1, 2, 3):
            nodes, up = names(n), names(n + added)
            for r in range(4):
                for p in PARTITIONS:
                    before = placed(p, nodes, r, {})
                    chains = check_plan(before, up, r, {}, fewest=True)
                    for target_p, target in plan_actives(before, up, {}).items():
                        assert target not in before.chain(target_p)  # new nodes: in no chain
                    run_plan(before, up, r, {})
                    if r and p >= 2 * len(up) and n + added > r:
                        _actives, replicas = loads(chains, up)
                        assert all(replicas[x] > 0 for x in up[n:]), (n, added, r, p)


def test_removed_or_failed_nodes_leave_balanced_chains_on_the_others() -> None:
    for n in range(3, 7):
        nodes = names(n)
        for r in range(1, 4):
            for p in PARTITIONS:
                before = placed(p, nodes, r, {})
                for gone in (nodes[0], nodes[-1]):
                    up = [x for x in nodes if x != gone]
                    # the node's actives were failed over to their first replica
                    failed = Topology(
                        seq_num=2,
                        assignment={
                            q: next(x for x in before.chain(q) if x != gone)
                            for q in before.assignment
                        },
                        replicas={
                            q: [x for x in before.chain(q) if x != gone][1:]
                            for q in before.assignment
                        },
                    )
                    check_plan(failed, up, r, {})
                    run_plan(failed, up, r, {})


def test_a_balanced_cluster_plans_nothing() -> None:
    for n in range(2, 7):
        for r in range(4):
            for p in PARTITIONS:
                before = placed(p, names(n), r, {})
                assert plan_actives(before, names(n), {}) == {}
                chains = final_chains(before, {}, names(n), r, {})
                assert widened(before, chains) is before and narrowed(before, chains) is before


def test_actives_go_to_a_node_outside_their_chain_when_the_counts_allow() -> None:
    # n3 is new, but every partition of n1 has its replica on n3 already except 4 and 6:
    # rebalance_moves alone would send n1's highest partitions (6, 7... ) whatever the chain
    before = Topology(
        seq_num=3,
        assignment={0: "n1", 1: "n2", 2: "n1", 3: "n2", 4: "n1", 5: "n2", 6: "n1", 7: "n1"},
        replicas={0: ["n3"], 1: ["n1"], 2: ["n3"], 3: ["n1"], 4: ["n2"], 5: ["n3"], 6: ["n2"],
                  7: ["n3"]},
    )  # fmt: skip
    up = ["n1", "n2", "n3"]
    moves = plan_actives(before, up, {})
    assert len(moves) == len(rebalance_moves(before.assignment, up)) == 2
    assert all(t not in before.chain(p) for p, t in moves.items()), moves
    check_plan(before, up, 1, {})
    run_plan(before, up, 1, {})


def test_groups_stay_apart_and_new_groups_are_used() -> None:
    for n_groups in (2, 3):
        for n in range(n_groups, 7):
            nodes = names(n)
            groups = {x: f"g{i % n_groups}" for i, x in enumerate(nodes)}
            for added in (1, n_groups):
                up = names(n + added)
                up_groups = {x: f"g{i % n_groups}" for i, x in enumerate(up)}
                for r in range(1, 3):
                    for p in PARTITIONS:
                        before = placed(p, nodes, r, groups)
                        check_plan(before, up, r, up_groups)
                        run_plan(before, up, r, up_groups)
    # a third zone joins a two-zone cluster: chains of three copies spread over all three
    nodes = ["a1", "a2", "b1", "b2"]
    groups = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c"}
    before = placed(12, nodes, 2, groups)
    chains = check_plan(before, [*nodes, "c1"], 2, groups)
    assert all("c1" in chain for chain in chains.values())


def test_the_plan_is_deterministic_whatever_the_node_order() -> None:
    before = placed(33, names(4), 2, {})
    up = names(6)
    moves = plan_actives(before, up, {})
    assert plan_actives(before, list(reversed(up)), {}) == moves
    assert plan_replicas(before, {**before.assignment, **moves}, list(reversed(up)), 2, {}) == (
        plan_replicas(before, {**before.assignment, **moves}, up, 2, {})
    )

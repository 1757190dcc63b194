"""The coordinator's committed voter set under the simulator (``meta/voter_set.py``): managers
that gossip knows but the set does not never count, a removed manager never counts again,
and a voter change in flight when the master dies is settled by a majority of the newest set.

The clusters are ``test_coordinator_sim``'s (the ``AppendItem`` op, every apply and commit
recorded, ``check_coordinator`` at the end) plus ``RetireVoter``, the state change an eject of
a manager node commits (``voter_changes.retire_ejected``).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from manager_cluster import FT, HB, wait_until
from test_coordinator_sim import Cluster, items_of

from shardex.errors import ErrorCode, ShardexError
from shardex.manager.coordinator import Coordinator, OpContext
from shardex.meta.voter_set import changed_managers, retire
from shardex.net.messages import Message
from shardex.node.server import Node
from shardex.sim import ClusterNode, Simulation, run_simulation, sim_seeds

DETECT = FT + 2 * HB  # the failure-detection bound


class RetireVoter(Message, tag="votertest.RetireVoter"):
    name: str
    request_id: str | None = None


class VoterRetired(Message, tag="votertest.VoterRetired"):
    voters: list[str]


async def retire_voter(msg: RetireVoter, ctx: OpContext) -> VoterRetired:
    state = ctx.state
    new = retire(state, msg.name, state.voters[msg.name])
    committed = await ctx.commit(new, reply=VoterRetired(voters=sorted(new.voters)))
    return VoterRetired(voters=sorted(committed.voters))


class VoterCluster(Cluster):
    """``test_coordinator_sim.Cluster`` with ``RetireVoter`` registered on every node, and
    the voter set of every committed state recorded."""

    def __init__(self, sim: Simulation, hosts: tuple[str, ...]) -> None:
        self.committed_voters: dict[tuple[int, int], dict[str, str]] = {}  # version -> set
        super().__init__(sim, hosts)

    def manager_node(
        self, node: ClusterNode, host: str, seeds: tuple[str, ...], services: tuple[str, ...]
    ) -> tuple[Node, Coordinator]:
        n, coord = super().manager_node(node, host, seeds, services)
        coord.register_op(RetireVoter, retire_voter)
        coord.on_commit(lambda s: self.committed_voters.update({(s.epoch, s.cas): s.voters}))
        return n, coord

    async def retire(self, host: str, name: str, request_id: str) -> VoterRetired:
        msg = RetireVoter(name=name, request_id=request_id)
        return await self.client.request(f"{host}:7000", msg, 30.0, expect=VoterRetired)

    def masters(self) -> list[str]:
        return sorted(h for h in self.live if self.coord(h).is_master)

    def voters_of(self, host: str) -> set[str]:
        return set(self.coord(host).state.voters)

    def managers_up(self, observer: str) -> list[str]:
        """The manager members ``observer``'s membership sees up: what the voters were
        before they were a committed set."""
        view = self.live[observer].membership.view()  # type: ignore[union-attr]
        return sorted(m.name for m in view.members if "manager" in m.services and m.state == "up")

    def check_single_changes(self) -> None:
        """The committed states, in version order, changed the voters one manager at a time
        (each commit builds on the one before: ``check_coordinator`` checks that)."""
        history = [self.committed_voters[v] for v in sorted(self.committed_voters)]
        for old, new in itertools.pairwise(history):
            assert len(changed_managers(old, new)) <= 1, (old, new)


async def no_master_for(c: VoterCluster, seconds: float) -> None:
    """Once a master that lost its majority has stepped down (its next role check), fails
    as soon as any live node is master within the next ``seconds``."""
    await wait_until(lambda: not c.masters(), 2.0)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert not c.masters(), f"{c.masters()} became master"
        await asyncio.sleep(0.05)


async def op_fails(c: VoterCluster, host: str, item: str) -> ShardexError:
    with pytest.raises(ShardexError) as err:
        await c.op(host, item)  # no request id: not retried after an unknown outcome
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    return err.value


@pytest.mark.parametrize("seed", sim_seeds(2))
def test_unknown_managers_cannot_form_or_join_a_majority(seed: int) -> None:
    """Voters n1-n3; n2 and n3 die; n4 and n5 join. Gossip then shows 3 of 5 managers up (a
    majority, as voters were counted before), but n4 and n5 are not voters: nobody becomes
    master, nobody admits them, ops fail. When n2 returns the master admits n4, then n5,
    one commit each, once each has caught up."""

    async def main(sim: Simulation) -> None:
        hosts = ("n1", "n2", "n3", "n4", "n5")
        c = VoterCluster(sim, hosts)
        await sim.cluster.start("n1", "n2", "n3")
        await wait_until(lambda: c.masters() == ["n1"] and c.voters_of("n1") == set(hosts[:3]), 20)
        acked = {"a": (await c.op("n2", "a", "ra")).key}
        await c.crash("n2")
        await c.crash("n3")
        await wait_until(lambda: not c.masters(), DETECT + 2)  # before n4, n5 exist
        await sim.cluster.start("n4", "n5")
        await wait_until(lambda: c.managers_up("n1") == ["n1", "n4", "n5"], DETECT + 5)
        await no_master_for(c, 2 * DETECT)
        await op_fails(c, "n4", "x")
        assert not c.masters()
        assert all(c.voters_of(h) <= {"n1", "n2", "n3"} for h in c.live)
        await c.restart("n2")
        await wait_until(lambda: c.masters() == ["n1"] and c.voters_of("n1") == set(hosts), 30)
        acked["b"] = (await c.op("n5", "b", "rb")).key
        await c.restart("n3")
        await wait_until(c.converged, 20)
        c.check_single_changes()
        c.check(acked, issued=["a", "b", "x"])

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(2))
def test_removal_then_partition_cannot_produce_two_masters(seed: int) -> None:
    """n3 is cut off while the master removes it (committed by n1 and n2, the new set). n3
    still holds the old set, where n2 + n3 are a majority; cut n1 off from them: n2 alone is
    no majority of {n1, n2}, n3's own promotion is refused, nobody is master. Healed, n3
    learns it was removed. With n1 down, n2 and n3 are a majority of the manager members but
    not of the voters: still no master."""

    async def main(sim: Simulation) -> None:
        c = VoterCluster(sim, ("n1", "n2", "n3"))
        await c.start()
        acked = {"a": (await c.op("n1", "a", "ra")).key}
        sim.cluster.partition(["n3"])
        await wait_until(lambda: "n3" not in c.coord("n1")._group.up_voters(), DETECT + 2)
        assert (await c.retire("n1", "n3", "rm3")).voters == ["n1", "n2"]
        assert c.voters_of("n3") == {"n1", "n2", "n3"}  # it missed its removal
        sim.cluster.heal()
        sim.cluster.partition(["n1"])  # n1 | n2, n3 and the client
        await wait_until(lambda: not c.masters(), DETECT + 2)
        await wait_until(lambda: c.managers_up("n2") == ["n2", "n3"], DETECT + 2)
        # n3 campaigns with its old set: n2 refuses (n3 is no voter of its state).
        assert not await c.coord("n3")._group.promote()
        await no_master_for(c, 2 * DETECT)
        await op_fails(c, "n3", "x")
        sim.cluster.heal()
        await wait_until(lambda: c.masters() == ["n1"], DETECT + 5)
        acked["b"] = (await c.op("n2", "b", "rb")).key
        # The master tombstoned the retired member at once; gossip tells n3, which stops
        # campaigning (its state may still list it: it gets no pushes any more).
        assert "n3" not in [m.name for m in c.live["n1"].membership.members]  # type: ignore[union-attr]
        await wait_until(lambda: c.live["n3"].membership.removed, DETECT + 5)  # type: ignore[union-attr]
        assert c.coord("n3").master_name is None
        await c.crash("n1")
        await no_master_for(c, 2 * DETECT)
        await op_fails(c, "n2", "y")
        await c.restart("n1")
        await wait_until(lambda: c.masters() == ["n1"] or c.masters() == ["n2"], DETECT + 5)
        acked["c"] = (await c.op("n2", "c", "rc")).key
        final = c.coord(c.masters()[0]).state
        assert set(final.voters) == {"n1", "n2"} and "n3-id" in final.retired_voters
        assert {"a", "b", "c"} <= set(items_of(final))
        c.check_single_changes()

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(2))
def test_a_voter_change_in_flight_when_the_master_dies(seed: int) -> None:
    """The removal of n3 reaches n3 (told, not counted) but not n2: not committed. n1 dies.
    n2 + n3 are a majority of the old set, but the newest state (n3's) has the set {n1, n2},
    of which only n2 is up: n2 does not take over (it could not know whether n1 and n2 had
    committed it). When n1 returns, a master continues from the newest state and the change
    ends committed, exactly once; n3 never counts again."""

    async def main(sim: Simulation) -> None:
        c = VoterCluster(sim, ("n1", "n2", "n3"))
        await c.start()
        acked = {"a": (await c.op("n1", "a", "ra")).key}
        sim.cluster.partition(["n2"])
        await wait_until(lambda: "n2" not in c.coord("n1")._group.up_voters(), DETECT + 2)
        with pytest.raises(ShardexError) as err:
            await c.retire("n1", "n3", "rm3")
        assert err.value.details.get("reason") in ("commit_failed", "deposed", "no_master")
        assert c.voters_of("n3") == {"n1", "n2"} and c.voters_of("n2") == {"n1", "n2", "n3"}
        await c.crash("n1")
        sim.cluster.heal()
        await wait_until(lambda: c.managers_up("n2") == ["n2", "n3"], DETECT + 2)
        await no_master_for(c, 2 * DETECT)
        await c.restart("n1")
        await wait_until(lambda: len(c.masters()) == 1, DETECT + 10)
        master = c.masters()[0]
        assert master in ("n1", "n2")
        await wait_until(lambda: c.voters_of("n2") == {"n1", "n2"}, 10)
        # The client's retry of the removal finds it applied (its reply was committed with it).
        assert (await c.retire("n2", "n3", "rm3")).voters == ["n1", "n2"]
        acked["b"] = (await c.op("n3", "b", "rb")).key
        final = c.coord(master).state
        assert set(final.voters) == {"n1", "n2"}
        assert not c.coord("n3").is_master
        c.check_single_changes()
        assert {"a", "b"} <= set(items_of(final))

    run_simulation(main, seed)

"""The master/replica engine under the coordinator: terms, promotion, commit, catch-up.

``ReplicationGroup`` decides whether this node is the master, gets it promoted, and makes
commits durable on a majority of the manager nodes; the ``Coordinator`` (ops, forwarding,
reads) sits on top. The rules a voter applies are in ``replica.py``; why the protocol is
shaped this way is in ``docs/decisions/0023-coordinator-majority-commit.md``, and the module
docstring of
``coordinator.py`` summarises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from shardex.api.coordinator import (
    StateGather,
    StateGatherReply,
    StateReplicate,
    StateReplicateReply,
)
from shardex.errors import NodeUnavailable, ShardexError
from shardex.manager.membership import Membership
from shardex.manager.replica import Replica
from shardex.meta.member_list import UP, MemberInfo
from shardex.meta.rebalance_state import RUNNING
from shardex.meta.state import StateContext, StateStore, newest, version_of
from shardex.meta.voter_set import check_single_change, majority, with_voter
from shardex.net import ConnectionPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoordinatorTiming:
    """Timeouts, in seconds of the loop clock (virtual time under the simulator)."""

    tick: float = 0.25  # role checks and catch-up pushes
    attempt_timeout: float = 1.0  # one StateGather / StateReplicate / connect
    retry_interval: float = 0.1  # between attempts to a silent voter, and op re-routing
    commit_timeout: float = 5.0  # wait this long for up-but-silent voters
    op_timeout: float = 15.0  # an op waits this long for a master (failover included)
    promote_backoff: float = 0.5  # after a failed promotion

    @classmethod
    def for_membership(cls, heartbeat_interval: float, failure_timeout: float) -> CoordinatorTiming:
        """Derived from failure detection: a commit waits long enough for membership to report
        a dead voter down (so it proceeds without it, as the DDL flow says) and an op long enough
        to ride out one failover."""
        attempt = max(2 * heartbeat_interval, 0.5)
        detect = failure_timeout + 2 * heartbeat_interval
        return cls(
            tick=heartbeat_interval / 2,
            attempt_timeout=attempt,
            retry_interval=heartbeat_interval / 5,
            commit_timeout=detect + attempt,
            op_timeout=2 * detect + 3 * attempt,
            promote_backoff=heartbeat_interval,
        )


def unavailable(message: str, reason: str, **details: Any) -> NodeUnavailable:
    """NODE_UNAVAILABLE with ``details["reason"]``: no_master, not_master, commit_failed,
    deposed. The first two mean the op certainly did not run."""
    return NodeUnavailable(message, details={"reason": reason, **details})


__all__ = ["CoordinatorTiming", "ReplicationGroup", "majority", "unavailable"]


class ReplicationGroup:
    """This node's place among the manager nodes: voter always, master sometimes."""

    def __init__(
        self,
        *,
        name: str,
        store: StateStore,
        pool: ConnectionPool,
        timing: CoordinatorTiming,
        applied: Callable[[StateContext], None],
        committed: Callable[[StateContext], None],
        recover: Callable[[int], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ) -> None:
        self.name = name
        self.replica = Replica(name, store)
        self.pool = pool
        self.timing = timing
        self._applied = applied  # after every local apply
        self._committed_cb = committed  # after every successful commit
        self._recover = recover  # recovery hooks of a new master, under the op lock
        self._spawn = spawn
        self.membership: Membership | None = None
        self.my_epoch: int | None = None  # the term this node is master (or candidate) of
        self.serving = False  # promotion complete: ops run here
        self.committed: StateContext | None = None  # last successful commit (master only)
        self.op_lock = asyncio.Lock()  # ops, promotion and re-commits run one at a time
        self._seen_epoch = self.replica.promised_epoch  # highest term heard of
        self._hint: tuple[int, str] | None = None  # (term, leader) learnt from refusals
        self._cas_floor = 0  # a voter holds this cas from an older term: commit above it
        self._acked: dict[str, tuple[int, int]] = {}  # voter -> version it holds (this term)
        self._pushing: dict[str, asyncio.Task[Any]] = {}

    @property
    def state(self) -> StateContext:
        return self.replica.state

    # -- membership view --

    def voter_set(self, state: StateContext | None = None) -> dict[str, str]:
        """The voters (name -> member id) of ``state`` (default: this node's latest):
        its committed set (``meta/voter_set.py``). A state without one is the bootstrap (or
        a state written before the set existed): then the manager members count, as the
        first commit records them; except on a node that joined through a seed and holds
        no state yet: it is not a voter until the master admits it."""
        state = self.replica.state if state is None else state
        if state.voters:
            return state.voters
        if self.membership is None or (state.cas == 0 and self.membership.seeds):
            return {}
        return {m.name: m.member_id for m in self.membership.members if "manager" in m.services}

    def voters(self, state: StateContext | None = None) -> list[MemberInfo]:
        """The voters of ``state`` with their member-list entries, sorted by name. A voter
        this node's list does not hold (yet) still counts, as a member that is down."""
        members = (
            {} if self.membership is None else {m.member_id: m for m in self.membership.members}
        )
        out = []
        for name, member_id in sorted(self.voter_set(state).items()):
            m = members.get(member_id)
            if m is None or m.name != name:
                m = MemberInfo(member_id=member_id, name=name, address="", services=("manager",))
            out.append(m)
        return out

    def learners(self) -> list[MemberInfo]:
        """Manager members that are not voters and were never removed: they get the state
        (catch-up pushes) and are admitted by the master once they hold it."""
        if self.membership is None:
            return []
        voters, retired = self.voter_set(), self.state.retired_voters
        return [
            m
            for m in self.membership.members
            if "manager" in m.services and m.name not in voters and m.member_id not in retired
        ]

    def is_voter(self) -> bool:
        return self.name in self.voter_set()

    def is_up(self, member: MemberInfo) -> bool:
        if member.name == self.name:
            return True
        if self.membership is None or not member.address:
            return False
        now = asyncio.get_running_loop().time()
        return self.membership.state_of(member.member_id, now)[0] == UP

    def address(self, name: str) -> str | None:
        for m in self.voters():
            if m.name == name:
                return m.address
        return None

    def up_voters(self) -> list[str]:
        return [m.name for m in self.voters() if self.is_up(m)]

    def expected_master(self) -> str | None:
        """The leader of the newest term we know, if up; else the smallest up name. None on
        the minority side: with fewer than a majority up nobody here may act."""
        if self.membership is None or not self.membership.joined.is_set():
            return None  # a joining node's list holds only itself: it must not vote alone
        if self.membership.removed:
            return None  # ejected (it may have missed its removal from the voters)
        voters = self.voters()
        up = [m.name for m in voters if self.is_up(m)]
        if not voters or len(up) < majority(len(voters)):
            return None
        hint = self._hint
        leader = hint[1] if hint and hint[0] >= self.replica.promised_epoch else self.replica.leader
        if leader is not None and leader in up:
            return leader
        return up[0]

    @property
    def master_name(self) -> str | None:
        if self.serving:
            return self.name
        expected = self.expected_master()
        return None if expected == self.name else expected

    # -- roles --

    def step_down(self, reason: str, level: int = logging.WARNING) -> None:
        if self.my_epoch is None:
            return
        log.log(
            level,
            "coordinator %s: %s term %d: %s",
            self.name,
            "leaving" if self.serving else "abandoning promotion to",
            self.my_epoch,
            reason,
        )
        self.my_epoch = None
        self.serving = False
        self.committed = None
        self._acked.clear()

    def check_term(self, epoch: int) -> None:
        if self.my_epoch != epoch or self.replica.promised_epoch != epoch:
            raise unavailable(
                f"{self.name} is no longer master of term {epoch}",
                "deposed",
                node=self.name,
                epoch=epoch,
                promised=self.replica.promised_epoch,
            )

    async def role_loop(self) -> None:
        while True:
            try:
                await self._role_step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("coordinator %s: role check failed", self.name)
            await asyncio.sleep(self.timing.tick)

    async def _role_step(self) -> None:
        expected = self.expected_master()
        if self.my_epoch is not None and (
            expected != self.name or self.replica.promised_epoch != self.my_epoch
        ):
            self.step_down(f"expected master is now {expected}")
        if expected == self.name and self.my_epoch is None:
            if not await self.promote():
                await asyncio.sleep(self.timing.promote_backoff)
        elif self.serving:
            await self._catch_up()

    async def promote(self) -> bool:
        """DDL flow step 5: promises from a majority, continue from the highest (epoch, cas),
        re-synchronise everyone by committing it under the new term, recover, serve."""
        rep = self.replica
        epoch = max(rep.promised_epoch, self._seen_epoch) + 1
        rep.promise_self(epoch)
        self._seen_epoch = epoch
        self.my_epoch, self.serving, self._hint = epoch, False, None
        self._acked.clear()
        voters = self.voters()
        # Learners too: the state to continue from may have admitted one (its promise then
        # counts towards that state's majority, below).
        others = [m for m in [*voters, *self.learners()] if m.name != self.name and self.is_up(m)]
        replies = await asyncio.gather(*(self._gather_from(m, epoch) for m in others))
        if self.my_epoch != epoch:
            return False  # a newer term arrived while we gathered
        states, promised = [rep.state], [self.name]
        refusal: tuple[int, str] | None = None
        for member, reply in zip(others, replies, strict=True):
            if reply is None:
                continue
            if reply.ok and reply.state is not None:
                states.append(reply.state)
                promised.append(member.name)
            else:
                self._seen_epoch = max(self._seen_epoch, reply.promised_epoch)
                if reply.leader and (refusal is None or reply.promised_epoch > refusal[0]):
                    refusal = (reply.promised_epoch, reply.leader)
        if _count_in(promised, voters) < majority(len(voters)):
            self.step_down(f"promises from {promised} only, of {len(voters)} voters")
            if refusal is not None and refusal[1] != self.name:
                rep.observe(*refusal)
                self._hint = refusal  # defer to whoever holds that term
            return False
        chosen = newest(states)
        # The state continued from may have a voter set one change away from ours. Its resync
        # commit needs a majority of that set anyway (what makes it safe); without their
        # promises it would only fail after ``commit_timeout``, so give up now.
        chosen_voters = self.voters(chosen)
        if self.name not in {m.name for m in chosen_voters}:
            self.step_down(
                f"not a voter of the newest state (epoch {chosen.epoch} cas {chosen.cas})"
            )
            return False
        if _count_in(promised, chosen_voters) < majority(len(chosen_voters)):
            self.step_down(
                f"promises from {promised} only, of the newest state's {len(chosen_voters)} voters"
            )
            return False
        self._cas_floor = max(self._cas_floor, *(s.cas for s in states))
        log.info(
            "coordinator %s: term %d promised by %s; continuing from epoch %d cas %d of %s",
            self.name,
            epoch,
            promised,
            chosen.epoch,
            chosen.cas,
            chosen.master or "(empty)",
        )
        async with self.op_lock:
            try:
                self.check_term(epoch)
                await self.commit(chosen, epoch)  # the resync of every replica
                await self._recover(epoch)
                self.check_term(epoch)
            except Exception as e:
                if not isinstance(e, ShardexError):
                    log.exception("coordinator %s: promotion failed", self.name)
                self.step_down(f"promotion failed: {e}")
                return False
            self.serving = True
        log.info("coordinator %s: master of term %d at cas %d", self.name, epoch, self.state.cas)
        return True

    async def _gather_from(self, member: MemberInfo, epoch: int) -> StateGatherReply | None:
        try:
            return await self.pool.request(
                member.address,
                StateGather(epoch=epoch, candidate=self.name),
                self.timing.attempt_timeout,
                expect=StateGatherReply,
            )
        except ShardexError as e:
            log.debug("gather from %s failed: %s", member.name, e)
            return None

    # -- commit (master) --

    async def commit(self, content: StateContext, epoch: int) -> StateContext:
        """DDL flow steps 2-7: persist ``content`` as the next state, replicate it to all voters;
        return it once a majority holds it, else step down and raise commit_failed."""
        self.check_term(epoch)
        current = self.replica.state
        before = self.voters()
        if not content.voters:  # the first commit (or the first since the set exists)
            content = msgspec.structs.replace(content, voters=self.voter_set())
        if self.serving:  # a promotion's resync continues from whatever set it found
            check_single_change(self.voter_set(current), content.voters)
        state = msgspec.structs.replace(
            content,
            cas=max(current.cas, self._cas_floor) + 1,
            epoch=epoch,
            master=self.name,
        )
        self.replica.apply_local(state)  # persisted before anyone hears of it
        self._applied(state)
        # Counted: the new state's voters. Told: the old ones too, so that a removed voter
        # learns it is one no longer (and never campaigns with its old set).
        voters = self.voters(state)
        counted = {m.name for m in voters}
        others = [
            m for m in {m.name: m for m in [*before, *voters]}.values() if m.name != self.name
        ]
        deadline = asyncio.get_running_loop().time() + self.timing.commit_timeout
        results = await asyncio.gather(*(self._replicate_to(m, state, deadline) for m in others))
        outcome = {m.name: r for m, r in zip(others, results, strict=True)}
        holders = [
            n for n in [self.name, *outcome] if n in counted and outcome.get(n, "acked") == "acked"
        ]
        problem = None
        if self.my_epoch != epoch or "deposed" in results:
            problem = f"{self.name} was deposed"
        elif len(holders) < majority(len(voters)):
            problem = f"only {holders} of {len(voters)} voters ({sorted(counted)}) hold it"
        if problem is not None:
            self.step_down(f"commit of cas {state.cas} failed: {problem}")
            raise unavailable(
                f"commit of cas {state.cas} failed: {problem} (outcome unknown: a later master "
                "may continue from it)",
                "commit_failed",
                cas=state.cas,
                outcome="unknown",
                voters=outcome,
            )
        slow = [n for n, r in outcome.items() if r in ("timeout", "behind")]
        if slow:
            log.warning("commit of cas %d went on without %s (caught up later)", state.cas, slow)
        self.committed = state
        self._committed_cb(state)
        if self.name not in counted:
            # Removed from the voters by this very commit: hand over (the next master is
            # chosen among the voters); ops after this one go to it.
            self.step_down("no longer a voter", logging.INFO)
        return state

    async def _replicate_to(self, member: MemberInfo, state: StateContext, deadline: float) -> str:
        """Push ``state`` to one voter until it holds it. Outcome: acked, down (membership
        says so: it resyncs when it returns), timeout, behind (holds an older term's cas),
        deposed (it promised a newer term)."""
        loop = asyncio.get_running_loop()
        msg = StateReplicate(epoch=state.epoch, leader=self.name, state=state)
        while True:
            if not self.is_up(member):
                return "down"
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            try:
                reply = await self.pool.request(
                    member.address,
                    msg,
                    min(self.timing.attempt_timeout, remaining),
                    expect=StateReplicateReply,
                )
            except ShardexError as e:
                log.debug("replicate cas %d to %s failed: %s", state.cas, member.name, e)
                await asyncio.sleep(min(self.timing.retry_interval, max(0.0, remaining)))
                continue
            return self._on_replicate_reply(member.name, reply, state)

    def _on_replicate_reply(self, name: str, reply: StateReplicateReply, sent: StateContext) -> str:
        if reply.ok:
            self._acked[name] = (reply.epoch, reply.cas)
            return "acked" if (reply.epoch, reply.cas) >= version_of(sent) else "behind"
        if reply.promised_epoch > sent.epoch:
            self._seen_epoch = max(self._seen_epoch, reply.promised_epoch)
            self.replica.observe(reply.promised_epoch, reply.leader)
            self.step_down(f"{name} promised term {reply.promised_epoch} to {reply.leader}")
            return "deposed"
        # It kept a change of an older term at this cas or above: commit above it.
        self._cas_floor = max(self._cas_floor, reply.cas)
        return "behind"

    async def _catch_up(self) -> None:
        """Master housekeeping: re-commit above a cas some voter holds from an older term;
        push the state to up voters that are behind (returning nodes, slow ones)."""
        epoch = self.my_epoch
        if epoch is None:
            return
        if self._cas_floor >= self.state.cas:
            async with self.op_lock:
                if self.serving and self.my_epoch == epoch and self._cas_floor >= self.state.cas:
                    with contextlib.suppress(ShardexError):
                        await self.commit(self.state, epoch)
        state = self.state
        for m in [*self.voters(), *self.learners()]:
            if m.name == self.name or m.name in self._pushing or not self.is_up(m):
                continue
            if self._acked.get(m.name) == version_of(state):
                continue
            task = self._spawn(self._push(m, state))
            self._pushing[m.name] = task
            task.add_done_callback(lambda _t, n=m.name: self._pushing.pop(n, None))
        await self._admit(epoch)

    def _tombstone_retired(self) -> None:
        """A removed voter still in the member list (its eject's master failed over before
        removing it) is removed now: the master's housekeeping, idempotent."""
        if self.membership is None:
            return
        for m in self.membership.members:
            if m.member_id in self.state.retired_voters and m.name != self.name:
                self.membership.remove(m.name)

    async def _admit(self, epoch: int) -> None:
        """Admit one learner that holds the current state to the voters (a manager that
        joined): one commit of the current set; the next learner at a later tick. A manager
        an eject is removing is not admitted."""
        state = self.state
        eject = state.rebalance
        leaving = set(eject.eject) if eject is not None and eject.state == RUNNING else set()
        self._tombstone_retired()
        for m in self.learners():
            if m.name in leaving or not self.is_up(m):
                continue
            if self._acked.get(m.name) != version_of(state):
                continue  # not caught up yet: pushed above
            async with self.op_lock:
                if not self.serving or self.my_epoch != epoch or self.state is not state:
                    return
                try:
                    await self.commit(with_voter(state, m.name, m.member_id), epoch)
                except ShardexError as e:
                    log.warning("coordinator %s: admitting %s failed: %s", self.name, m.name, e)
                    return
            log.info(
                "coordinator %s: manager %s admitted to the voters: %s",
                self.name,
                m.name,
                sorted(self.voter_set()),
            )
            return

    async def _push(self, member: MemberInfo, state: StateContext) -> None:
        try:
            reply = await self.pool.request(
                member.address,
                StateReplicate(epoch=state.epoch, leader=self.name, state=state),
                self.timing.attempt_timeout,
                expect=StateReplicateReply,
            )
        except ShardexError as e:
            log.debug("catch-up of %s failed: %s", member.name, e)
            return
        if self.my_epoch == state.epoch:
            self._on_replicate_reply(member.name, reply, state)

    # -- voter side --

    def on_gather(self, msg: StateGather) -> StateGatherReply:
        reply = self.replica.on_gather(msg)
        self._seen_epoch = max(self._seen_epoch, msg.epoch)
        if reply.ok:
            self._hint = None
            if self.my_epoch is not None:
                self.step_down(f"{msg.candidate} asked for term {msg.epoch}")
        return reply

    def on_replicate(self, msg: StateReplicate) -> StateReplicateReply:
        reply, took = self.replica.on_replicate(msg)
        self._seen_epoch = max(self._seen_epoch, msg.epoch)
        if self.my_epoch is not None and self.replica.promised_epoch != self.my_epoch:
            self.step_down(f"{msg.leader} replicates term {msg.epoch}")
        if took:
            self._applied(msg.state)
        return reply


def _count_in(names: list[str], voters: list[MemberInfo]) -> int:
    """How many of ``names`` are among ``voters``."""
    voter_names = {m.name for m in voters}
    return sum(1 for n in names if n in voter_names)

"""Automatic failover: the master fails over a data node that a majority of managers see down.

Runs on the coordinator master only, one loop per master term: the coordinator's recovery hook
starts it when this node becomes master, and the loop ends as soon as the node is no longer
master of that term (the rebalancer ties its background task to the term the same way).

Every ``INTERVAL`` seconds the loop looks at the master's own membership view. A data node
(not failed over) silent for at least ``timeout`` seconds is a candidate; the loop then asks
every manager of the member list for its view (``MembersRequest``) and counts those that also
see it down for at least ``timeout`` (the master's own view counts; a manager that does not
answer does not agree; a node outside the member list never counts). With a majority of the
managers agreeing, it runs the ``Failover`` op, under the op lock of its term
(``Coordinator.exclusive``: serialized with every other op and committed like one; a term
that ended refuses it), never with ``allow_data_loss``: a failover that would lose data is
skipped and logged once per node, with the partitions. No more than ``max_count`` nodes may be
failed over and not yet recovered (manual failovers count too: the state does not say who
started one, and with one pending an operator is involved already); past it a warning says
that an operator must act.

A view that reports a node down but has never heard from it gives no age: such a report
counts from the first time this loop saw it, a lower bound of the real time (a manager that
just started cannot tell how long a node it never heard has been gone).

``decide`` is the pure decision (unit-tested); ``AutoFailover`` does the I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import shardex.manager.failover as failover_op
from shardex.api.failover import REASON_DATA_LOSS, REASON_REBALANCE, Failover
from shardex.api.membership import MembersReply, MembersRequest
from shardex.errors import ShardexError
from shardex.manager.replication import majority
from shardex.meta.member_list import DOWN, MemberView

log = logging.getLogger(__name__)

INTERVAL = 0.5
MEMBERS_TIMEOUT = 1.0
DEFAULT_TIMEOUT = 5.0
MIN_TIMEOUT = 2.0
DEFAULT_MAX_COUNT = 1


@dataclasses.dataclass(frozen=True)
class AutoFailoverSettings:
    """The node config's ``auto_failover*`` keys (validated in ``node/config.py``)."""

    enabled: bool = True
    timeout: float = DEFAULT_TIMEOUT  # seconds a node must have been seen down
    max_count: int = DEFAULT_MAX_COUNT  # failed-over nodes not yet recovered, at most


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the loop does this tick. ``fail_over``: node -> the managers that agreed, in
    the order to run them; ``unconfirmed``: candidates without a majority (node -> who
    agreed); ``over_limit``: confirmed but past ``max_count``."""

    fail_over: dict[str, list[str]]
    unconfirmed: dict[str, list[str]]
    over_limit: dict[str, list[str]]
    needed: int  # managers that must agree


def decide(
    *,
    managers: Sequence[str],
    candidates: Sequence[str],
    views: Mapping[str, Mapping[str, float]],
    timeout: float,
    failed_over: int,
    max_count: int,
) -> Decision:
    """Which ``candidates`` (data nodes the master has seen down for ``timeout``) to fail
    over. ``managers``: the coordinator's voters; ``views``: observer ->
    node -> seconds that observer has seen it down (absent: not down); ``failed_over``:
    nodes failed over and not recovered. Pure."""
    voters = sorted(set(managers))
    needed = majority(len(voters))
    confirmed: dict[str, list[str]] = {}
    unconfirmed: dict[str, list[str]] = {}
    for node in sorted(set(candidates)):
        agree = [m for m in voters if views.get(m, {}).get(node, -1.0) >= timeout]
        (confirmed if len(agree) >= needed else unconfirmed)[node] = agree
    room = max(0, max_count - failed_over)
    chosen = dict(list(confirmed.items())[:room])
    over = {n: agree for n, agree in confirmed.items() if n not in chosen}
    return Decision(fail_over=chosen, unconfirmed=unconfirmed, over_limit=over, needed=needed)


def down_for(row: MemberView, first_seen: float | None, now: float) -> float | None:
    """Seconds an observer's row says the member has been down; None if it is not down.
    Never heard (no age): since ``first_seen``, when this loop first saw such a report."""
    if row.state != DOWN:
        return None
    if row.last_heartbeat_age is not None:
        return row.last_heartbeat_age
    return None if first_seen is None else max(0.0, now - first_seen)


class AutoFailover:
    """The master's auto-failover loop (module docstring)."""

    def __init__(self, coordinator: Any, settings: AutoFailoverSettings) -> None:
        self._c = coordinator
        self.settings = settings
        self._first_seen: dict[tuple[str, str], float] = {}  # (observer, node) -> loop time
        self._said: dict[str, str] = {}  # node -> the last warning logged about it

    def register(self) -> None:
        if self.settings.enabled:
            self._c.register_recovery(self._on_master)

    async def _on_master(self, ctx: Any) -> None:
        log.info(
            "auto-failover on (master term %d): a data node seen down for %.3gs by a majority "
            "of managers is failed over, at most %d at a time",
            ctx.epoch,
            self.settings.timeout,
            self.settings.max_count,
        )
        self._c.spawn(self._run(ctx.epoch))

    async def _run(self, epoch: int) -> None:
        self._first_seen.clear()
        self._said.clear()
        while True:
            # First sleep: the term starts serving once its recovery hooks have returned.
            await asyncio.sleep(INTERVAL)
            if self._c.epoch != epoch:
                return  # deposed: the next master runs its own loop
            try:
                await self.tick(epoch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("auto-failover tick failed")

    def _say(self, node: str, level: int, text: str) -> None:
        """Log ``text`` about ``node`` once until something else is said about it."""
        if self._said.get(node) != text:
            self._said[node] = text
            log.log(level, "%s", text)

    async def tick(self, epoch: int) -> None:
        c = self._c
        state = c.state
        membership = c.membership
        now = asyncio.get_running_loop().time()
        own = membership.view()
        timeout = self.settings.timeout
        data = {
            r.name for r in own.members if "data" in r.services and r.name not in state.failed_over
        }
        mine = self._views_of(own, now)
        candidates = [n for n, age in mine.items() if n in data and age >= timeout]
        for node in [n for n in self._said if n not in candidates]:
            del self._said[node]  # back up (or failed over): say it again next time
        if not candidates:
            return
        # The committed voters only: an unknown or removed manager's view never counts.
        managers = c.voter_names
        views = {own.observer: mine}
        others = [r for r in own.members if r.name in managers and r.name != own.observer]
        replies = await asyncio.gather(*(self._ask(r.address) for r in others))
        for reply in replies:
            if reply is not None and reply.observer in managers:
                views[reply.observer] = self._views_of(reply, now)
        decision = decide(
            managers=managers,
            candidates=candidates,
            views=views,
            timeout=timeout,
            failed_over=len(state.failed_over),
            max_count=self.settings.max_count,
        )
        for node, agree in decision.unconfirmed.items():
            self._say(
                node,
                logging.INFO,
                f"auto-failover: {node} down for {mine[node]:.1f}s in {own.observer}'s view; "
                f"only {agree} of managers {sorted(managers)} agree ({decision.needed} "
                "needed): not failing it over",
            )
        for node, agree in decision.over_limit.items():
            self._say(
                node,
                logging.WARNING,
                f"auto-failover: {node} is down for {mine[node]:.1f}s (confirmed by "
                f"{', '.join(agree)}) but "
                f"{len(state.failed_over)} node(s) are already failed over "
                f"({sorted(state.failed_over)}; auto_failover_max_count "
                f"{self.settings.max_count}): an operator must act: `shardex failover {node}` "
                "or recover the failed-over nodes (`shardex recovery NODE`) and rebalance",
            )
        for node, agree in decision.fail_over.items():
            if c.epoch != epoch:
                return
            await self._fail_over(epoch, node, mine[node], agree, managers)

    def _views_of(self, reply: MembersReply, now: float) -> dict[str, float]:
        """node -> seconds ``reply``'s observer has seen it down (only nodes seen down)."""
        out: dict[str, float] = {}
        for row in reply.members:
            key = (reply.observer, row.name)
            if row.state == DOWN and row.last_heartbeat_age is None:
                self._first_seen.setdefault(key, now)
            else:
                self._first_seen.pop(key, None)
            age = down_for(row, self._first_seen.get(key), now)
            if age is not None:
                out[row.name] = age
        return out

    async def _ask(self, address: str) -> MembersReply | None:
        try:
            reply = await self._c.pool.request(address, MembersRequest(), MEMBERS_TIMEOUT)
        except ShardexError as exc:
            log.debug("auto-failover: no membership view from %s: %s", address, exc)
            return None
        return reply if isinstance(reply, MembersReply) else None

    async def _fail_over(
        self, epoch: int, node: str, age: float, agree: list[str], managers: list[str]
    ) -> None:
        log.warning(
            "auto-failover: %s down for %.1fs; %d of %d managers agree (%s): failing it over",
            node,
            age,
            len(agree),
            len(managers),
            ", ".join(agree),
        )
        msg = Failover(node=node)
        try:
            reply = await self._c.exclusive(epoch, lambda ctx: failover_op.failover(msg, ctx))
        except ShardexError as exc:
            reason = exc.details.get("reason")
            if reason == REASON_DATA_LOSS:
                self._say(
                    node,
                    logging.WARNING,
                    f"auto-failover of {node} skipped: it would lose partitions "
                    f"{exc.details.get('lost')} (no reachable replica); start the replica "
                    f"nodes, or fail it over by hand with --allow-data-loss",
                )
            elif reason == REASON_REBALANCE:
                self._say(node, logging.WARNING, f"auto-failover of {node} waits: {exc.message}")
            else:
                self._say(node, logging.WARNING, f"auto-failover of {node} failed: {exc}")
            return
        log.warning(
            "auto-failover: %s failed over at cas %d; promoted %s; lost %s; recover it with "
            "`shardex recovery %s` once it is back, then rebalance",
            node,
            reply.cas,
            reply.promoted,
            reply.lost,
            node,
        )

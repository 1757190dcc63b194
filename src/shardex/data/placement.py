"""The data service's view of placement: keyspace metas and topologies from the manager state.

A data node needs the state for three things: owner hints in NOT_MY_PARTITION answers, the
fan-out of ``HighSeqnos`` / ``KeyspaceStats`` to the owners, and reconciling its partitions
with the latest topology after a restart. On a node that also runs the manager service the
local coordinator replica holds the state (replicated synchronously before any op replies);
elsewhere the node asks a manager with ``StateRequest``. The cached copy may be stale: every
user of it treats it as a hint and the owners' own answers as the truth.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from shardex.api.coordinator import StateReply, StateRequest
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.meta.member_list import MemberInfo
from shardex.meta.state import StateContext, version_of
from shardex.net import ConnectionPool

log = logging.getLogger(__name__)

STATE_TIMEOUT = 2.0
# What a data node reads of the manager state.
PLACEMENT_SECTIONS = ("keyspaces", "data_topologies", "rebalance", "failed_over", "recovering")


def latest_topology(state: StateContext, keyspace: str) -> Topology | None:
    history = state.data_topologies.get(keyspace)
    return history[-1] if history else None


class PlacementView:
    """Cached manager state plus the member list's name -> address map."""

    def __init__(
        self,
        *,
        me: str,
        coordinator: Callable[[], Any | None],
        members: Callable[[], list[MemberInfo]],
        pool: ConnectionPool,
    ) -> None:
        self.me = me
        self._coordinator = coordinator
        self._members = members
        self._pool = pool
        self._state: StateContext | None = None

    @property
    def cached(self) -> StateContext | None:
        coord = self._coordinator()
        if coord is not None:
            return self._newer(coord.state)
        return self._state

    def _newer(self, state: StateContext) -> StateContext:
        """``state`` unless the remembered one is newer. The local replica usually leads our
        cache, but not on a node back from a partition: ``quorum_state`` found the
        majority's newer state (a failover of this node, say) while the local replica has
        not caught up yet, and reconciling from that replica would undo what it saw
        (promoting copies the failover took away)."""
        mine = self._state
        # ``is``: usually the very state remembered (every write asks, via ``cached``)
        if mine is not None and mine is not state and version_of(mine) > version_of(state):
            return mine
        return state

    def remember(self, state: StateContext) -> None:
        if self._state is None or version_of(state) >= version_of(self._state):
            self._state = state

    async def refresh(self) -> StateContext:
        """The freshest state we can get: the local replica, else the first manager that
        answers. Raises NODE_UNAVAILABLE when no manager does."""
        coord = self._coordinator()
        if coord is not None:
            state: StateContext = self._newer(coord.state)
            self.remember(state)
            return state
        errors: dict[str, str] = {}
        managers = [m for m in self._members() if "manager" in m.services]
        for m in managers:
            try:
                reply = await self._pool.request(
                    m.address,
                    StateRequest(sections=list(PLACEMENT_SECTIONS)),
                    STATE_TIMEOUT,
                    expect=StateReply,
                )
            except ShardexError as exc:
                errors[m.name] = str(exc)
                continue
            self.remember(reply.state)
            return reply.state
        raise NodeUnavailable(
            "no manager answered the state request",
            details={"managers": [m.name for m in managers], "errors": errors},
        )

    async def quorum_state(self) -> StateContext:
        """The newest state a majority of the managers hold (this node's own replica
        counted when it is one): every committed state is on a majority, so this one is at
        least as new as the last commit, which the local replica alone may not be (a node
        back from a partition). Raises NODE_UNAVAILABLE without a majority of answers."""
        managers = [m for m in self._members() if "manager" in m.services]
        need = len(managers) // 2 + 1
        states: list[StateContext] = []
        coord = self._coordinator()
        asks = []
        others = []
        for m in managers:
            if coord is not None and m.name == self.me:
                states.append(coord.state)
                continue
            req = StateRequest(sections=list(PLACEMENT_SECTIONS))
            asks.append(self._pool.request(m.address, req, STATE_TIMEOUT, expect=StateReply))
            others.append(m.name)
        errors: dict[str, str] = {}
        answers = await asyncio.gather(*asks, return_exceptions=True)
        for name, got in zip(others, answers, strict=True):
            if isinstance(got, StateReply):
                states.append(got.state)
            elif isinstance(got, ShardexError):
                errors[name] = str(got)
                # a connection that carried nothing back may be dead: the next try reconnects
                await self._pool.drop(self.address(name))
            else:
                raise got  # type: ignore[misc]
        if not managers or len(states) < need:
            raise NodeUnavailable(
                f"{len(states)} of {len(managers)} managers answered, a majority is {need}: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())),
                details={"managers": [m.name for m in managers], "errors": errors},
            )
        state = max(states, key=version_of)
        self.remember(state)
        return state

    async def state(self) -> StateContext:
        cached = self.cached
        return cached if cached is not None else await self.refresh()

    def topology(self, keyspace: str) -> Topology | None:
        state = self.cached
        return None if state is None else latest_topology(state, keyspace)

    def owner_hint(self, keyspace: str, partition: int) -> str | None:
        topo = self.topology(keyspace)
        return None if topo is None else topo.assignment.get(partition)

    def address(self, node: str) -> str:
        for m in self._members():
            if m.name == node:
                return m.address
        raise ShardexError(
            f"node {node!r} is not in the member list",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={"node": node},
        )

    def keyspace_exists(self, keyspace: str) -> bool:
        state = self.cached
        return state is not None and keyspace in state.keyspaces

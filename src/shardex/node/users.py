"""Where a node checks a user's login: the users of the committed cluster state.

A manager node reads its own replica of the coordinator state (``StateUsers``: replicated
with every commit). Any other node keeps a copy of the users section, asked of the managers
every ``REFRESH`` seconds (``RemoteUsers``): a login is still checked locally, and a user
created, changed or dropped a moment ago is seen there within that period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from shardex.api.coordinator import StateReply, StateRequest
from shardex.errors import ShardexError
from shardex.meta.member_list import MemberInfo
from shardex.meta.users import UserRecord
from shardex.net import ConnectionPool
from shardex.net.credentials import UserCredential

if TYPE_CHECKING:
    from shardex.manager.coordinator import Coordinator

log = logging.getLogger(__name__)

REFRESH = 2.0
# A copy that no manager has filled yet (a node that just started) asks again this soon.
RETRY = 0.2
MISS_REFRESH = 0.5
TIMEOUT = 5.0


class _Credentials:
    """Each record's ``UserCredential``, made once per record: a user's connection looks its
    user up before every message it sends (``net/gate.py``)."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[UserRecord, UserCredential]] = {}

    def of(self, rec: UserRecord | None) -> UserCredential | None:
        if rec is None:
            return None
        made = self._made.get(rec.name)
        if made is not None and made[0] is rec:  # records are replaced, never changed
            return made[1]
        cred = rec.credential()
        self._made[rec.name] = (rec, cred)
        return cred


class StateUsers:
    """The users of this manager node's replica of the coordinator state."""

    def __init__(self, coordinator: Callable[[], Coordinator | None]) -> None:
        self._coordinator = coordinator
        self._creds = _Credentials()

    def lookup_user(self, name: str) -> UserCredential | None:
        c = self._coordinator()
        return self._creds.of(c.state.users.get(name) if c is not None else None)

    async def lookup_missing(self, name: str) -> UserCredential | None:
        return None  # the replica is where users are kept: nothing further to ask


class RemoteUsers:
    """A non-manager node's copy of the users, refreshed from the managers."""

    def __init__(self, pool: ConnectionPool, members: Callable[[], list[MemberInfo]]) -> None:
        self._pool = pool
        self._members = members
        self._users: dict[str, UserRecord] = {}
        self._creds = _Credentials()
        self._task: asyncio.Task[None] | None = None
        self._miss: asyncio.Task[bool] | None = None
        self._miss_at = 0.0

    def lookup_user(self, name: str) -> UserCredential | None:
        self.start()  # a node nobody logged in to yet (a simulation's) asks nobody
        return self._creds.of(self._users.get(name))

    async def lookup_missing(self, name: str) -> UserCredential | None:
        """A login for a name the copy lacks refreshes it first (one refresh in flight,
        shared by every such login, at most one per ``MISS_REFRESH``): a node that just
        joined, or a user made a moment ago, is not refused for the copy's lag."""
        loop = asyncio.get_running_loop()
        if self._miss is None or (self._miss.done() and loop.time() >= self._miss_at):
            self._miss_at = loop.time() + MISS_REFRESH
            self._miss = loop.create_task(self.refresh(), name="users-refresh-miss")
        with contextlib.suppress(ShardexError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._miss), TIMEOUT)
        return self._creds.of(self._users.get(name))

    def start(self) -> None:
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._loop(), name="users-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._pool.close()

    async def refresh(self) -> bool:
        """One refresh from the first manager that answers; False if none did."""
        for m in self._members():
            if "manager" not in m.services:
                continue
            try:
                reply = await self._pool.request(
                    m.address, StateRequest(sections=["users"]), TIMEOUT, expect=StateReply
                )
            except ShardexError as e:
                log.debug("users from %s: %s", m.name, e)
                continue
            self._users = dict(reply.state.users)
            return True
        return False

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH if await self.refresh() else RETRY)

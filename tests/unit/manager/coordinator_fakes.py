"""What a coordinator op sees of the master (its ``OpContext``), faked for the op tests of
keyspace and index DDL: the member list with who is up, a connection pool that records what
it sends and fails for chosen nodes, and a context whose commit bumps the cas and keeps
every committed state."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import ModuleType

import msgspec
import pytest

from shardex.errors import NodeUnavailable
from shardex.meta.member_list import DOWN, UP, MemberInfo
from shardex.meta.state import StateContext, record_reply
from shardex.net.messages import Message


class FakeMembership:
    """Members ``id-<name>`` at ``<name>:1``: those of ``up`` (name -> up?) with
    ``services``, and ``others`` (name -> services), always up. Tests flip ``up``."""

    def __init__(
        self,
        up: dict[str, bool],
        services: tuple[str, ...],
        others: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        members = [(n, services) for n in up] + list((others or {}).items())
        self.members = [
            MemberInfo(member_id=f"id-{n}", name=n, address=f"{n}:1", services=s)
            for n, s in members
        ]
        self.up = {**up, **dict.fromkeys(others or {}, True)}

    def state_of(self, member_id: str, now: float) -> tuple[str, float]:
        return (UP if self.up[member_id[3:]] else DOWN), 0.0


class FakePool:
    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.sent: list[tuple[str, Message]] = []

    async def request(self, address: str, msg: Message, timeout: float) -> None:
        node = address.split(":")[0]
        self.sent.append((node, msg))
        if node in self.failing:
            raise NodeUnavailable(f"{node} is unreachable")


class FakeCtx:
    """The master's context for one op: ``commits`` holds every state committed."""

    def __init__(
        self,
        state: StateContext,
        membership: FakeMembership,
        ids: Iterator[str],
        failing: frozenset[str] = frozenset(),
        request_id: str | None = "r1",
    ) -> None:
        self.state = state
        self.membership = membership
        self.pool = FakePool(set(failing))
        self.request_id = request_id
        self.commits: list[StateContext] = []
        self._ids = ids

    def new_id(self) -> str:
        return next(self._ids)

    async def commit(self, new: StateContext, *, reply: Message | None = None) -> StateContext:
        assert new.cas == self.state.cas, "built on a stale state"
        if reply is not None and self.request_id is not None:
            new = record_reply(new, self.request_id, reply)
        self.state = msgspec.structs.replace(new, cas=self.state.cas + 1)
        self.commits.append(self.state)
        return self.state


def no_backoff(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> None:
    """``module``'s retry back-offs (``asyncio.sleep``) return at once."""

    async def fast_sleep(_: float) -> None:
        return None

    monkeypatch.setattr(module.asyncio, "sleep", fast_sleep)

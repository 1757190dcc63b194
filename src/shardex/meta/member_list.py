"""The member list and the membership messages (data only; the service is in
``shardex.manager.membership``).

Each entry is owned by its member and carries an ``incarnation`` that only that member bumps
(when its address or services change). Lists merge by member id, higher incarnation wins, so
merging is commutative, associative and idempotent. The membership ``version`` is the sum of
incarnations: every change increases it and equal lists have equal versions; the ``digest``
tells apart different lists that happen to have equal versions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Protocol

import msgspec

UP = "up"
DOWN = "down"
UNKNOWN = "unknown"  # a non-manager observer cannot see non-manager members


class MemberInfo(msgspec.Struct, kw_only=True, frozen=True):
    """One member-list entry, owned (and only ever changed) by the member itself."""

    member_id: str
    name: str
    address: str
    services: tuple[str, ...]
    incarnation: int = 1
    # Server group label (rack, zone) from the node's config; "" = none. Defaulted so that
    # member lists encoded before groups existed still decode.
    group: str = ""
    # A tombstone: the member was removed from the cluster (``shardex rebalance --eject``).
    # It outranks every entry of that member whatever the incarnation, so gossip (or the
    # member itself, restarted) never brings it back; a new node joins under a new id.
    removed: bool = False

    def sort_key(self) -> tuple[Any, ...]:
        return (self.removed, self.incarnation, self.name, self.address, self.services, self.group)


class MemberView(msgspec.Struct, kw_only=True):
    """One row of an observer's view: the entry plus what the observer knows of its health."""

    member_id: str
    name: str
    address: str
    services: tuple[str, ...]
    incarnation: int
    state: str  # "up" | "down" | "unknown"
    last_heartbeat_age: float | None  # seconds since the observer last heard it; None: never
    group: str = ""  # server group label; "" = none


# --- messages -------------------------------------------------------------------------


# --- member list -----------------------------------------------------------------------


def list_version(members: Iterable[MemberInfo]) -> int:
    return sum(m.incarnation for m in members)


def list_digest(members: Iterable[MemberInfo]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for m in sorted(members, key=lambda m: m.member_id):
        h.update(msgspec.msgpack.encode(m))
    return h.hexdigest()


def merge_members(
    local: dict[str, MemberInfo], incoming: Iterable[MemberInfo]
) -> dict[str, MemberInfo]:
    """Union by member id; a tombstone wins, then the higher incarnation (ties broken on
    content so that every node picks the same entry whatever the merge order)."""
    merged = dict(local)
    for m in incoming:
        cur = merged.get(m.member_id)
        if cur is None or m.sort_key() > cur.sort_key():
            merged[m.member_id] = m
    return merged


class MemberStore(Protocol):
    """Where a node keeps its last known member list across restarts."""

    def load(self) -> list[MemberInfo] | None: ...

    def save(self, members: list[MemberInfo]) -> None: ...


class MemoryMemberStore:
    """For tests and the simulator: survives a simulated restart if the test keeps it."""

    def __init__(self) -> None:
        self.members: list[MemberInfo] | None = None

    def load(self) -> list[MemberInfo] | None:
        return None if self.members is None else list(self.members)

    def save(self, members: list[MemberInfo]) -> None:
        self.members = list(members)


def self_entry(
    member_id: str,
    name: str,
    address: str,
    services: Iterable[str],
    persisted: list[MemberInfo] | None,
    group: str = "",
) -> MemberInfo:
    """This node's own entry: the persisted one if unchanged, else a bumped incarnation so
    the new address/services/group win every merge."""
    entry = MemberInfo(
        member_id=member_id, name=name, address=address, services=tuple(services), group=group
    )
    for old in persisted or ():
        if old.member_id == member_id:
            if old.removed:
                return old  # removed from the cluster: this identity never comes back
            same = (old.name, old.address, old.services, old.group) == (
                name,
                address,
                entry.services,
                group,
            )
            inc = old.incarnation if same else old.incarnation + 1
            return msgspec.structs.replace(entry, incarnation=inc)
    return entry

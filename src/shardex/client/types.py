"""Public result types of the client: plain frozen dataclasses, independent of wire structs
(so the wire format can evolve without breaking users)."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardex.manager.membership import MembersReply
from shardex.node.server import StatusReply


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    """What ``Client.ping()`` returns: who answered and how fast."""

    name: str
    member_id: str
    address: str
    services: tuple[str, ...]
    pid: int
    uptime: float
    shardex_version: str
    membership_version: int
    joined: bool
    rtt: float  # seconds, measured by the client

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MemberStatus:
    name: str
    member_id: str
    address: str
    services: tuple[str, ...]
    state: str  # "up" | "down" | "unknown"
    last_heartbeat_age: float | None
    incarnation: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    """One node's membership view (``observer``); managers' views come from heartbeats."""

    observer: str
    observer_id: str
    observer_is_manager: bool
    version: int
    digest: str
    heartbeat_interval: float
    failure_timeout: float
    members: tuple[MemberStatus, ...]

    def member(self, name: str) -> MemberStatus | None:
        return next((m for m in self.members if m.name == name), None)

    @property
    def up(self) -> list[str]:
        return [m.name for m in self.members if m.state == "up"]

    @property
    def down(self) -> list[str]:
        return [m.name for m in self.members if m.state == "down"]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def node_status_from(reply: StatusReply, rtt: float) -> NodeStatus:
    return NodeStatus(
        name=reply.name,
        member_id=reply.member_id,
        address=reply.address,
        services=tuple(reply.services),
        pid=reply.pid,
        uptime=reply.uptime,
        shardex_version=reply.shardex_version,
        membership_version=reply.membership_version,
        joined=reply.joined,
        rtt=rtt,
    )


def cluster_status_from(reply: MembersReply) -> ClusterStatus:
    return ClusterStatus(
        observer=reply.observer,
        observer_id=reply.observer_id,
        observer_is_manager=reply.observer_is_manager,
        version=reply.version,
        digest=reply.digest,
        heartbeat_interval=reply.heartbeat_interval,
        failure_timeout=reply.failure_timeout,
        members=tuple(
            MemberStatus(
                name=m.name,
                member_id=m.member_id,
                address=m.address,
                services=tuple(m.services),
                state=m.state,
                last_heartbeat_age=m.last_heartbeat_age,
                incarnation=m.incarnation,
            )
            for m in reply.members
        ),
    )

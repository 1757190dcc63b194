"""Public result types of the client: plain frozen dataclasses, independent of wire structs
(so the wire format can evolve without breaking users)."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardex.core.topology import Topology
from shardex.data.messages import PartitionStat
from shardex.manager.membership import MembersReply
from shardex.manager.state import KeyspaceMeta
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


@dataclasses.dataclass(frozen=True)
class KeyspaceDescription:
    """A keyspace as the manager knows it, with its latest data topology."""

    name: str
    num_partitions: int
    uuid: str
    created_cas: int
    topology_seq: int | None
    assignment: dict[int, str]  # partition -> node (latest topology)

    def partitions_of(self, node: str) -> list[int]:
        return sorted(p for p, n in self.assignment.items() if n == node)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe(meta: KeyspaceMeta, topology: Topology | None) -> KeyspaceDescription:
    return KeyspaceDescription(
        name=meta.name,
        num_partitions=meta.num_partitions,
        uuid=meta.uuid,
        created_cas=meta.created_cas,
        topology_seq=None if topology is None else topology.seq_num,
        assignment={} if topology is None else dict(sorted(topology.assignment.items())),
    )


@dataclasses.dataclass(frozen=True)
class PartitionStats:
    partition: int
    node: str
    doc_count: int
    high_seqno: int
    uuid: int


@dataclasses.dataclass(frozen=True)
class KeyspaceStatsResult:
    """What ``Client.keyspace_stats`` returns: one row per partition, in partition order."""

    keyspace: str
    partitions: tuple[PartitionStats, ...]

    @property
    def total_docs(self) -> int:
        return sum(p.doc_count for p in self.partitions)

    def by_node(self) -> dict[str, tuple[int, int]]:
        """node -> (partitions, documents)."""
        out: dict[str, tuple[int, int]] = {}
        for p in self.partitions:
            parts, docs = out.get(p.node, (0, 0))
            out[p.node] = (parts + 1, docs + p.doc_count)
        return dict(sorted(out.items()))


def stats_from(keyspace: str, rows: list[PartitionStat]) -> KeyspaceStatsResult:
    return KeyspaceStatsResult(
        keyspace,
        tuple(
            PartitionStats(r.partition, r.node, r.doc_count, r.high_seqno, r.uuid)
            for r in sorted(rows, key=lambda r: r.partition)
        ),
    )

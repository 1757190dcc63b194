"""Public result types of the client: plain frozen dataclasses, independent of wire structs
(so the wire format can evolve without breaking users)."""

from __future__ import annotations

import dataclasses
from typing import Any

from shardex.api.data import PartitionStat
from shardex.api.membership import MembersReply
from shardex.api.node import StatusReply
from shardex.core.topology import Topology
from shardex.meta.rebalance_state import RebalanceRecord
from shardex.meta.state import KeyspaceMeta


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
    group: str = ""  # server group label; "" = none

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
                group=m.group,
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
    num_replicas: int = 0  # configured replica copies per partition
    # partition -> replica nodes in promotion order (latest topology)
    replicas: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    # what the replica placement could not honour (create only: too few nodes or groups)
    warnings: list[str] = dataclasses.field(default_factory=list)
    max_ttl: int = 0  # seconds: documents' default and largest expiry (0: none)

    def partitions_of(self, node: str) -> list[int]:
        return sorted(p for p, n in self.assignment.items() if n == node)

    @property
    def min_replicas(self) -> int:
        """The shortest chain's replica count: below ``num_replicas`` after a failover (or
        with too few nodes) until a rebalance restores the chains."""
        if not self.assignment:
            return 0
        return min(len(self.replicas.get(p, ())) for p in self.assignment)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe(
    meta: KeyspaceMeta, topology: Topology | None, warnings: list[str] | None = None
) -> KeyspaceDescription:
    return KeyspaceDescription(
        name=meta.name,
        num_partitions=meta.num_partitions,
        uuid=meta.uuid,
        created_cas=meta.created_cas,
        topology_seq=None if topology is None else topology.seq_num,
        assignment={} if topology is None else dict(sorted(topology.assignment.items())),
        num_replicas=meta.num_replicas,
        max_ttl=meta.max_ttl,
        replicas={}
        if topology is None
        else {p: list(r) for p, r in sorted(topology.replicas.items())},
        warnings=list(warnings or ()),
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


@dataclasses.dataclass(frozen=True)
class MoveResult:
    """One partition migration of a rebalance (``RebalanceResult.moves``)."""

    keyspace: str
    partition: int
    source: str
    target: str
    status: str  # planned, moving, done, failed, unresolved, cancelled
    phase: str  # live phase while moving (copying, hand-over, publishing, resolving)
    error: str
    topology_seq: int  # the topology that published it (done)
    bytes: int
    docs: int
    copy_seconds: float
    pause_ms: float  # writes to the partition were refused (retried) this long
    seconds: float
    index: str = ""  # an index partition's move: the index name ("": a data partition)
    kind: str = "move"  # "add": a new copy of an index partition (the source keeps its own)


@dataclasses.dataclass(frozen=True)
class RebalanceResult:
    """What ``Client.rebalance`` / ``move_partition`` return (and ``rebalance_status``)."""

    id: str
    kind: str  # "rebalance" or "move"
    state: str  # running, done, failed
    message: str
    started_at: float  # wall clock
    finished_at: float
    moves: tuple[MoveResult, ...]

    @property
    def moved(self) -> list[MoveResult]:
        return [m for m in self.moves if m.status == "done"]

    @property
    def failed(self) -> list[MoveResult]:
        return [m for m in self.moves if m.status not in ("done", "planned", "moving")]

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self.moved)

    @property
    def docs(self) -> int:
        return sum(m.docs for m in self.moved)

    @property
    def duration(self) -> float:
        return max(0.0, self.finished_at - self.started_at) if self.finished_at else 0.0

    @property
    def max_pause_ms(self) -> float:
        return max((m.pause_ms for m in self.moved), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _move_result(m: Any, phases: dict[str, str], **extra: Any) -> MoveResult:
    """One data or index move of a rebalance record as the client shows it."""
    return MoveResult(
        keyspace=m.keyspace,
        partition=m.partition,
        source=m.source,
        target=m.target,
        status=m.status,
        phase=phases.get(m.migration_id, ""),
        error=m.error,
        topology_seq=m.topology_seq,
        bytes=m.bytes,
        copy_seconds=m.copy_seconds,
        seconds=m.seconds,
        **extra,
    )


def rebalance_from(record: RebalanceRecord, phases: dict[str, str]) -> RebalanceResult:
    return RebalanceResult(
        id=record.id,
        kind=record.kind,
        state=record.state,
        message=record.message,
        started_at=record.started_at,
        finished_at=record.finished_at,
        moves=tuple(_move_result(m, phases, docs=m.docs, pause_ms=m.pause_ms) for m in record.moves)
        + tuple(
            # an index move never pauses writes or scans
            _move_result(m, phases, docs=m.items, pause_ms=0.0, index=m.index_name, kind=m.kind)
            for m in record.index_moves
        ),
    )

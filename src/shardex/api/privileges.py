"""What a user may send: the one table of user-callable messages, and the roles that grant
their privileges (docs/decisions/0091-users-roles-and-privileges.md).

A node may send every message. A user's connection is checked by ``authorize`` before any
handler runs (``RpcServer(authorizer=...)``): a message whose tag is not in ``USER_MESSAGES``
is node-only - secure by default, so a message added without a line here is refused to
users - and one that is needs the privilege its line names, on the keyspace its line reads
from the message. ``INTERNAL_MESSAGES`` lists the node-only tags on purpose, so that a test
can fail when a new message type is in neither set.

Roles (modelled on Couchbase's RBAC), ``ks`` a keyspace name or ``*`` for every keyspace:

    admin               everything, users included
    cluster_admin       cluster.manage (rebalance, failover, recovery), keyspace.manage on *
    keyspace_admin(ks)  keyspace.manage: create/drop the keyspace, its replicas and indexes
    data_reader(ks)     data.read: get, range reads, change streams, high seqnos, stats
    data_writer(ks)     data.write: insert, upsert, replace, delete, batches of them
    query_select(ks)    query.select: index scans, paginated scans, SQL SELECT
    query_update(ks)    query.update: SQL INSERT, UPDATE, DELETE (query_insert and
                        query_delete folded in)

Every user also holds cluster.read (status, members, the cluster state without the users'
credentials, keyspace lists): a client cannot route without it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from shardex.errors import AuthFailed, ConfigError
from shardex.net.credentials import Principal
from shardex.net.messages import Message, message_type_name


class Privilege(enum.StrEnum):
    CLUSTER_READ = "cluster.read"
    CLUSTER_MANAGE = "cluster.manage"
    USERS_MANAGE = "users.manage"
    KEYSPACE_MANAGE = "keyspace.manage"
    DATA_READ = "data.read"
    DATA_WRITE = "data.write"
    QUERY_SELECT = "query.select"
    QUERY_UPDATE = "query.update"


P = Privilege
ALL_KEYSPACES = "*"

# role name -> (privileges, takes a keyspace)
ROLES: dict[str, tuple[frozenset[Privilege], bool]] = {
    "admin": (frozenset(Privilege), False),
    "cluster_admin": (frozenset({P.CLUSTER_READ, P.CLUSTER_MANAGE, P.KEYSPACE_MANAGE}), False),
    "keyspace_admin": (frozenset({P.KEYSPACE_MANAGE}), True),
    "data_reader": (frozenset({P.DATA_READ}), True),
    "data_writer": (frozenset({P.DATA_WRITE}), True),
    "query_select": (frozenset({P.QUERY_SELECT}), True),
    "query_update": (frozenset({P.QUERY_UPDATE}), True),
}

_ROLE_RE = re.compile(r"(?P<name>[a-z_]+)(?:\((?P<ks>\*|[A-Za-z0-9_][A-Za-z0-9_.-]*)\))?")
_ROLE_HINT = (
    "roles: admin, cluster_admin, keyspace_admin(KS), data_reader(KS), data_writer(KS), "
    "query_select(KS), query_update(KS); KS a keyspace name or *"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Role:
    name: str
    keyspace: str | None = None  # None for a cluster-wide role

    def __str__(self) -> str:
        return self.name if self.keyspace is None else f"{self.name}({self.keyspace})"

    @property
    def privileges(self) -> frozenset[Privilege]:
        return ROLES[self.name][0]

    def covers(self, keyspace: str | None) -> bool:
        """This role's privileges apply on ``keyspace`` (None: on some keyspace)."""
        return self.keyspace in (None, ALL_KEYSPACES) or keyspace in (None, self.keyspace)


@functools.lru_cache(maxsize=1024)
def parse_role(text: str) -> Role:
    """``"data_reader(orders)"`` -> ``Role``; a bad spelling is a ``ConfigError`` naming it."""
    m = _ROLE_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None or m["name"] not in ROLES:
        raise ConfigError(f"unknown role {text!r}", details={"value": text, "hint": _ROLE_HINT})
    takes_keyspace = ROLES[m["name"]][1]
    if takes_keyspace != (m["ks"] is not None):
        want = f"{m['name']}(KS)" if takes_keyspace else m["name"]
        raise ConfigError(
            f"role {text!r} is spelled {want}", details={"value": text, "hint": _ROLE_HINT}
        )
    return Role(m["name"], m["ks"])


def parse_roles(texts: Iterable[str]) -> tuple[str, ...]:
    """Role strings checked and normalised, without duplicates, in their order."""
    return tuple(dict.fromkeys(str(parse_role(t)) for t in texts))


def holds(roles: Iterable[str], privilege: Privilege, keyspace: str | None) -> bool:
    """Whether ``roles`` grant ``privilege`` on ``keyspace`` (None: on some keyspace)."""
    if privilege is P.CLUSTER_READ:
        return True  # every user: clients route with it
    for text in roles:
        role = parse_role(text)
        if privilege in role.privileges and role.covers(keyspace):
            return True
    return False


def require(
    principal: Principal, privileges: tuple[Privilege, ...], keyspace: str | None, what: str
) -> None:
    """Raise ``AuthFailed`` naming ``what``, the missing privilege and the keyspace unless
    ``principal`` (a node always may) holds one of ``privileges`` on ``keyspace``."""
    if principal.is_node or any(holds(principal.roles, p, keyspace) for p in privileges):
        return
    missing = " or ".join(privileges)
    on = f" on keyspace {keyspace!r}" if keyspace is not None else ""
    raise AuthFailed(
        f"user {principal.name!r} may not {what}: it needs {missing}{on}",
        details={
            "user": principal.name,
            "type": what,
            "privilege": missing,
            "keyspace": keyspace,
            "hint": "grant a role with it: shardex user grant NAME ROLE",
        },
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A user-callable message: any of ``privileges``, on the keyspace ``keyspace_of`` reads
    (None: cluster-wide, or checked again later as SQL is); ``audited``: DDL and user
    changes, written to the node's audit log."""

    privileges: tuple[Privilege, ...]
    keyspace_of: Callable[[Any], str | None] | None = None
    audited: bool = False

    def keyspace(self, msg: Message) -> str | None:
        return self.keyspace_of(msg) if self.keyspace_of is not None else None


def _ks(msg: Any) -> str | None:
    return msg.keyspace


def _name(msg: Any) -> str | None:
    return msg.name


def _rule(*privileges: Privilege, on: Callable[[Any], str | None] | None = None) -> Rule:
    return Rule(privileges, on)


def _ddl(*privileges: Privilege, on: Callable[[Any], str | None] | None = None) -> Rule:
    return Rule(privileges, on, audited=True)


_ANY_USER = _rule(P.CLUSTER_READ)

# The one table: message tag -> what a user needs to send it. Tags, not classes: some
# user-callable messages are defined above this package (``PageScan`` in ``shardex.scan``).
USER_MESSAGES: dict[str, Rule] = {
    # liveness, topology and status: every user (the client routes with them)
    "Ping": _ANY_USER,
    "StatusRequest": _ANY_USER,
    "MembersRequest": _ANY_USER,
    "StateRequest": _ANY_USER,  # the users' credentials are left out of a user's reply
    "manager.ListKeyspaces": _ANY_USER,
    "index.ListSlices": _ANY_USER,
    "manager.GetRebalance": _ANY_USER,
    # flow control of the caller's own streams, scoped to its connection
    "data.StreamCredit": _ANY_USER,
    "data.CancelStream": _ANY_USER,
    "scan.ScanCredit": _ANY_USER,
    "scan.CancelScan": _ANY_USER,
    # documents
    "data.Get": _rule(P.DATA_READ, on=_ks),
    "data.GetMany": _rule(P.DATA_READ, on=_ks),
    "data.ReadRanges": _rule(P.DATA_READ, on=_ks),
    "data.OpenStream": _rule(P.DATA_READ, on=_ks),
    "data.KeyspaceStats": _rule(P.DATA_READ, P.QUERY_SELECT, on=_ks),
    "data.HighSeqnos": _rule(P.DATA_READ, P.QUERY_SELECT, on=_ks),
    "data.Insert": _rule(P.DATA_WRITE, on=_ks),
    "data.Upsert": _rule(P.DATA_WRITE, on=_ks),
    "data.Replace": _rule(P.DATA_WRITE, on=_ks),
    "data.Delete": _rule(P.DATA_WRITE, on=_ks),
    "data.MutateMany": _rule(P.DATA_WRITE, on=_ks),
    "data.Touch": _rule(P.DATA_WRITE, on=_ks),
    "data.GetAndTouch": _rule(P.DATA_WRITE, on=_ks),
    # scans and SQL (a statement's keyspaces and kind are checked where it is parsed)
    "scan.IndexScan": _rule(P.QUERY_SELECT, on=_ks),
    "scan.PageScan": _rule(P.QUERY_SELECT, on=_ks),
    "manager.StabilityRequest": _rule(P.QUERY_SELECT, P.DATA_READ, on=_ks),
    "sql.QueryRequest": _rule(P.QUERY_SELECT, P.QUERY_UPDATE, P.KEYSPACE_MANAGE),
    # DDL
    "manager.CreateKeyspace": _ddl(P.KEYSPACE_MANAGE, on=_name),
    "manager.DropKeyspace": _ddl(P.KEYSPACE_MANAGE, on=_name),
    "manager.SetKeyspaceReplicas": _ddl(P.KEYSPACE_MANAGE, on=_name),
    "manager.CreateIndex": _ddl(P.KEYSPACE_MANAGE, on=_ks),
    "manager.DropIndex": _ddl(P.KEYSPACE_MANAGE, on=_ks),
    "manager.BuildIndex": _ddl(P.KEYSPACE_MANAGE, on=_ks),
    # cluster operations
    "manager.StartRebalance": _ddl(P.CLUSTER_MANAGE),
    "manager.MovePartition": _ddl(P.CLUSTER_MANAGE),
    "manager.Failover": _ddl(P.CLUSTER_MANAGE),
    "manager.Recover": _ddl(P.CLUSTER_MANAGE),
    # users
    "manager.CreateUser": _ddl(P.USERS_MANAGE),
    "manager.DropUser": _ddl(P.USERS_MANAGE),
    "manager.GrantRoles": _ddl(P.USERS_MANAGE),
    "manager.RevokeRoles": _ddl(P.USERS_MANAGE),
    "manager.ListUsers": _rule(P.USERS_MANAGE),
}

# Node-only on purpose (a user sending one gets AUTH_FAILED): coordinator replication,
# membership, joins, migration, delivery, stabilise, replica feeds, the execution protocol
# between nodes, replies and stream frames (a node sends those, a user only receives them).
INTERNAL_MESSAGES: frozenset[str] = frozenset(
    """
    Ack AuthOk AuthResponse Challenge ErrorReply Heartbeat HeartbeatAck JoinReply
    JoinRequest MemberListPush MembersReply MetricsSample MetricsSampleRequest OpForward
    Pong StateGather StateGatherReply StateReplicate StateReplicateReply StateReply
    StatusReply UserHello UserProof UserSalt
    data.AbortIncoming data.ActivateIncoming data.CatchUp data.CatchUpReply
    data.CheckHistory data.CopyChunk data.CopyChunkReply data.CopyClose data.CopyOpen
    data.CopyOpened data.CopySeqnos data.CopySeqnosReply data.DocRecords
    data.DropKeyspaceData data.DropOutgoing data.FetchDocRecords data.FreezeOutgoing
    data.FreezeReply data.GetManyReply data.GetReply data.HighSeqnosReply
    data.HistoryChecked data.KeyspaceStatsReply data.LocalPartitions
    data.LocalPartitionsReply data.MigrateIn data.MigrateInReply data.MigrationCommand
    data.MigrationOutcome data.MutateManyReply data.MutationReply data.OpenPartitions
    data.PromoteReplica data.Promoted data.ReadChanges data.ReadChangesReply
    data.ReadRangesReply data.ReleaseOutgoing data.ReplicaApplied data.ReplicaApply
    data.ResolveOutgoing data.StreamBatch data.StreamEnd data.StreamOpened
    index.AbortIncomingSlice index.AllocateSlices index.CopySliceIn
    index.DeliverAndStabilise index.DeliverKeyVersions index.Delivered index.DropSlices
    index.IncomingSliceReady index.IndexPartitionSwitched index.LoadBegin
    index.LoadBegun index.LoadChunk index.LoadChunkAck index.LoadFinish index.LoadFinished
    index.PrepareIncomingSlice
    index.PublishStability index.ReadSlice index.ReadSliceCopy index.RollbackSlices
    index.SliceCopied index.SliceCopyChunk index.SliceEntries index.SliceList
    index.SliceMoveDone index.SlicesAllocated index.SlicesDropped index.SlicesRolledBack
    index.StabiliseSlices index.Stabilised index.StabilityPublished
    manager.AdvanceStability manager.DropIndexCopies manager.FailedOver
    manager.IndexBuildProgress manager.IndexCopiesDropped manager.IndexCreated
    manager.IndexDropped manager.IndexUpdated manager.IndexesBuilding
    manager.KeyspaceCreated manager.KeyspaceDropped manager.KeyspaceList
    manager.KeyspaceReplicasSet manager.MarkIndexActive manager.MarkIndexError
    manager.RebalanceReply manager.RecordIndexItems manager.Recovered manager.StabilityAdvanced
    manager.StabilityReply manager.UserInfo manager.UserList
    scan.IndexScanStarted scan.LeaseSnapshots scan.PageScanReply scan.ScanBlock
    scan.ScanEnd scan.ScanSlices scan.ShardBatch scan.ShardBatchResult scan.SlicesOpened
    scan.SnapshotsLeased scan.StabilityAt scan.WaitStability
    sql.ExchangeStats sql.ExchangeStatsReply sql.QueryBatch sql.QueryCancel
    sql.LeafCancel sql.LeafRequest sql.LeafRows sql.QueryCheck sql.QueryCheckResponse
    sql.QueryExecute sql.QueryFlowControl sql.QueryStarted
    """.split()  # noqa: SIM905 (one word per tag reads better than a list literal)
)


def rule_of(msg: Message) -> Rule | None:
    """The table's line for ``msg``; None: node-only."""
    return USER_MESSAGES.get(message_type_name(msg))


def authorize(principal: Principal, msg: Message) -> None:
    """The node's ``Authorizer``: returns when ``principal`` may send ``msg``, else raises
    ``AuthFailed`` naming the message type and the missing privilege."""
    if principal.is_node:
        return
    rule = rule_of(msg)
    name = message_type_name(msg)
    if rule is None:
        raise AuthFailed(
            f"{name} is an internal message: users may not send it",
            details={"user": principal.name, "type": name, "privilege": "node"},
        )
    require(principal, rule.privileges, rule.keyspace(msg), name)

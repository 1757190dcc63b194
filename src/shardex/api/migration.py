"""Messages of partition migration (``docs/decisions/0030-partition-migration-protocol.md``).

Three conversations:

* master -> target (``MigrateIn``, ``CatchUp``, ``ActivateIncoming``, ``AbortIncoming``) and
  master -> source (``FreezeOutgoing``, ``ReleaseOutgoing``, ``ResolveOutgoing``,
  ``DropOutgoing``): each carries the migration id and the master's term (``epoch``); a data
  node refuses commands from a term older than one it has already obeyed.
* target -> source: the copy is *pulled* by the target in bounded chunks (``CopyOpen`` /
  ``CopyChunk`` / ``CopyClose``: request/response, so flow control is the target's own pace
  and no frame holds more than ``MAX_CHUNK_BYTES``), then the catch-up reads change records
  (``ReadChanges``) after the target's high seqno on the partition's uuid (ROLLBACK if the
  history does not match, exactly as a stream consumer).
* admin: ``LocalPartitions`` lists what a node holds, in any state (operators, tests).
"""

from __future__ import annotations

import msgspec

from shardex.api.data import ChangeTuple
from shardex.api.records import FailoverEntry, PartitionInfo
from shardex.net.messages import Message

MAX_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024


class _Command(Message, tag="data.MigrationCommand"):
    """Fields every master -> data node migration command carries."""

    migration_id: str
    epoch: int
    keyspace: str
    partition: int


class IncomingMarker(msgspec.Struct, frozen=True, kw_only=True):
    """A migration into this node that has started and not been activated or aborted.

    ``(epoch, record_cas)`` is the manager state version (master term, cas) that recorded the
    migration as moving: every state at or above it descends from that commit, while an older
    one (a lagging replica, or a deposed master's never-committed state) may not know of the
    migration, so reconcile ignores it for this partition. ``base_seq`` is the topology
    ``seq_num`` the move was planned on: a later topology naming this node as owner means the
    hand-over was published."""

    migration_id: str
    keyspace: str
    partition: int
    source: str
    base_seq: int
    record_cas: int
    epoch: int = 0


# --- master -> target ----------------------------------------------------------------------


class MigrateIn(_Command, tag="data.MigrateIn"):
    """Prepare (incoming marker), pull the copy from ``source_address``, install it pending,
    catch up until the lag is at most ``lag_target`` seqnos; reply with what was copied."""

    keyspace_uuid: str
    created_cas: int
    num_partitions: int
    source: str
    source_address: str
    base_seq: int
    record_cas: int
    rate_limit: int = 0  # bytes/s of copy, 0 = unlimited
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    lag_target: int = 64


class MigrateInReply(Message, tag="data.MigrateInReply"):
    high_seqno: int
    uuid: int
    bytes: int
    items: int
    docs: int
    copy_seconds: float
    catchup_rounds: int


class CatchUp(_Command, tag="data.CatchUp"):
    """Apply the source's changes up to exactly ``until`` (the frozen high seqno)."""

    until: int
    source_address: str


class CatchUpReply(Message, tag="data.CatchUpReply"):
    high_seqno: int
    applied: int


class ActivateIncoming(_Command, tag="data.ActivateIncoming"):
    high_seqno: int  # the copy must be exactly here


class AbortIncoming(_Command, tag="data.AbortIncoming"):
    """Stop a copy in progress and drop the partial copy (only this migration's)."""


# --- master -> source ----------------------------------------------------------------------


class FreezeOutgoing(_Command, tag="data.FreezeOutgoing"):
    """Refuse writes (retryable NOT_MY_PARTITION) for at most ``lease`` seconds; reply with
    the frozen high seqno. The lease ends a freeze whose master died."""

    lease: float


class FreezeReply(Message, tag="data.FreezeReply"):
    high_seqno: int
    uuid: int


class ReleaseOutgoing(_Command, tag="data.ReleaseOutgoing"):
    """The point of no return: release (persisted) iff still frozen by this migration and
    still at ``high_seqno``."""

    high_seqno: int


class ResolveOutgoing(_Command, tag="data.ResolveOutgoing"):
    """ "What happened to this migration here?" If the partition is still active here the
    migration is fenced off (unfrozen, and a later freeze or release with this id is
    refused) and the answer is ``active``: abort. ``released``: roll forward."""


class DropOutgoing(_Command, tag="data.DropOutgoing"):
    """The new topology ``topology_seq`` is published: drop the released copy here."""

    topology_seq: int


class Outcome(Message, tag="data.MigrationOutcome"):
    """A partition's state on the answering node: active / pending / released / absent."""

    state: str
    high_seqno: int = 0


# --- target -> source ----------------------------------------------------------------------


class CopyOpen(Message, tag="data.CopyOpen"):
    migration_id: str
    keyspace: str
    partition: int


class CopyOpened(Message, tag="data.CopyOpened"):
    session: int
    info: PartitionInfo


class CopyChunk(Message, tag="data.CopyChunk"):
    session: int
    max_bytes: int = DEFAULT_CHUNK_BYTES


class CopyChunkReply(Message, tag="data.CopyChunkReply"):
    items: list[tuple[bytes, bytes]]
    done: bool


class CopyClose(Message, tag="data.CopyClose"):
    session: int


class ReadChanges(Message, tag="data.ReadChanges"):
    keyspace: str
    partition: int
    after: int
    uuid: int
    until: int | None = None
    max_items: int = 5000


class ReadChangesReply(Message, tag="data.ReadChangesReply"):
    changes: list[ChangeTuple]
    high_seqno: int  # the source's high seqno when read (may be above the last change sent)
    failover_log: list[FailoverEntry] = msgspec.field(default_factory=list)


# --- admin -----------------------------------------------------------------------------------


class LocalPartitions(Message, tag="data.LocalPartitions"):
    keyspace: str


class LocalPartitionsReply(Message, tag="data.LocalPartitionsReply"):
    partitions: list[PartitionInfo]
    incoming: list[IncomingMarker]
    topology_floor: int

"""Messages of replica copies and failover (``docs/decisions/0082-replicas-and-durability.md``).

Four conversations:

* active node -> replica node: ``ReplicaApply`` carries, per partition, the changes after the
  replica's last acknowledged seqno, read from the active's change log (the same seqnos, CAS
  values, uuid and failover log); the replica answers ``ReplicaApplied`` with what it now holds
  (in memory and fsynced) per partition, which is what durable writes on the active wait for.
  One request in flight per (keyspace, active, replica), so changes arrive in order.
* master -> any data node: ``CopySeqnos`` lists the node's copies of a keyspace, active or
  replica, with their high seqnos: how failover picks the replica to promote.
* replica node -> active node: ``FetchDocRecords`` reads the active's current records of
  the documents a diverged copy changed after its branch point, to roll it back in place
  (``data/replica_rollback.py``).
* master -> promoted node: ``PromoteReplica`` makes a replica copy the active one, on a new
  history branch (a new failover-log entry at its high seqno). Reconcile does the same when
  the message is lost; both are idempotent.
"""

from __future__ import annotations

import msgspec

from shardex.api.data import ChangeTuple
from shardex.api.records import FailoverEntry
from shardex.net.messages import Message


class ReplicaRun(msgspec.Struct, array_like=True, frozen=True):
    """The changes of one partition after seqno ``after`` on branch ``uuid``, in order."""

    partition: int
    uuid: int
    after: int
    changes: list[ChangeTuple]
    # the active's failover log, sent when it changed since the replica last answered
    failover_log: list[FailoverEntry] | None = None
    # the changes the copy needs are purged on the active: rebuild it from a snapshot
    rebuild: bool = False
    # per change, whether its document was live before it (known to the active for the
    # changes it sends from memory): the copy then reads no document to count its own
    live_before: list[bool] | None = None


class ReplicaApply(Message, tag="data.ReplicaApply"):
    keyspace: str
    keyspace_uuid: str
    source: str  # the active's node name
    seq_num: int  # the data topology the active serves by (a newer replica refuses older)
    runs: list[ReplicaRun]
    sync: bool = False  # fsync before answering (a persist_majority write waits on it)


class ReplicaAck(msgspec.Struct, array_like=True, frozen=True):
    """Where one replica copy stands: ``high`` applied, ``persisted`` fsynced, on ``uuid``.
    ``state`` is the copy's state here, or "absent" (none yet), "building" (from a
    snapshot), "diverged", "behind" (see ``data/replica.py``)."""

    partition: int
    high: int
    persisted: int
    uuid: int
    state: str


class ReplicaApplied(Message, tag="data.ReplicaApplied"):
    acks: list[ReplicaAck]


class CopySeqnos(Message, tag="data.CopySeqnos"):
    keyspace: str
    partitions: list[int] | None = None  # None: every copy held


class CopySeqno(msgspec.Struct, array_like=True, frozen=True):
    partition: int
    high_seqno: int
    uuid: int
    state: str


class CopySeqnosReply(Message, tag="data.CopySeqnosReply"):
    node: str
    copies: list[CopySeqno]


class PromoteReplica(Message, tag="data.PromoteReplica"):
    keyspace: str
    partition: int
    epoch: int  # the master term that committed the topology naming this node active
    seq_num: int


class Promoted(Message, tag="data.Promoted"):
    high_seqno: int
    uuid: int  # the new branch's


class FetchDocRecords(Message, tag="data.FetchDocRecords"):
    keyspace: str
    partition: int
    docids: list[str]


class DocRecords(Message, tag="data.DocRecords"):
    records: list[bytes | None]  # the encoded document records, in ``docids`` order

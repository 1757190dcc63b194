"""Plain types of the change source, shared by the driver and the workers.

No pyspark import: workers unpickle these from every InputPartition, and the planning and
reading code is tested without a SparkSession.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardex.errors import ErrorCode, ShardexError

if TYPE_CHECKING:
    from shardex.client import Client

SCHEMA_DDL = (
    "docid string, partition int, seqno long, uuid long, cas long, deleted boolean, body binary"
)
# Must equal pyspark's to_arrow_schema(StructType.fromDDL(SCHEMA_DDL)) field for field
# (Spark validates a returned RecordBatch's schema exactly); a test checks it.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("docid", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("seqno", pa.int64()),
        pa.field("uuid", pa.int64()),
        pa.field("cas", pa.int64()),
        pa.field("deleted", pa.bool_()),
        pa.field("body", pa.binary()),
    ]
)

_ROLLBACK_TAG = "shardex-rollback"
_ROLLBACK_RE = re.compile(r"\[" + _ROLLBACK_TAG + r" (\{.*?\})\]")


@dataclass(frozen=True, slots=True)
class NodeAccess:
    """Everything a process needs to connect to the data nodes, as one picklable value.

    Resolved on the driver (from a cluster directory or the source's options) and pickled
    into every read task: an executor on another host has no cluster directory, so this
    holds values, never paths of the driver's files: the node secret and the cluster CA's
    certificate (PEM text) travel inside it. The secret never appears in a repr (plans and
    logs print partitions)."""

    addresses: tuple[str, ...]
    secret: str = field(repr=False)
    request_timeout: float = 10.0
    # The cluster CA's certificate, PEM: connect over TLS and verify each node against it.
    tls_ca_pem: str | None = field(default=None, repr=False)

    def connect(self, name: str) -> Client:
        from shardex.client import connect
        from shardex.net.tls import TlsConfig

        return connect(
            list(self.addresses),
            secret=self.secret,
            name=name,
            request_timeout=self.request_timeout,
            tls=None if self.tls_ca_pem is None else TlsConfig(ca_pem=self.tls_ca_pem),
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a task reads: the nodes (``access``) and the keyspace. Travels pickled inside
    every InputPartition."""

    access: NodeAccess
    keyspace: str


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Records (start_seqno, end_seqno] of one partition. ``start_uuid`` is the branch the
    consumer's start belongs to (0 with start 0: nothing to check); ``end_uuid`` the branch
    the end was observed on (the records read must be on it)."""

    partition: int
    start_seqno: int
    start_uuid: int
    end_seqno: int
    end_uuid: int

    @property
    def count(self) -> int:
        return self.end_seqno - self.start_seqno

    def __reduce__(self) -> tuple[type[PartitionRange], tuple[int, int, int, int, int]]:
        # Pickled in every InputPartition Spark plans (per micro-batch, in the streaming
        # runner): as a plain tuple of fields this is 3.5x cheaper than the slots
        # dataclass's default (copyreg, __getstate__ per object).
        return (
            PartitionRange,
            (self.partition, self.start_seqno, self.start_uuid, self.end_seqno, self.end_uuid),
        )


@dataclass(frozen=True, slots=True)
class RollbackInfo:
    keyspace: str
    partition: int
    rollback_seqno: int


def rollback_error(
    keyspace: str, partition: int, rollback_seqno: int, message: str, **details: Any
) -> ShardexError:
    """A ROLLBACK error whose text carries a parseable tag (see ``parse_rollback``)."""
    tag = json.dumps(
        {"keyspace": keyspace, "partition": partition, "rollback_seqno": rollback_seqno},
        sort_keys=True,
    )
    return ShardexError(
        f"{message} [{_ROLLBACK_TAG} {tag}]",
        code=ErrorCode.ROLLBACK,
        details={
            **details,
            "keyspace": keyspace,
            "partition": partition,
            "rollback_seqno": rollback_seqno,
        },
    )


def parse_rollback(error: BaseException | str) -> RollbackInfo | None:
    """The rollback a (possibly Spark-wrapped) error reports, or None. Spark turns a
    worker's exception into a Java exception whose message holds the Python traceback, so
    the pipeline driver finds the partition and rollback seqno here, not in attributes."""
    if isinstance(error, ShardexError) and error.code is ErrorCode.ROLLBACK:
        d = error.details
        if "partition" in d and "rollback_seqno" in d:
            return RollbackInfo(str(d.get("keyspace", "")), d["partition"], d["rollback_seqno"])
    m = _ROLLBACK_RE.search(str(error))
    if m is None:
        return None
    data = json.loads(m.group(1))
    return RollbackInfo(data["keyspace"], int(data["partition"]), int(data["rollback_seqno"]))

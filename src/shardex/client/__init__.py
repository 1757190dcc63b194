"""The shardex Python client (synchronous API).

    from shardex.client import connect_local
    with connect_local("/tmp/mycluster") as client:
        client.create_keyspace("users", num_partitions=64)
        users = client.keyspace("users")
        r = users.insert("u1", {"name": "Ada"})       # r.partition, r.seqno, r.uuid, r.cas
        users.get("u1")                                 # {"name": "Ada"}
        users.upsert_many((f"u{i}", {"n": i}) for i in range(10_000))
        client.high_seqnos("users")                     # Timestamp: partition -> (seqno, uuid)
        client.rebalance()                              # after adding a node: RebalanceResult

Every error raised is a ``shardex.errors.ShardexError`` subclass with a ``.code``.
"""

from shardex.api.records import Change, MutationResult, SnapshotMarker
from shardex.client.bulk import BulkWriteError
from shardex.client.client import Client, connect, connect_local
from shardex.client.keyspace import Keyspace, VersionedDocument
from shardex.client.rebalance import RebalanceError
from shardex.client.streams import ChangeStream
from shardex.client.types import (
    ClusterStatus,
    KeyspaceDescription,
    KeyspaceStatsResult,
    MemberStatus,
    MoveResult,
    NodeStatus,
    PartitionStats,
    RebalanceResult,
)

__all__ = [
    "BulkWriteError",
    "Change",
    "ChangeStream",
    "Client",
    "ClusterStatus",
    "Keyspace",
    "KeyspaceDescription",
    "KeyspaceStatsResult",
    "MemberStatus",
    "MoveResult",
    "MutationResult",
    "NodeStatus",
    "PartitionStats",
    "RebalanceError",
    "RebalanceResult",
    "SnapshotMarker",
    "VersionedDocument",
    "connect",
    "connect_local",
]

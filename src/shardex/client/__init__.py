"""The shardex Python client (synchronous API).

    from shardex.client import connect_local
    with connect_local("/tmp/mycluster") as client:
        print(client.ping())
        print(client.cluster_status().up)

Every error raised is a ``shardex.errors.ShardexError`` subclass with a ``.code``.
"""

from shardex.client.sync import Client, connect, connect_local
from shardex.client.types import ClusterStatus, MemberStatus, NodeStatus

__all__ = ["Client", "ClusterStatus", "MemberStatus", "NodeStatus", "connect", "connect_local"]

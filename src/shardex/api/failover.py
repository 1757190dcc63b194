"""Failover and recovery as coordinator ops (client -> any manager node -> the master).

``Failover`` takes a data node out of service: for every partition it held active, the replica
with the highest seqno becomes active; the node is recorded in ``StateContext.failed_over`` and
serves nothing until ``Recover`` takes it back (``docs/decisions/0082-replicas-and-durability.md``;
the op is ``manager/failover.py``).
"""

from __future__ import annotations

import msgspec

from shardex.net.messages import Message

RECOVERY_KINDS: tuple[str, ...] = ("delta", "full")

# ``details["reason"]`` of a refused failover: the automatic failover tells them apart.
REASON_DATA_LOSS = "data_loss"  # some partition has no reachable replica to promote
REASON_REBALANCE = "rebalance_running"  # a rebalance or an unsettled move is in the way


class Failover(Message, tag="manager.Failover"):
    """Fail ``node`` over. ``allow_data_loss``: partitions without a reachable replica stay
    assigned to the failed node (unavailable, listed in ``lost``) instead of refusing."""

    node: str
    request_id: str = ""
    allow_data_loss: bool = False


class FailedOver(Message, tag="manager.FailedOver"):
    node: str
    # keyspace -> partition -> the node whose replica became the active copy
    promoted: dict[str, dict[int, str]] = msgspec.field(default_factory=dict)
    # keyspace -> partitions left on the failed node (no replica to promote)
    lost: dict[str, list[int]] = msgspec.field(default_factory=dict)
    cas: int = 0  # the commit that failed the node over (``StateContext.failed_over[node]``)
    # promoted node -> why it was not told (it promotes itself when it reconciles); not kept
    # in the reply a retried request id gets
    pending: dict[str, str] = msgspec.field(default_factory=dict)


class Recover(Message, tag="manager.Recover"):
    """Take a failed-over ``node`` back as a normal member (a rebalance can use it again).
    ``kind``: "delta" (the node keeps its copies and rolls them back to the branch points)
    or "full" (it drops them)."""

    node: str
    kind: str = "delta"
    request_id: str = ""


class Recovered(Message, tag="manager.Recovered"):
    node: str
    kind: str
    cas: int

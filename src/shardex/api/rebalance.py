"""Rebalance messages: start one, move one partition, and the rebalance's state as a reply."""

from __future__ import annotations

import msgspec

from shardex.meta.rebalance_state import RebalanceRecord
from shardex.net.messages import Message


class StartRebalance(Message, tag="manager.StartRebalance"):
    request_id: str = ""
    max_parallel: int = 2
    rate_limit: int = 0  # bytes/s per copy, 0 = unlimited
    # nodes to remove from the cluster: every copy they hold moves to the other data nodes
    # first (``manager/eject.py``); empty: an ordinary rebalance
    eject: list[str] = msgspec.field(default_factory=list)


class MovePartition(Message, tag="manager.MovePartition"):
    keyspace: str
    partition: int
    target: str
    request_id: str = ""
    rate_limit: int = 0


class GetRebalance(Message, tag="manager.GetRebalance"):
    """The current or last rebalance, with the live phase of each running move."""


class RebalanceReply(Message, tag="manager.RebalanceReply"):
    record: RebalanceRecord | None = None
    phases: dict[str, str] = msgspec.field(default_factory=dict)  # migration id -> phase
    attached: bool = False  # a rebalance was already running: this is that one

"""Node-level messages: the authenticated status probe every node answers."""

from __future__ import annotations

import msgspec

from shardex.net.messages import Message


class StatusRequest(Message):
    """Authenticated "are you alive, and who are you?"."""


class StatusReply(Message):
    name: str
    member_id: str
    address: str
    services: tuple[str, ...]
    pid: int
    started_at: float  # wall clock, seconds since the epoch
    uptime: float  # seconds, loop clock
    shardex_version: str
    membership_version: int
    joined: bool
    http_port: int | None = None


class MetricsSampleRequest(Message):
    """Node -> node: "your numbers for the console's charts, now" (node-only: a user reads a
    node's numbers through its HTTP port, as cluster.manage)."""


class MetricsSample(Message):
    """One node's chart numbers at one moment, read from the same collector as its
    ``/metrics`` (so they match a scrape): counters since the node started and gauges."""

    node: str
    kv_ops: float  # KV operations answered (shardex_kv_ops_total, all kinds)
    sql_statements: float  # statements initiated (shardex_sql_statements_total)
    scan_seconds: float  # scans' time to first reply, summed (..._open_duration_seconds_sum)
    scans: float  # scans timed (..._open_duration_seconds_count)
    # "keyspace.index" -> seqnos its stability TS is behind this node's active partitions
    freshness: dict[str, float] = msgspec.field(default_factory=dict)

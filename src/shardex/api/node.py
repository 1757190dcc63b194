"""Node-level messages: the authenticated status probe every node answers."""

from __future__ import annotations

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

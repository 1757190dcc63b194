"""Membership messages: join, the member list's push, heartbeats and the members query."""

from __future__ import annotations

from shardex.meta.member_list import MemberInfo, MemberView
from shardex.net.messages import Message


class JoinRequest(Message):
    member: MemberInfo


class JoinReply(Message):
    version: int
    digest: str
    members: list[MemberInfo]


class MemberListPush(Message):
    """A manager's member list after a change; answered with ``Ack``."""

    version: int
    digest: str
    members: list[MemberInfo]


class Heartbeat(Message):
    """Member -> manager. ``members`` rides along only when the sender's digest differs from
    the one the manager reported last time, so steady-state heartbeats stay tiny."""

    member_id: str
    name: str
    version: int
    digest: str
    members: list[MemberInfo] | None = None


class HeartbeatAck(Message):
    member_id: str
    name: str
    version: int
    digest: str
    members: list[MemberInfo] | None = None


class MembersRequest(Message):
    """Ask any node for its membership view."""


class MembersReply(Message):
    observer: str
    observer_id: str
    observer_is_manager: bool
    version: int
    digest: str
    heartbeat_interval: float
    failure_timeout: float
    members: list[MemberView]

"""User management from the client (``Client.create_user`` and friends): each call is one
coordinator op, retried on another node under the same request id. A new user's keys are
derived here, from the password typed on this machine: only the keys travel."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from shardex.api.privileges import parse_roles
from shardex.api.users import (
    CreateUser,
    DropUser,
    GrantRoles,
    ListUsers,
    RevokeRoles,
    UserInfo,
    UserList,
    check_user_name,
)
from shardex.meta.users import new_record

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession


def _rid() -> str:
    return uuid.uuid4().hex


def create_user(rpc: RpcSession, name: str, password: str, roles: list[str]) -> UserInfo:
    record = new_record(check_user_name(name), password, parse_roles(roles))
    return rpc.call(CreateUser(user=record, request_id=_rid()), UserInfo, idempotent=True)


def drop_user(rpc: RpcSession, name: str) -> UserInfo:
    return rpc.call(DropUser(name=name, request_id=_rid()), UserInfo, idempotent=True)


def grant_roles(rpc: RpcSession, name: str, roles: list[str]) -> UserInfo:
    msg = GrantRoles(name=name, roles=list(parse_roles(roles)), request_id=_rid())
    return rpc.call(msg, UserInfo, idempotent=True)


def revoke_roles(rpc: RpcSession, name: str, roles: list[str]) -> UserInfo:
    msg = RevokeRoles(name=name, roles=list(parse_roles(roles)), request_id=_rid())
    return rpc.call(msg, UserInfo, idempotent=True)


def list_users(rpc: RpcSession) -> list[UserInfo]:
    return rpc.call(ListUsers(), UserList).users

"""Users as coordinator ops: create, drop, grant, revoke and list, each a commit of
``StateContext.users`` on the master, replicated to every manager like any DDL; and the
bootstrap admin, committed by a master whose state holds no user yet.

Keeping users in the replicated state lets every manager node check a login against its own
copy, with no round trip to the master (docs/decisions/0091-users-roles-and-privileges.md).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from shardex.api.errors import BadRequest
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
from shardex.meta.users import UserRecord

log = logging.getLogger(__name__)


def _info(rec: UserRecord) -> UserInfo:
    return UserInfo(name=rec.name, roles=list(rec.roles))


def _existing(ctx: Any, name: str) -> UserRecord:
    rec = ctx.state.users.get(name)
    if rec is None:
        raise BadRequest(
            f"user {name!r} not found",
            details={"user": name, "hint": "shardex user list shows the users"},
        )
    return rec


async def _put(ctx: Any, rec: UserRecord) -> UserInfo:
    reply = _info(rec)
    users = {**ctx.state.users, rec.name: rec}
    await ctx.commit(msgspec.structs.replace(ctx.state, users=users), reply=reply)
    return reply


async def create_user(msg: CreateUser, ctx: Any) -> UserInfo:
    rec = msg.user
    check_user_name(rec.name)
    if rec.name in ctx.state.users:
        raise BadRequest(
            f"user {rec.name!r} already exists",
            details={"user": rec.name, "hint": "drop it first, or grant/revoke its roles"},
        )
    if len(rec.salt) < 8 or len(rec.stored_key) != 32 or len(rec.server_key) != 32:
        raise BadRequest(f"user {rec.name!r}: malformed keys", details={"user": rec.name})
    return await _put(ctx, msgspec.structs.replace(rec, roles=list(parse_roles(rec.roles))))


async def drop_user(msg: DropUser, ctx: Any) -> UserInfo:
    rec = _existing(ctx, msg.name)
    users = {n: r for n, r in ctx.state.users.items() if n != msg.name}
    reply = _info(rec)
    await ctx.commit(msgspec.structs.replace(ctx.state, users=users), reply=reply)
    return reply


async def grant_roles(msg: GrantRoles, ctx: Any) -> UserInfo:
    rec = _existing(ctx, msg.name)
    roles = parse_roles([*rec.roles, *msg.roles])
    return await _put(ctx, msgspec.structs.replace(rec, roles=list(roles)))


async def revoke_roles(msg: RevokeRoles, ctx: Any) -> UserInfo:
    rec = _existing(ctx, msg.name)
    gone = set(parse_roles(msg.roles))
    return await _put(
        ctx, msgspec.structs.replace(rec, roles=[r for r in rec.roles if r not in gone])
    )


async def list_users(msg: ListUsers, ctx: Any) -> UserList:
    return UserList(users=[_info(r) for _, r in sorted(ctx.state.users.items())])


def register_user_ops(coordinator: Any, bootstrap_admin: UserRecord | None = None) -> None:
    """Install the user ops on a ``Coordinator``; with ``bootstrap_admin``, a master that
    finds no user in its state commits that one (the first admin of a new cluster)."""
    coordinator.register_op(CreateUser, create_user)
    coordinator.register_op(DropUser, drop_user)
    coordinator.register_op(GrantRoles, grant_roles)
    coordinator.register_op(RevokeRoles, revoke_roles)
    coordinator.register_op(ListUsers, list_users)
    if bootstrap_admin is None:
        return
    admin = bootstrap_admin

    async def bootstrap(ctx: Any) -> None:
        # Idempotent: only a state that never had a user gets it; dropping every user later
        # brings the bootstrap admin back on the next promotion, which is the way back in.
        if ctx.state.users:
            return
        users = {admin.name: admin}
        await ctx.commit(msgspec.structs.replace(ctx.state, users=users))
        log.info("bootstrap admin %r created", admin.name)

    coordinator.register_recovery(bootstrap)

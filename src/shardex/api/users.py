"""User management as coordinator ops (``shardex.manager.users``): create, drop, grant,
revoke, list. A create carries the user's SCRAM keys, derived where the password was typed:
the password itself never travels nor is stored."""

from __future__ import annotations

import re

from shardex.errors import ConfigError
from shardex.meta.users import UserRecord
from shardex.net.messages import Message

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")


def check_user_name(name: object) -> str:
    """``name`` if it is a valid user name (full match: no newline slips through)."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"invalid user name {name!r}",
            details={
                "value": name,
                "hint": "1-64 letters, digits, '_', '.', '@' or '-', not starting with . @ -",
            },
        )
    return name


class CreateUser(Message, tag="manager.CreateUser"):
    user: UserRecord
    request_id: str = ""


class DropUser(Message, tag="manager.DropUser"):
    name: str
    request_id: str = ""


class GrantRoles(Message, tag="manager.GrantRoles"):
    name: str
    roles: list[str]
    request_id: str = ""


class RevokeRoles(Message, tag="manager.RevokeRoles"):
    name: str
    roles: list[str]
    request_id: str = ""


class ListUsers(Message, tag="manager.ListUsers"):
    request_id: str = ""


class UserInfo(Message, tag="manager.UserInfo"):
    """A user as others see it: name and roles, no keys."""

    name: str
    roles: list[str]


class UserList(Message, tag="manager.UserList"):
    users: list[UserInfo]

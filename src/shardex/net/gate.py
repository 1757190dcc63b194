"""The check a user's connection runs on every request and one-way message it receives,
before any handler: the user's roles read again from the directory (a grant, revoke or drop
applies to connections already open), then the server's ``Authorizer``
(docs/decisions/0090-node-and-user-identity.md)."""

from __future__ import annotations

import dataclasses
import logging

from shardex.errors import AuthFailed, ShardexError
from shardex.net.credentials import Authorizer, Principal, UserDirectory
from shardex.net.messages import Message, message_type_name

log = logging.getLogger("shardex.net.connection")


class UserGate:
    __slots__ = ("_authorizer", "_users")

    def __init__(self, authorizer: Authorizer, users: UserDirectory | None) -> None:
        self._authorizer = authorizer
        self._users = users

    def check(self, principal: Principal, msg: Message) -> Principal:
        """The principal as it stands now, if it may send ``msg``; else raises the refusal
        (a ``ShardexError``; a check that breaks refuses too: secure by default)."""
        try:
            principal = self._current(principal)
            self._authorizer(principal, msg)
        except ShardexError:
            raise
        except Exception:
            name = message_type_name(msg)
            log.exception("authorizer failed on %s", name)
            raise AuthFailed(f"{name} could not be authorized", details={"type": name}) from None
        return principal

    def _current(self, principal: Principal) -> Principal:
        if self._users is None:
            return principal
        cred = self._users.lookup_user(principal.name)
        if cred is None:
            raise AuthFailed(
                f"user {principal.name!r} no longer exists",
                details={"user": principal.name, "privilege": "login"},
            )
        if cred.roles != principal.roles:
            principal = dataclasses.replace(principal, roles=cred.roles)
        return principal

"""Users for tests that log in without a cluster state: a directory over fixed credentials,
and Argon2 parameters cheap enough for tests (the cost is the client's, and not what these
tests are about)."""

from __future__ import annotations

from shardex.net.credentials import Argon2Params, UserCredential

FAST = Argon2Params(time_cost=1, memory_cost=64, parallelism=1)


class Users:
    """A ``UserDirectory`` over fixed credentials."""

    def __init__(self, *creds: UserCredential) -> None:
        self.creds = {c.name: c for c in creds}

    def lookup_user(self, name: str) -> UserCredential | None:
        return self.creds.get(name)

    async def lookup_missing(self, name: str) -> UserCredential | None:
        return None  # fixed: nothing further to ask

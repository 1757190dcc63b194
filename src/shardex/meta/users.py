"""Users in the replicated cluster state: what a node keeps to check a login locally, and the
bootstrap admin a founding cluster starts with.

A ``UserRecord`` holds a user's name, roles and SCRAM keys (salt, Argon2id parameters,
StoredKey, ServerKey: ``shardex.net.credentials``), never a password. It lives in
``StateContext.users``, committed and replicated by the coordinator like every DDL change.

The bootstrap admin file (``admin_file`` in a node's config) is a JSON object with the same
fields, hex-encoded; a master whose state holds no user yet commits it
(``shardex.manager.users``). ``shardex cluster start`` writes it next to the admin's password.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import msgspec

from shardex.errors import ConfigError
from shardex.net.credentials import (
    SALT_BYTES,
    Argon2Params,
    UserCredential,
    make_credential,
)

ADMIN_USER = "admin"
ADMIN_ROLES = ("admin",)


class UserRecord(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    roles: list[str]
    salt: bytes
    time_cost: int
    memory_cost: int
    parallelism: int
    stored_key: bytes
    server_key: bytes

    def credential(self) -> UserCredential:
        return UserCredential(
            name=self.name,
            roles=tuple(self.roles),
            salt=self.salt,
            params=Argon2Params(self.time_cost, self.memory_cost, self.parallelism),
            stored_key=self.stored_key,
            server_key=self.server_key,
        )


def record_of(cred: UserCredential) -> UserRecord:
    return UserRecord(
        name=cred.name,
        roles=list(cred.roles),
        salt=cred.salt,
        time_cost=cred.params.time_cost,
        memory_cost=cred.params.memory_cost,
        parallelism=cred.params.parallelism,
        stored_key=cred.stored_key,
        server_key=cred.server_key,
    )


def new_record(
    name: str, password: str, roles: tuple[str, ...], params: Argon2Params | None = None
) -> UserRecord:
    """A user's record for ``password`` under a fresh random salt (derived where the password
    is typed: only the keys travel)."""
    return record_of(
        make_credential(name, password, roles, salt=secrets.token_bytes(SALT_BYTES), params=params)
    )


_HEX_FIELDS = ("salt", "stored_key", "server_key")


def write_admin_file(path: Path, record: UserRecord) -> None:
    """The bootstrap admin, mode 0600 (its keys let a reader impersonate the cluster to the
    admin)."""
    doc = msgspec.structs.asdict(record)
    for f in _HEX_FIELDS:
        doc[f] = doc[f].hex()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def read_admin_file(path: Path) -> UserRecord:
    """The bootstrap admin record in ``path``; a missing or malformed file is a
    ``ConfigError`` naming it."""
    hint = "give the admin.json that shardex cluster start wrote, or leave admin_file out"
    try:
        doc = json.loads(path.read_text())
        for f in _HEX_FIELDS:
            doc[f] = bytes.fromhex(doc[f])
        return msgspec.convert(doc, UserRecord)
    except OSError as e:
        raise ConfigError(
            f"cannot read the admin file {path}: {e.strerror}",
            details={"key": "admin_file", "value": str(path), "hint": hint},
        ) from None
    except (ValueError, KeyError, TypeError, msgspec.ValidationError) as e:
        raise ConfigError(
            f"the admin file {path} is not a user record: {e}",
            details={"key": "admin_file", "value": str(path), "hint": hint},
        ) from None

"""What a node keeps in its data dir: identity, last member list, pid and the instance lock.

Layout of ``<data-dir>``::

    node.json      identity: {"format", "name", "member_id", "created_at"}; written once
    members.json   last known member list: {"format", "version", "saved_at", "members"}
    node.pid       pid of the running process (removed on clean stop)
    node.lock      flock'ed for the process lifetime; the kernel drops it at kill -9,
                   so "is a node running on this dir" never trusts a stale pid file
    node.log       the node's log

Every JSON file is written atomically (temp file, fsync, rename, fsync of the directory): a
crash leaves the old or the new version, never a torn one.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import msgspec

from shardex.errors import ConfigError, StorageError
from shardex.meta.member_list import MemberInfo
from shardex.runtime.files import atomic_write_json

IDENTITY_FILE = "node.json"
MEMBERS_FILE = "members.json"
LOG_FILE = "node.log"
FORMAT = 1


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StorageError(
            f"cannot read {path}: {e}",
            details={"path": str(path), "hint": "restore or remove the file"},
        ) from e


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class NodeIdentity(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    member_id: str
    created_at: str


def load_or_create_identity(data_dir: Path, name: str) -> tuple[NodeIdentity, bool]:
    """The persisted identity, or a new one (uuid4) on first start. Returns (identity, new).

    A data dir belongs to one node name for ever: starting it under another name is a
    misconfiguration (two nodes pointed at one dir), so it is refused rather than renamed."""
    path = data_dir / IDENTITY_FILE
    raw = _read_json(path)
    if raw is not None:
        try:
            ident = msgspec.convert(
                {k: raw[k] for k in ("name", "member_id", "created_at")}, NodeIdentity
            )
        except (KeyError, TypeError, msgspec.ValidationError) as e:
            raise StorageError(
                f"{path} is not a valid node identity: {e}", details={"path": str(path)}
            ) from e
        if ident.name != name:
            raise ConfigError(
                f"data dir {data_dir} belongs to node {ident.name!r}, not {name!r}",
                details={
                    "key": "name",
                    "value": name,
                    "hint": f"use --name {ident.name} or another --data-dir",
                },
            )
        return ident, False
    ident = NodeIdentity(name=name, member_id=str(uuid.uuid4()), created_at=_now_iso())
    atomic_write_json(path, {"format": FORMAT, **msgspec.to_builtins(ident)})
    return ident, True


class FileMemberStore:
    """``MemberStore`` over ``<data-dir>/members.json``."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / MEMBERS_FILE

    def load(self) -> list[MemberInfo] | None:
        raw = _read_json(self.path)
        if raw is None:
            return None
        try:
            return msgspec.convert(raw["members"], list[MemberInfo])
        except (KeyError, TypeError, msgspec.ValidationError) as e:
            raise StorageError(
                f"{self.path} is not a valid member list: {e}",
                details={"path": str(self.path), "hint": "remove it; the node re-learns it"},
            ) from e

    def save(self, members: list[MemberInfo]) -> None:
        atomic_write_json(
            self.path,
            {
                "format": FORMAT,
                "version": sum(m.incarnation for m in members),
                "saved_at": _now_iso(),
                "members": msgspec.to_builtins(members),
            },
        )

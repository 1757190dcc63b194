"""The node's audit log: one JSON object per line in ``<data-dir>/audit.log`` - user logins,
failed logins, and every DDL or user change a user sent (allowed or refused).

Written from the event loop, one short line at a time, flushed at once (no fsync: the log
is for operators, not for recovery). Nodes' own messages are not audited: they are the
cluster's work, not a person's.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

from shardex.api.privileges import authorize, rule_of
from shardex.errors import ShardexError
from shardex.net.credentials import Principal
from shardex.net.messages import Message, message_type_name

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.log"
# Fields of an audited message worth a line: what it names, never keys or documents.
_FIELDS = ("name", "keyspace", "names", "roles", "node", "target", "partition", "kind")


class AuditLog:
    """Appends audit events to ``path`` (None: events are only counted, for simulations)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None  # opened on the first event

    def write(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str)
        try:
            if self._file is None:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._file = os.fdopen(fd, "a", encoding="utf-8")
            self._file.write(line + "\n")
            self._file.flush()
        except OSError:
            log.exception("cannot write the audit log %s", self.path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- what the RPC server calls --

    def on_login(self, peer: str, name: str, principal: Principal | None) -> None:
        self.write("login" if principal is not None else "login_failed", user=name, peer=peer)

    def authorize(self, principal: Principal, msg: Message) -> None:
        """``shardex.api.privileges.authorize``, auditing the DDL and user changes."""
        rule = rule_of(msg)
        if rule is None or not rule.audited:
            authorize(principal, msg)
            return
        what = {f: getattr(msg, f) for f in _FIELDS if hasattr(msg, f)}
        if hasattr(msg, "user"):  # CreateUser: the record's name and roles, not its keys
            what.update(name=msg.user.name, roles=list(msg.user.roles))  # type: ignore[attr-defined]
        try:
            authorize(principal, msg)
        except ShardexError as e:
            self.write(
                "denied",
                user=principal.name,
                type=message_type_name(msg),
                privilege=e.details.get("privilege"),
                **what,
            )
            raise
        self.write("ddl", user=principal.name, type=message_type_name(msg), **what)

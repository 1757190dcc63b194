"""The operators' actions of the cluster REST as the coordinator messages they stand for: a
JSON body checked into the very message the Python client sends (index create, build and
drop; rebalance start; failover and recovery of a node), by the client's own checks
(``create_index_message``, ``check_*``), each with a fresh request id (a retried HTTP
request is a new request). Nothing here talks to the cluster: ``cluster_rest.py``
authorises the message as the RPC request and submits it.

A refused body is a ``RestError`` (400 ``bad_json`` / ``bad_request``) naming the field and
what it takes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from shardex.api.failover import RECOVERY_KINDS, Failover, Recover
from shardex.api.index_ddl import BuildIndex, CreateIndex, DropIndex, check_index_name
from shardex.api.keyspaces import check_keyspace_name
from shardex.api.rebalance import StartRebalance
from shardex.client.indexes import create_index_args, create_index_message
from shardex.errors import ShardexError
from shardex.meta.index_state import PRIMARY_NAME
from shardex.sql.ddl import CreateIndexStmt, parse_ddl

__all__ = [
    "RestError",
    "build_index",
    "create_index",
    "drop_index",
    "failover",
    "json_object",
    "recover",
    "start_rebalance",
]

# POST /api/indexes without a statement: these fields, as ``Client.create_index`` takes them
INDEX_FIELDS = (
    "keyspace",
    "name",
    "keys",
    "where",
    "partition_by",
    "num_partition",
    "defer_build",
    "nodes",
    "primary",
    "num_replica",
)


class RestError(Exception):
    """An answer other than 2xx: HTTP status, a short code and a message."""

    def __init__(self, status: int, code: str, msg: str) -> None:
        super().__init__(msg)
        self.status, self.code, self.msg = status, code, msg

    def body(self) -> bytes:
        return json.dumps({"errors": [{"code": self.code, "msg": self.msg}]}).encode()


def json_object(raw: bytes, known: tuple[str, ...], *, empty_ok: bool = False) -> dict[str, Any]:
    """The request body as a JSON object with only ``known`` fields (``empty_ok``: no body
    is ``{}``)."""
    if empty_ok and not raw.strip():
        return {}
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise RestError(400, "bad_json", f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise RestError(400, "bad_request", f"the body must be a JSON object with {known}")
    unknown = sorted(set(body) - set(known))
    if unknown:
        msg = f"unknown field(s) {unknown}; known: {', '.join(known)}"
        raise RestError(400, "bad_request", msg)
    return body


def create_index(raw: bytes) -> CreateIndex:
    """``{"statement": "CREATE INDEX ..."}`` or the fields of ``Client.create_index``
    (``{"keyspace": ..., "name": ..., "keys": ["age", "name DESC"], "defer_build": true}``)."""
    body = json_object(raw, ("statement", *INDEX_FIELDS))
    try:
        if "statement" in body:
            if len(body) > 1:
                raise RestError(400, "bad_request", "give a statement or the fields, not both")
            text = body["statement"]
            if not isinstance(text, str):
                raise RestError(400, "bad_request", f"statement must be text, got {text!r}")
            stmt = parse_ddl(text)
            if not isinstance(stmt, CreateIndexStmt):
                raise RestError(
                    400,
                    "bad_request",
                    "POST /api/indexes takes CREATE [PRIMARY] INDEX; build with POST "
                    "/api/indexes/KEYSPACE/NAME/build, drop with DELETE /api/indexes/KEYSPACE/NAME",
                )
            return create_index_message(**create_index_args(stmt))
        fields = dict(body)
        for key in ("keys", "partition_by", "nodes"):
            value = fields.get(key)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                raise RestError(
                    400, "bad_request", f"{key} must be a list of strings, got {value!r}"
                )
        if not isinstance(fields.get("defer_build", False), bool):
            raise RestError(400, "bad_request", "defer_build must be true or false")
        if not isinstance(fields.get("primary", False), bool):
            raise RestError(400, "bad_request", "primary must be true or false")
        keyspace = check_keyspace_name(fields.pop("keyspace", None))
        return create_index_message(keyspace, fields.pop("name", None), **fields)
    except ShardexError as e:
        raise RestError(400, e.code.value.lower(), str(e)) from None


def build_index(keyspace: str, name: str) -> BuildIndex:
    _names(keyspace, name)
    return BuildIndex(keyspace=keyspace, names=[name], request_id=uuid.uuid4().hex)


def drop_index(keyspace: str, name: str) -> DropIndex:
    """``#primary`` (``%23primary`` in the URL) names the keyspace's primary index."""
    _names(keyspace, name)
    primary = name == PRIMARY_NAME
    return DropIndex(
        keyspace=keyspace,
        name=None if primary else name,
        is_primary=primary,
        request_id=uuid.uuid4().hex,
    )


def start_rebalance(raw: bytes) -> StartRebalance:
    """``{"max_parallel": 2, "rate_limit": 0, "eject": ["node4"]}``, every field optional
    (no body: an ordinary rebalance with the client's defaults)."""
    body = json_object(raw, ("max_parallel", "rate_limit", "eject"), empty_ok=True)
    max_parallel = body.get("max_parallel", 2)
    rate_limit = body.get("rate_limit", 0)
    eject = body.get("eject", [])
    if not _is_int(max_parallel) or max_parallel < 1:
        raise RestError(
            400, "bad_request", f"max_parallel must be an integer >= 1, got {max_parallel!r}"
        )
    if not _is_int(rate_limit) or rate_limit < 0:
        raise RestError(
            400,
            "bad_request",
            f"rate_limit must be bytes/s >= 0 (0: unlimited), got {rate_limit!r}",
        )
    if not isinstance(eject, list) or not all(isinstance(n, str) and n.strip() for n in eject):
        raise RestError(
            400, "bad_request", f'eject takes node names, e.g. ["node3"], got {eject!r}'
        )
    return StartRebalance(
        request_id=uuid.uuid4().hex, max_parallel=max_parallel, rate_limit=rate_limit, eject=eject
    )


def failover(node: str, raw: bytes) -> Failover:
    """``{"allow_data_loss": false}`` (optional)."""
    body = json_object(raw, ("allow_data_loss",), empty_ok=True)
    allow = body.get("allow_data_loss", False)
    if not isinstance(allow, bool):
        raise RestError(400, "bad_request", f"allow_data_loss must be true or false, got {allow!r}")
    return Failover(node=node, request_id=uuid.uuid4().hex, allow_data_loss=allow)


def recover(node: str, raw: bytes) -> Recover:
    """``{"kind": "delta"}`` or ``"full"`` (optional: delta)."""
    body = json_object(raw, ("kind",), empty_ok=True)
    kind = body.get("kind", "delta")
    if kind not in RECOVERY_KINDS:
        raise RestError(
            400,
            "bad_request",
            f"unknown recovery kind {kind!r}: one of {', '.join(RECOVERY_KINDS)}",
        )
    return Recover(node=node, kind=kind, request_id=uuid.uuid4().hex)


def _names(keyspace: str, name: str) -> None:
    try:
        check_keyspace_name(keyspace)
        check_index_name(name, primary=True)
    except ShardexError as e:
        raise RestError(400, "bad_request", str(e)) from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

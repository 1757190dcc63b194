"""Cluster REST for operators under ``/api/``: nodes, keyspaces (with their partition
maps), indexes and the rebalance as JSON; keyspace create (``POST /api/keyspaces``) and
drop (``DELETE /api/keyspaces/NAME``).

Every listing is built by the same functions the Python client turns its RPC replies
with (``cluster_status_from``, ``describe``, ``describe_index``, ``rebalance_from``), fed
from what the node already holds: its membership view and the coordinator state its scan
coordinator reads (``ClusterView.state``: a manager's own replica, else a copy fetched from
a manager at most a second old). What that copy leaves out (the rebalance with its moves'
live phases, failed-over nodes) is asked of the coordinator (``submit``) as the client
asks it. So a listing here and the client's agree.

Each route is authorised as the RPC request it stands for (``MembersRequest``,
``ListKeyspaces``, ``StateRequest``, ``GetRebalance``: every user's, ``cluster.read``), so
the privilege table in ``shardex.api.privileges`` stays the one place that decides. The
actions build the very messages the client sends (``CreateKeyspace``, ``DropKeyspace``,
checked by the same ``check_*`` functions) and submit them to the coordinator the node's
RPC listener would hand them to (``submit``: the node's own, else a manager's), with a
fresh request id each: a retried HTTP request is a new request.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import unquote

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.keyspaces import (
    CreateKeyspace,
    DropKeyspace,
    KeyspaceCreated,
    ListKeyspaces,
    check_keyspace_name,
)
from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.rebalance import GetRebalance, RebalanceReply
from shardex.client.indexes import describe_index
from shardex.client.types import cluster_status_from, describe, rebalance_from
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import latest_index_topology
from shardex.meta.partitioning import DEFAULT_NUM_PARTITIONS, check_num_partitions
from shardex.meta.replica_placement import check_num_replicas
from shardex.meta.state import StateContext
from shardex.net.credentials import Principal
from shardex.net.messages import Message
from shardex.node.http.wire import Request, Response

__all__ = ["API_PREFIX", "ClusterRest", "RestError"]

API_PREFIX: Final = "/api"
NODES: Final = "/api/nodes"
KEYSPACES: Final = "/api/keyspaces"
INDEXES: Final = "/api/indexes"
REBALANCE: Final = "/api/rebalance"

Authorizer = Callable[[Principal, Message], None]
Submit = Callable[[Message], Awaitable[Message]]
# The HTTP status of a coordinator's refusal (anything else is 500).
_STATUS: Final = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.AUTH_FAILED: 403,
    ErrorCode.KEYSPACE_NOT_FOUND: 404,
    ErrorCode.KEYSPACE_EXISTS: 409,
    ErrorCode.NODE_UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 504,
}


class RestError(Exception):
    """An answer other than 200: HTTP status, a short code and a message."""

    def __init__(self, status: int, code: str, msg: str) -> None:
        super().__init__(msg)
        self.status, self.code, self.msg = status, code, msg

    def body(self) -> bytes:
        return json.dumps({"errors": [{"code": self.code, "msg": self.msg}]}).encode()


class ClusterRest:
    def __init__(
        self,
        *,
        members: Callable[[], MembersReply | None],
        state: Callable[[], Awaitable[StateContext]],
        authorize: Authorizer,
        submit: Submit,
    ) -> None:
        self._members = members
        self._state = state
        self._authorize = authorize
        self._submit = submit

    @staticmethod
    def allowed(path: str) -> tuple[str, ...] | None:
        """The methods served on ``path`` (None: no such endpoint)."""
        if path == KEYSPACES:
            return ("GET", "POST")
        if path in (NODES, INDEXES, REBALANCE):
            return ("GET",)
        if path.startswith(KEYSPACES + "/") and "/" not in path[len(KEYSPACES) + 1 :]:
            return ("GET", "DELETE")
        return None

    async def handle(self, req: Request, path: str, resp: Response, principal: Principal) -> None:
        try:
            if req.method == "POST":
                status, body = 201, await self.create_keyspace(req.body, principal)
            elif req.method == "DELETE":
                status = 200
                body = await self.drop_keyspace(unquote(path[len(KEYSPACES) + 1 :]), principal)
            else:
                status, body = 200, await self._answer(path, principal)
        except RestError as e:
            await resp.send(e.status, e.body())
            return
        await resp.send(status, json.dumps(body, default=_plain).encode())

    async def create_keyspace(self, raw: bytes, principal: Principal) -> dict[str, Any]:
        """``{"name": ..., "partitions": N, "replicas": R}`` (partitions and replicas
        optional, as with ``Client.create_keyspace``) -> the keyspace with its map."""
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise RestError(400, "bad_json", f"the body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise RestError(400, "bad_request", 'the body must be an object: {"name": ...}')
        unknown = sorted(set(body) - {"name", "partitions", "replicas"})
        if unknown:
            msg = f"unknown field(s) {unknown}; known: name, partitions, replicas"
            raise RestError(400, "bad_request", msg)
        try:
            name = check_keyspace_name(body.get("name"))
            parts = body.get("partitions", DEFAULT_NUM_PARTITIONS)
            check_num_partitions(parts)
            replicas = body.get("replicas")
            if replicas is not None:
                check_num_replicas(replicas)
        except ShardexError as e:
            raise RestError(400, "bad_request", str(e)) from None
        msg = CreateKeyspace(
            name=name, num_partitions=parts, num_replicas=replicas, request_id=uuid.uuid4().hex
        )
        self._check(principal, msg)
        reply = await self._run(msg)
        assert isinstance(reply, KeyspaceCreated)
        d = dataclasses.asdict(describe(reply.meta, reply.topology, reply.warnings))
        return _with_map(d)

    async def drop_keyspace(self, name: str, principal: Principal) -> dict[str, Any]:
        msg = DropKeyspace(name=name, request_id=uuid.uuid4().hex)
        self._check(principal, msg)
        await self._run(msg)
        return {"dropped": name}

    async def _run(self, msg: Message) -> Message:
        try:
            return await self._submit(msg)
        except ShardexError as e:
            status = _STATUS.get(e.code, 500)
            raise RestError(status, e.code.value.lower(), str(e)) from None

    async def _answer(self, path: str, principal: Principal) -> Any:
        if path == NODES:
            self._check(principal, MembersRequest())
            return await self.nodes()
        if path == KEYSPACES:
            self._check(principal, ListKeyspaces(request_id=""))
            return {"keyspaces": await self.keyspaces()}
        if path == INDEXES:
            self._check(principal, StateRequest(sections=["indexes"]))
            return {"indexes": await self.indexes()}
        if path == REBALANCE:
            self._check(principal, GetRebalance())
            return await self.rebalance()
        name = unquote(path[len(KEYSPACES) + 1 :])
        self._check(principal, ListKeyspaces(request_id=""))
        return await self.keyspace(name)

    def _check(self, principal: Principal, msg: Message) -> None:
        try:
            self._authorize(principal, msg)
        except ShardexError as e:
            raise RestError(403, "forbidden", str(e)) from None

    async def _read_state(self) -> StateContext:
        try:
            return await self._state()
        except ShardexError as e:
            raise RestError(503, "unavailable", f"the cluster state cannot be read: {e}") from e

    async def nodes(self) -> dict[str, Any]:
        """The membership view (``shardex cluster status``), each member with its failover
        state from the coordinator."""
        view = self._members()
        if view is None:
            raise RestError(503, "unavailable", "this node has not started its membership")
        status = cluster_status_from(view)
        # Not in the sections ``ClusterView`` caches: asked of the coordinator.
        reply = await self._run(StateRequest(sections=["failed_over", "recovering"]))
        assert isinstance(reply, StateReply)
        state = reply.state
        nodes = [
            {
                "name": m.name,
                "member_id": m.member_id,
                "address": m.address,
                "services": list(m.services),
                "state": m.state,
                "server_group": m.group,
                "failed_over": m.name in state.failed_over,
                "recovering": state.recovering.get(m.name),
                "last_heartbeat_age": m.last_heartbeat_age,
            }
            for m in status.members
        ]
        return {"observer": status.observer, "version": status.version, "nodes": nodes}

    async def keyspaces(self) -> list[dict[str, Any]]:
        """What ``Client.list_keyspaces`` returns, partition maps left to the one-keyspace
        route (they grow with the partitions)."""
        state = await self._read_state()
        out = []
        for name in sorted(state.keyspaces):
            d = _keyspace(state, name)
            out.append(
                {
                    "name": d["name"],
                    "uuid": d["uuid"],
                    "num_partitions": d["num_partitions"],
                    "num_replicas": d["num_replicas"],
                    "topology_seq": d["topology_seq"],
                    "nodes": sorted(set(d["assignment"].values())),
                }
            )
        return out

    async def keyspace(self, name: str) -> dict[str, Any]:
        state = await self._read_state()
        if name not in state.keyspaces:
            msg = f"no keyspace {name!r}; GET /api/keyspaces lists them"
            raise RestError(404, "keyspace_not_found", msg)
        d = _with_map(_keyspace(state, name))
        del d["warnings"]
        return d

    async def indexes(self) -> list[dict[str, Any]]:
        """What ``Client.list_indexes(stats=False)`` returns: items and stability as the
        coordinator state records them (no round to the indexers)."""
        state = await self._read_state()
        out = [
            describe_index(rec, latest_index_topology(state.index_topologies, rec.id), state.cas)
            for rec in state.indexes.values()
        ]
        return sorted(out, key=lambda d: (d["keyspace"], d["name"]))

    async def rebalance(self) -> dict[str, Any]:
        """The running or last rebalance (``Client.rebalance_status``: the same
        ``GetRebalance``, answered by the master with its moves' live phases) with its
        progress: the share of its moves that ended."""
        reply = await self._run(GetRebalance())
        assert isinstance(reply, RebalanceReply)
        if reply.record is None:
            return {"rebalance": None}
        result = rebalance_from(reply.record, reply.phases)
        ended = sum(1 for m in result.moves if m.status not in ("planned", "moving"))
        progress = ended / len(result.moves) if result.moves else 1.0
        return {"rebalance": {**dataclasses.asdict(result), "progress": progress}}


def _keyspace(state: StateContext, name: str) -> dict[str, Any]:
    history = state.data_topologies.get(name)
    return dataclasses.asdict(describe(state.keyspaces[name], history[-1] if history else None))


def _with_map(d: dict[str, Any]) -> dict[str, Any]:
    """A described keyspace with its partition map: partition -> active and replicas."""
    d["partitions"] = {
        p: {"active": node, "replicas": d["replicas"].get(p, [])}
        for p, node in d["assignment"].items()
    }
    return d


def _plain(value: Any) -> Any:
    """JSON for what ``json`` does not know: tuples and sets as lists, the rest as text."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)

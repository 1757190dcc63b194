"""Cluster REST for operators under ``/api/``: nodes, keyspaces (with their partition
maps), indexes (with state, build progress, items and stability lag) and the rebalance as
JSON; the actions: keyspace create and drop, index create, build and drop, rebalance
start, failover and recovery of a node (bodies checked in ``cluster_actions.py``).

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
``CreateIndex``, ``BuildIndex``, ``DropIndex``, ``StartRebalance``, ``Failover``,
``Recover``, checked by the same functions) and submit them to the coordinator the node's
RPC listener would hand them to (``submit``: the node's own, else a manager's), with a
fresh request id each: a retried HTTP request is a new request.

An index's items and stability TS are the indexers' (``ListSlices``, as ``Client.list_indexes``
asks them, through ``slices``), its stability lag the seqnos that TS is behind the
keyspace's high seqnos (``high_seqnos``: the round a request_plus scan shares), as the
node's ``shardex_index_stability_lag_seqnos`` counts it for its own partitions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.expiry import check_max_ttl
from shardex.api.failover import FailedOver, Recovered
from shardex.api.index import SliceInfo
from shardex.api.index_ddl import IndexCreated, IndexDropped, IndexesBuilding
from shardex.api.keyspaces import (
    CreateKeyspace,
    DropKeyspace,
    KeyspaceCreated,
    ListKeyspaces,
    check_keyspace_name,
)
from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.rebalance import GetRebalance, RebalanceReply
from shardex.client.index_stats import (
    STATS_TIMEOUT,
    gather_slices,
    has_slices,
    index_stats,
    wanted_slices,
)
from shardex.client.indexes import describe_index
from shardex.client.types import cluster_status_from, describe, rebalance_from
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import latest_index_topology
from shardex.meta.partitioning import DEFAULT_NUM_PARTITIONS, check_num_partitions
from shardex.meta.replica_placement import check_num_replicas
from shardex.meta.state import StateContext
from shardex.net.credentials import Principal
from shardex.net.messages import Message
from shardex.net.transport import split_address
from shardex.node.http.cluster_actions import RestError, json_object
from shardex.node.http.cluster_actions import build_index as build_index_message
from shardex.node.http.cluster_actions import create_index as create_index_message
from shardex.node.http.cluster_actions import drop_index as drop_index_message
from shardex.node.http.cluster_actions import failover as failover_message
from shardex.node.http.cluster_actions import recover as recover_message
from shardex.node.http.cluster_actions import start_rebalance as rebalance_message
from shardex.node.http.wire import Request, Response
from shardex.node.metrics import stability_lag

__all__ = ["API_PREFIX", "ClusterRest", "RestError", "slices_through"]

API_PREFIX: Final = "/api"
NODES: Final = "nodes"
KEYSPACES: Final = "keyspaces"
INDEXES: Final = "indexes"
REBALANCE: Final = "rebalance"
NODE_ACTIONS: Final = ("failover", "recover")

Authorizer = Callable[[Principal, Message], None]
Submit = Callable[[Message], Awaitable[Message]]
# index ids wanted per indexer node -> node -> its slices of them (``gather_slices``)
Slices = Callable[[Mapping[str, Iterable[str]]], Awaitable[dict[str, list[SliceInfo]]]]
HighSeqnos = Callable[[str], Awaitable[Mapping[int, tuple[int, int]]]]
HttpPorts = Callable[[list[tuple[str, str]]], Awaitable[dict[str, int]]]
# The HTTP status of a coordinator's refusal (anything else is 500).
_STATUS: Final = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.SQL_SYNTAX: 400,
    ErrorCode.EXPRESSION_SYNTAX: 400,
    ErrorCode.AUTH_FAILED: 403,
    ErrorCode.KEYSPACE_NOT_FOUND: 404,
    ErrorCode.INDEX_NOT_FOUND: 404,
    ErrorCode.KEYSPACE_EXISTS: 409,
    ErrorCode.INDEX_EXISTS: 409,
    ErrorCode.INDEX_NOT_READY: 409,
    ErrorCode.NODE_UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 504,
}


def slices_through(pool: Any, address: Callable[[str], str]) -> Slices:
    """``ClusterRest``'s ``slices``: ``gather_slices`` over the node's connection pool,
    nodes found by name in its membership (``address``)."""

    class Router:
        def __init__(self) -> None:
            self.pool = pool

        async def address(self, node: str) -> str:
            return address(node)

    router = Router()
    return lambda wanted: gather_slices(router, wanted)


def _segments(path: str) -> list[str]:
    """``/api/indexes/ks/by_n/build`` -> ``["indexes", "ks", "by_n", "build"]`` (the path
    was percent-decoded as the request was read: ``%23primary`` is ``#primary``)."""
    return path[len(API_PREFIX) + 1 :].split("/")


class ClusterRest:
    def __init__(
        self,
        *,
        members: Callable[[], MembersReply | None],
        state: Callable[[], Awaitable[StateContext]],
        authorize: Authorizer,
        submit: Submit,
        slices: Slices | None = None,
        high_seqnos: HighSeqnos | None = None,
        http_ports: HttpPorts | None = None,
    ) -> None:
        self._members = members
        # (member id, RPC address) pairs -> their HTTP ports; None: not listed
        self._http_ports = http_ports
        self._state = state
        self._authorize = authorize
        self._submit = submit
        # None (tests of the routes alone): items and stability from the state, no lag
        self._slices = slices
        self._high_seqnos = high_seqnos

    @staticmethod
    def allowed(path: str) -> tuple[str, ...] | None:
        """The methods served on ``path`` (None: no such endpoint)."""
        seg = _segments(path)
        if len(seg) == 1:
            return {
                KEYSPACES: ("GET", "POST"),
                INDEXES: ("GET", "POST"),
                REBALANCE: ("GET", "POST"),
                NODES: ("GET",),
            }.get(seg[0])
        if seg[0] == KEYSPACES and len(seg) == 2:
            return ("GET", "DELETE")
        if seg[0] == INDEXES and len(seg) == 3:
            return ("GET", "DELETE")
        if seg[0] == INDEXES and len(seg) == 4 and seg[3] == "build":
            return ("POST",)
        if seg[0] == NODES and len(seg) == 3 and seg[2] in NODE_ACTIONS:
            return ("POST",)
        return None

    async def handle(self, req: Request, path: str, resp: Response, principal: Principal) -> None:
        try:
            if req.method == "GET":
                status, body = 200, await self._answer(path, principal)
            else:
                status, body = await self._act(req, _segments(path), principal)
        except RestError as e:
            await resp.send(e.status, e.body())
            return
        await resp.send(status, json.dumps(body, default=_plain).encode())

    async def _act(
        self, req: Request, seg: list[str], principal: Principal
    ) -> tuple[int, dict[str, Any]]:
        """A POST or DELETE (``allowed`` let only the served ones through): its status and
        answer."""
        kind, method = seg[0], req.method
        if kind == KEYSPACES:
            if method == "POST":
                return 201, await self.create_keyspace(req.body, principal)
            return 200, await self.drop_keyspace(seg[1], principal)
        if kind == INDEXES:
            if len(seg) == 1:
                return 201, await self.create_index(req.body, principal)
            if method == "DELETE":
                return 200, await self.drop_index(seg[1], seg[2], principal)
            return 202, await self.build_index(seg[1], seg[2], principal)
        if kind == REBALANCE:
            return 202, await self.start_rebalance(req.body, principal)
        return 200, await self.node_action(seg[1], seg[2], req.body, principal)

    async def create_keyspace(self, raw: bytes, principal: Principal) -> dict[str, Any]:
        """``{"name": ..., "partitions": N, "replicas": R, "max_ttl": S}`` (all but the
        name optional, as with ``Client.create_keyspace``) -> the keyspace with its map."""
        body = json_object(raw, ("name", "partitions", "replicas", "max_ttl"))
        try:
            name = check_keyspace_name(body.get("name"))
            parts = body.get("partitions", DEFAULT_NUM_PARTITIONS)
            check_num_partitions(parts)
            replicas = body.get("replicas")
            if replicas is not None:
                check_num_replicas(replicas)
            max_ttl = check_max_ttl(body.get("max_ttl", 0))
        except ShardexError as e:
            raise RestError(400, "bad_request", str(e)) from None
        msg = CreateKeyspace(
            name=name,
            num_partitions=parts,
            num_replicas=replicas,
            request_id=uuid.uuid4().hex,
            max_ttl=max_ttl,
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

    async def create_index(self, raw: bytes, principal: Principal) -> dict[str, Any]:
        """CREATE INDEX: returns with the index BUILDING (READY when deferred), as listed."""
        msg = create_index_message(raw)
        self._check(principal, msg)
        reply = await self._run(msg)
        assert isinstance(reply, IndexCreated)
        return describe_index(reply.index, reply.topology, None)

    async def build_index(self, keyspace: str, name: str, principal: Principal) -> dict[str, Any]:
        """BUILD INDEX of one deferred (READY) or failed (ERROR) index: it is BUILDING when
        this answers; GET /api/indexes/KEYSPACE/NAME follows its progress to ACTIVE."""
        msg = build_index_message(keyspace, name)
        self._check(principal, msg)
        reply = await self._run(msg)
        assert isinstance(reply, IndexesBuilding)
        rec = reply.indexes[0]
        return {**describe_index(rec, None, None), "started": name in reply.started}

    async def drop_index(self, keyspace: str, name: str, principal: Principal) -> dict[str, Any]:
        msg = drop_index_message(keyspace, name)
        self._check(principal, msg)
        reply = await self._run(msg)
        assert isinstance(reply, IndexDropped)
        return {
            "dropped": reply.name,
            "id": reply.index_id,
            "keyspace": reply.keyspace,
            "pending_nodes": list(reply.pending_nodes),
        }

    async def start_rebalance(self, raw: bytes, principal: Principal) -> dict[str, Any]:
        """Starts a rebalance (or attaches to the running one: ``attached``) and answers at
        once with its plan; GET /api/rebalance follows its progress."""
        msg = rebalance_message(raw)
        self._check(principal, msg)
        reply = await self._run(msg)
        assert isinstance(reply, RebalanceReply)
        return {**_rebalance_of(reply), "attached": reply.attached}

    async def node_action(
        self, node: str, action: str, raw: bytes, principal: Principal
    ) -> dict[str, Any]:
        """``failover``: the node's active partitions move to their best replicas (``promoted``,
        ``lost``); ``recover``: a failed-over node is taken back (delta or full)."""
        msg = failover_message(node, raw) if action == "failover" else recover_message(node, raw)
        self._check(principal, msg)
        reply = await self._run(msg)
        if isinstance(reply, FailedOver):
            return {
                "failed_over": reply.node,
                "promoted": reply.promoted,
                "lost": reply.lost,
                "cas": reply.cas,
            }
        assert isinstance(reply, Recovered)
        return {"recovered": reply.node, "kind": reply.kind, "cas": reply.cas}

    async def _run(self, msg: Message) -> Message:
        try:
            return await self._submit(msg)
        except ShardexError as e:
            status = _STATUS.get(e.code, 500)
            raise RestError(status, e.code.value.lower(), str(e)) from None

    async def _answer(self, path: str, principal: Principal) -> Any:
        seg = _segments(path)
        kind = seg[0]
        if kind == NODES:
            self._check(principal, MembersRequest())
            return await self.nodes()
        if kind == INDEXES:
            self._check(principal, StateRequest(sections=["indexes"]))
            if len(seg) == 1:
                return {"indexes": await self.indexes()}
            return await self.index(seg[1], seg[2])
        if kind == REBALANCE:
            self._check(principal, GetRebalance())
            return await self.rebalance()
        self._check(principal, ListKeyspaces(request_id=""))
        if len(seg) == 1:
            return {"keyspaces": await self.keyspaces()}
        return await self.keyspace(seg[1])

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
        ports: dict[str, int] = {}
        if self._http_ports is not None:
            ports = await self._http_ports([(m.member_id, m.address) for m in status.members])
        nodes = [
            {
                "name": m.name,
                "member_id": m.member_id,
                "address": m.address,
                # where its HTTP services listen (None: it did not say in time)
                "http_address": (
                    f"{split_address(m.address)[0]}:{ports[m.member_id]}"
                    if m.member_id in ports
                    else None
                ),
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

    async def indexes(self, keyspace: str | None = None) -> list[dict[str, Any]]:
        """What ``Client.list_indexes`` returns (items and stability TS from the indexers,
        the record's where they do not all answer), each with ``stability_lag``: seqnos its
        stability TS is behind the keyspace's high seqnos (None: not known)."""
        state = await self._read_state()
        listed = [
            (rec, latest_index_topology(state.index_topologies, rec.id))
            for rec in state.indexes.values()
            if keyspace is None or rec.keyspace == keyspace
        ]
        wanted = wanted_slices(listed)
        slices = await self._slices(wanted) if wanted and self._slices is not None else {}
        highs = await self._highs({rec.keyspace for rec, _ in listed if has_slices(rec)})
        out = []
        for rec, topo in listed:
            stats = index_stats(rec.id, topo, slices) if has_slices(rec) else None
            d = describe_index(rec, topo, state.cas, stats)
            high, stable = highs.get(rec.keyspace), d["stability_ts"]
            d["stability_lag"] = (
                None
                if high is None or stable is None or not has_slices(rec)
                else stability_lag(high, Timestamp({p: (s, 0) for p, s in stable.items()}))
            )
            out.append(d)
        return sorted(out, key=lambda d: (d["keyspace"], d["name"]))

    async def index(self, keyspace: str, name: str) -> dict[str, Any]:
        for d in await self.indexes(keyspace):
            if d["name"] == name:
                return d
        msg = f"no index {name!r} on keyspace {keyspace!r}; GET /api/indexes lists them"
        raise RestError(404, "index_not_found", msg)

    async def _highs(self, keyspaces: set[str]) -> dict[str, Mapping[int, tuple[int, int]]]:
        """Keyspace -> its partitions' (high seqno, uuid), asked in parallel; a keyspace
        whose owners do not all answer is left out (its indexes' lag is None)."""
        if self._high_seqnos is None or not keyspaces:
            return {}
        names = sorted(keyspaces)
        # bounded: a status read must not wait out a failover (high_seqnos retries one)
        got = await asyncio.gather(
            *(asyncio.wait_for(self._high_seqnos(k), STATS_TIMEOUT) for k in names),
            return_exceptions=True,
        )
        return {k: v for k, v in zip(names, got, strict=True) if not isinstance(v, BaseException)}

    async def rebalance(self) -> dict[str, Any]:
        """The running or last rebalance (``Client.rebalance_status``: the same
        ``GetRebalance``, answered by the master with its moves' live phases) with its
        progress: the share of its moves that ended."""
        reply = await self._run(GetRebalance())
        assert isinstance(reply, RebalanceReply)
        return _rebalance_of(reply)


def _rebalance_of(reply: RebalanceReply) -> dict[str, Any]:
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

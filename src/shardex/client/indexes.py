"""Index DDL from the client: ``execute_ddl``, ``create_index``, ``build_index``,
``drop_index``, ``list_indexes``, ``wait_for_index``, ``stability``.

A part of ``Client`` kept apart for module size; it reaches the cluster only through the
client's ``RpcSession`` (``self.rpc``). Statements and definitions are checked here first
(syntax with line and column, expressions, names), so most mistakes fail without a round
trip; the coordinator checks everything again against the cluster state.

Retries. A DDL call may outlive its node: each call makes its ``request_id`` once and
``RpcSession.ddl`` resends the *same* message to the next node until one answers or refuses
it, or ``ddl_timeout`` passes; the coordinator applies a request id once, so a retried
CREATE never creates twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.errors import BadRequest
from shardex.api.index_ddl import (
    DEFAULT_PARTITIONED,
    BuildIndex,
    CreateIndex,
    DropIndex,
    IndexCreated,
    IndexDropped,
    IndexesBuilding,
    check_index_name,
)
from shardex.api.keyspaces import check_keyspace_name
from shardex.api.timekeeper import StabilityReply, StabilityRequest
from shardex.client.index_stats import (
    IndexStats,
    gather_slices,
    has_slices,
    index_stats,
    seqnos,
    wanted_slices,
)
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import (
    ConnectionClosed,
    ErrorCode,
    NodeUnavailable,
    RequestTimeout,
    ShardexError,
)
from shardex.meta.index_definition import (
    IndexDefinition,
    IndexKey,
    check_num_replica,
    validate_definition,
)
from shardex.meta.index_state import (
    ACTIVE,
    ERROR,
    INDEX_STATES,
    PRIMARY_NAME,
    IndexRecord,
    latest_index_topology,
    state_rank,
)
from shardex.sql.ddl import (
    BuildIndexStmt,
    CreateIndexStmt,
    DropIndexStmt,
    parse_ddl,
    parse_index_key,
)

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession

__all__ = ["IndexOps", "create_index_args", "create_index_message", "describe_index"]

KeySpec = str | tuple[str, bool] | IndexKey


def describe_index(
    rec: IndexRecord, topo: Topology | None, cas: int | None, stats: IndexStats | None = None
) -> dict[str, Any]:
    """One index as a plain dict (what ``list_indexes`` returns; JSON-ready but for the int
    keys of ``partitions`` and the timestamps). ``stats``: the indexers' (stability seqnos,
    items) for the index (``index_stats``); without them, the record's own values.
    ``stability_ts`` is data partition -> seqno (``None``: nothing published yet)."""
    d = rec.definition
    assignment = dict(sorted(topo.assignment.items())) if topo is not None else {}
    if stats is not None:
        stability, items, source = stats[0], stats[1], "indexers"
    else:
        stability, items, source = seqnos(rec.stability_ts), rec.items_count, "state"
    return {
        "id": d.id,
        "name": d.name,
        "keyspace": d.keyspace,
        "state": rec.state,
        "error": rec.error,
        "cas": cas,
        "num_partition": d.num_partition,
        "num_replica": rec.num_replica,
        # index partition -> the nodes of its replica copies (the primary is in partitions)
        "replicas": {p: list(ns) for p, ns in sorted(topo.replicas.items())} if topo else {},
        "nodes": sorted(
            {
                *assignment.values(),
                *(n for ns in (topo.replicas.values() if topo else ()) for n in ns),
            }
        ),
        "partitions": assignment,
        "topology_seq": topo.seq_num if topo is not None else None,
        "keys": [k.expr + (" DESC" if k.desc else "") for k in d.keys],
        "where": d.where,
        "partition_by": list(d.partition_by) if d.partition_by is not None else None,
        "is_primary": d.is_primary,
        "defer_build": rec.defer_build,
        "build_ts": _ts(rec.build_ts),
        "stability_ts": stability,
        "items_count": items,
        "stats_source": source,
        "progress": 1.0 if rec.state == ACTIVE else rec.progress,
    }


def create_index_args(stmt: CreateIndexStmt) -> dict[str, Any]:
    """A parsed CREATE [PRIMARY] INDEX as the keyword arguments of ``create_index`` (and
    ``create_index_message``)."""
    return {
        "keyspace": stmt.keyspace,
        "name": stmt.name,
        "keys": list(stmt.keys),
        "where": stmt.where,
        "partition_by": list(stmt.partition_by) if stmt.partition_by else None,
        "num_partition": stmt.num_partition,
        "defer_build": stmt.defer_build,
        "nodes": list(stmt.nodes) if stmt.nodes else None,
        "primary": stmt.is_primary,
        "num_replica": stmt.num_replica,
    }


def create_index_message(
    keyspace: str,
    name: str | None,
    keys: Sequence[KeySpec] = (),
    where: str | None = None,
    partition_by: Sequence[str] | None = None,
    num_partition: int | None = None,
    defer_build: bool = False,
    nodes: Sequence[str] | None = None,
    *,
    primary: bool = False,
    num_replica: int = 0,
) -> CreateIndex:
    """The ``CreateIndex`` of ``IndexOps.create_index``'s arguments (its docstring says what
    they mean), checked first (names, expressions, partition counts: BAD_REQUEST or
    SQL_SYNTAX without a round trip), with a fresh request id. The node's HTTP API builds
    its CREATE with it too."""
    check_keyspace_name(keyspace)
    num_replica = check_num_replica(num_replica)
    parts = [_key(k) for k in keys]
    if primary:
        name = check_index_name(name or PRIMARY_NAME, primary=True)
    else:
        name = check_index_name(name)
        if num_partition is None:
            n = 1 if partition_by is None else DEFAULT_PARTITIONED
        else:
            n = num_partition
        # Expressions and partition counts, checked here to fail without a round trip.
        validate_definition(
            IndexDefinition(
                id="pending",
                name=name,
                keyspace=keyspace,
                keys=parts,
                where=where,
                partition_by=list(partition_by) if partition_by is not None else None,
                num_partition=n,
            )
        )
    return CreateIndex(
        keyspace=keyspace,
        name=name,
        keys=parts,
        where=where,
        partition_by=list(partition_by) if partition_by is not None else None,
        num_partition=num_partition,
        defer_build=defer_build,
        nodes=list(nodes) if nodes is not None else None,
        is_primary=primary,
        request_id=uuid.uuid4().hex,
        num_replica=num_replica,
    )


def _ts(wire: dict[int, tuple[int, int]] | None) -> dict[int, list[int]] | None:
    return None if wire is None else {p: [s, u] for p, (s, u) in sorted(wire.items())}


def _key(spec: KeySpec) -> IndexKey:
    if isinstance(spec, IndexKey):
        return spec
    if isinstance(spec, str):
        expr, desc = parse_index_key(spec)
        return IndexKey(expr=expr, desc=desc)
    expr, desc = spec
    return IndexKey(expr=expr, desc=bool(desc))


class IndexOps:
    """Index DDL and listings: a base of ``Client``, which provides ``rpc``."""

    rpc: RpcSession

    @property
    def ddl_timeout(self) -> float:
        """How long a DDL call keeps resending its request to the next node, seconds."""
        return self.rpc.ddl_timeout

    @ddl_timeout.setter
    def ddl_timeout(self, value: float) -> None:
        self.rpc.ddl_timeout = value

    # -- statements -------------------------------------------------------------------------

    def execute_ddl(self, statement: str) -> dict[str, Any] | list[dict[str, Any]]:
        """Run one DDL statement (``shardex.sql.ddl``): CREATE [PRIMARY] INDEX returns the
        index, BUILD INDEX the named indexes, DROP INDEX the dropped one. SQL_SYNTAX (with
        line, column and token) before anything is sent."""
        stmt = parse_ddl(statement)
        if isinstance(stmt, CreateIndexStmt):
            return self.create_index(**create_index_args(stmt))
        if isinstance(stmt, BuildIndexStmt):
            return self.build_index(stmt.keyspace, *stmt.names)
        assert isinstance(stmt, DropIndexStmt)
        return self.drop_index(stmt.keyspace, stmt.name, primary=stmt.is_primary)

    # -- DDL calls ----------------------------------------------------------------------------

    def create_index(
        self,
        keyspace: str,
        name: str | None,
        keys: Sequence[KeySpec] = (),
        where: str | None = None,
        partition_by: Sequence[str] | None = None,
        num_partition: int | None = None,
        defer_build: bool = False,
        nodes: Sequence[str] | None = None,
        *,
        primary: bool = False,
        num_replica: int = 0,
    ) -> dict[str, Any]:
        """CREATE INDEX; returns once every slice is allocated, with the index in BUILDING
        (READY with ``defer_build``). ``keys``: ``"age"``, ``"age DESC"``, ``("age", True)``.
        ``partition_by``: expressions (``["META().id"]``); ``num_partition`` defaults to 8
        with it, 1 without. ``nodes`` pins the placement. ``primary``: a primary index (no
        keys; named ``#primary`` unless ``name`` is given). ``num_replica`` (0..3): full
        copies of every index partition on other indexers, kept at the same stability TS;
        scans fail over between them."""
        msg = create_index_message(
            keyspace,
            name,
            keys,
            where,
            partition_by,
            num_partition,
            defer_build,
            nodes,
            primary=primary,
            num_replica=num_replica,
        )
        reply = self.rpc.run(self.rpc.ddl(msg, IndexCreated))
        return self._described(reply.index, reply.topology)

    def build_index(self, keyspace: str, *names: str) -> list[dict[str, Any]]:
        """BUILD INDEX: deferred (READY) or failed (ERROR) indexes start building."""
        if not names:
            raise BadRequest("build_index needs at least one index name", details={})
        msg = BuildIndex(keyspace=keyspace, names=list(names), request_id=uuid.uuid4().hex)
        reply = self.rpc.run(self.rpc.ddl(msg, IndexesBuilding))
        return [self._described(r, None) for r in reply.indexes]

    def drop_index(
        self, keyspace: str, name: str | None = None, *, primary: bool = False
    ) -> dict[str, Any]:
        """DROP INDEX; with ``primary`` and no name, the keyspace's primary index. Returns
        ``{"id", "keyspace", "name", "pending_nodes"}``: indexers that were not reachable
        drop their slices when they reconcile."""
        if name is None and not primary:
            raise BadRequest("drop_index needs an index name (or primary=True)", details={})
        msg = DropIndex(
            keyspace=keyspace, name=name, is_primary=primary, request_id=uuid.uuid4().hex
        )
        reply = self.rpc.run(self.rpc.ddl(msg, IndexDropped))
        return {
            "id": reply.index_id,
            "keyspace": reply.keyspace,
            "name": reply.name,
            "pending_nodes": list(reply.pending_nodes),
        }

    # -- reads ------------------------------------------------------------------------------

    def list_indexes(
        self, keyspace: str | None = None, *, fresh: bool = True, stats: bool = True
    ) -> list[dict]:
        """Indexes (of ``keyspace``, or all) with state, CAS, partitions and nodes, sorted by
        keyspace and name. ``fresh``: as of the master's last commit; otherwise the connected
        node's own replica (what that node would answer; the cluster tests compare them).
        ``cas`` is the CAS of the state read. ``stats``: also ask the indexers for each
        index's published stability TS and entry count (``client/index_stats.py``; falls back
        to the record's values for an index whose indexers do not all answer)."""
        return self.rpc.run(self._list_indexes(keyspace, fresh, stats))

    async def _list_indexes(self, keyspace: str | None, fresh: bool, stats: bool) -> list[dict]:
        msg = StateRequest(sections=["indexes", "index_topologies"], fresh=fresh)
        state = (await self.rpc.request(msg, StateReply, True)).state
        listed = [
            (rec, latest_index_topology(state.index_topologies, rec.id))
            for rec in state.indexes.values()
            if keyspace is None or rec.keyspace == keyspace
        ]
        wanted = wanted_slices(listed) if stats else {}
        slices = await gather_slices(self.rpc.router, wanted) if wanted else {}
        out = [
            describe_index(
                rec,
                topo,
                state.cas,
                index_stats(rec.id, topo, slices) if has_slices(rec) else None,
            )
            for rec, topo in listed
        ]
        return sorted(out, key=lambda d: (d["keyspace"], d["name"]))

    def stability(self, keyspace: str) -> dict[str, Timestamp]:
        """Index id -> the stability TS the coordinator master's timekeeper last published
        for the indexes of ``keyspace`` (the pipeline sends every stabilise round there; held
        in memory, so a new master knows nothing until the next round)."""

        rpc = self.rpc

        async def ask() -> StabilityReply:
            reply = await rpc.request(
                StateRequest(sections=["keyspaces"], fresh=True), StateReply, True
            )
            msg = StabilityRequest(keyspace=keyspace)
            master = reply.state.master
            if not master:
                return await rpc.request(msg, StabilityReply, True)
            router = rpc.router
            conn = await router.pool.get(await router.address(master), rpc.request_timeout)
            return await conn.request(msg, rpc.request_timeout, expect=StabilityReply)

        reply = rpc.run(ask())
        return {i: Timestamp.from_wire(ts) for i, ts in reply.stability.items()}

    def wait_for_index(
        self,
        keyspace: str,
        name: str,
        state: str = "ACTIVE",
        timeout: float = 60.0,
        interval: float = 0.2,
    ) -> dict[str, Any]:
        """Poll until the index is in ``state`` or a later one (INIT < READY < BUILDING <
        ACTIVE). Raises INDEX_NOT_READY if it goes to ERROR (with its error), INDEX_NOT_FOUND
        if it is dropped meanwhile (or never appears), TIMEOUT naming the state it is in."""
        if state not in INDEX_STATES:
            raise BadRequest(
                f"unknown index state {state!r}", details={"states": list(INDEX_STATES)}
            )
        deadline = time.monotonic() + timeout
        seen: dict[str, Any] | None = None
        while True:
            try:
                current = next((i for i in self.list_indexes(keyspace) if i["name"] == name), None)
            except (ConnectionClosed, RequestTimeout, NodeUnavailable):
                current = seen  # a failover: keep polling
            else:
                if current is None and seen is not None:
                    raise ShardexError(
                        f"index {name!r} on {keyspace!r} was dropped while waiting for {state}",
                        code=ErrorCode.INDEX_NOT_FOUND,
                        details={"keyspace": keyspace, "name": name},
                    )
            if current is not None:
                seen = current
                if _reached(current["state"], state):
                    return current
                if current["state"] == ERROR:
                    raise ShardexError(
                        f"index {name!r} on {keyspace!r} failed: {current['error']}",
                        code=ErrorCode.INDEX_NOT_READY,
                        details={
                            "keyspace": keyspace,
                            "name": name,
                            "state": ERROR,
                            "error": current["error"],
                        },
                    )
            if time.monotonic() >= deadline:
                if seen is None:
                    raise ShardexError(
                        f"index {name!r} not found on {keyspace!r}",
                        code=ErrorCode.INDEX_NOT_FOUND,
                        details={"keyspace": keyspace, "name": name},
                    )
                raise RequestTimeout(
                    f"index {name!r} on {keyspace!r} is still {seen['state']} after "
                    f"{timeout}s (waiting for {state})",
                    details={
                        "keyspace": keyspace,
                        "name": name,
                        "state": seen["state"],
                        "wanted": state,
                        "progress": seen["progress"],
                    },
                )
            time.sleep(interval)

    # -- plumbing -----------------------------------------------------------------------------

    def _described(self, rec: IndexRecord, topo: Topology | None) -> dict[str, Any]:
        """The index as ``list_indexes`` shows it (with the state's CAS) if it can be read
        now, else from the reply."""
        try:
            for d in self.list_indexes(rec.keyspace):
                if d["id"] == rec.id:
                    return d
        except ShardexError:
            pass
        return describe_index(rec, topo, None)


def _reached(current: str, wanted: str) -> bool:
    if current == wanted:
        return True
    a, b = state_rank(current), state_rank(wanted)
    return a is not None and b is not None and a > b

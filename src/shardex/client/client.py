"""The synchronous Python client.

Users call plain methods; underneath, an asyncio loop runs in a background thread owned by
the client and every call is a coroutine submitted to it (``client/loop_thread.py``). The
network code is therefore the same async code the nodes use, and the user never sees a loop.
The exceptions are ``scan`` and single-document requests (``Keyspace.get``, ``insert``,
``upsert``, ``replace``, ``delete``): on TCP they run over a blocking socket of the calling
thread (``shardex.client.direct_scan``, ``shardex.client.direct_kv``), since the hand-off to
the loop thread and back was most of their client CPU.

``Client`` is the public face; its connection side (loop thread, connection and failover,
data router) is an ``RpcSession`` (``client/rpc_session.py``), and the modules behind its
methods (``Keyspace``, scans, queries, index DDL, rebalance) are handed that session, not
the client.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import shardex.client.users as user_ops
from shardex.api.data import HighSeqnos, HighSeqnosReply, KeyspaceStats, KeyspaceStatsReply
from shardex.api.expiry import check_max_ttl
from shardex.api.keyspaces import (
    CreateKeyspace,
    DropKeyspace,
    KeyspaceCreated,
    KeyspaceDropped,
    KeyspaceList,
    KeyspaceReplicasSet,
    ListKeyspaces,
    SetKeyspaceReplicas,
    check_keyspace_name,
)
from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.node import StatusReply, StatusRequest
from shardex.api.users import UserInfo
from shardex.client.direct_conn import DirectConns
from shardex.client.direct_kv import DirectKV
from shardex.client.direct_scan import DirectScans
from shardex.client.direct_sql import DirectSql
from shardex.client.failover import FailoverOps
from shardex.client.indexes import IndexOps
from shardex.client.keyspace import Keyspace
from shardex.client.query import QueryRows, run_query
from shardex.client.rebalance import RebalanceOps
from shardex.client.rpc_session import RETRYABLE, RpcSession
from shardex.client.scan import (
    DEFAULT_SCAN_TIMEOUT,
    QueryContext,
    ScanPaths,
    ScanResult,
    ScanTargets,
    open_scan,
)
from shardex.client.scan_page import ScanPage, build_page_request, scan_page
from shardex.client.types import (
    ClusterStatus,
    KeyspaceDescription,
    KeyspaceStatsResult,
    NodeStatus,
    cluster_status_from,
    describe,
    node_status_from,
    stats_from,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ConfigError, ShardexError
from shardex.meta.partitioning import DEFAULT_NUM_PARTITIONS, check_num_partitions
from shardex.meta.replica_placement import check_num_replicas
from shardex.net.credentials import Credentials, NodeSecret, UserLogin
from shardex.net.messages import Message
from shardex.net.tcp import TcpTransport
from shardex.net.tls import TlsConfig
from shardex.net.transport import Transport

M = TypeVar("M", bound=Message)

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_REQUEST_TIMEOUT = 10.0


class Client(RebalanceOps, IndexOps, FailoverOps):
    """A connection to a shardex cluster through one node, failing over to the others.

    Build it with ``connect`` or ``connect_local``. Thread-safe: calls from several threads
    run concurrently on the client's loop; index scans and single-document requests run in
    each calling thread, over sockets of its own (``client/direct_scan.py``,
    ``client/direct_kv.py``; ``direct_scans=False`` / ``direct_kv=False``: on the loop
    too). Use as a context manager or call ``close()``."""

    def __init__(
        self,
        addresses: Sequence[str],
        secret: str | Credentials,
        *,
        name: str = "shardex-client",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        transport: Transport | None = None,
        direct_scans: bool = True,
        direct_kv: bool = True,
    ) -> None:
        if not addresses:
            raise ConfigError("no node address given", details={"hint": "pass host:port"})
        transport = transport or TcpTransport()
        # Every request of the client and of its modules goes through this session (the
        # index pipeline's deliveries, stabilise rounds and change streams too).
        self.rpc = RpcSession(
            addresses,
            secret,
            name=name,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            transport=transport,
        )
        # Scans and single-document requests over blocking sockets of the calling thread
        # (``client/direct_scan.py``, ``client/direct_kv.py``): the default on TCP; the
        # simulator's deterministic network keeps the loop path.
        tcp = type(transport) is TcpTransport
        self._sockets = DirectConns(self.rpc) if tcp and (direct_scans or direct_kv) else None
        targets = ScanTargets()  # where scans go, for both scan paths
        sockets = self._sockets
        direct = DirectScans(self.rpc, targets, sockets) if direct_scans and sockets else None
        direct_sql = DirectSql(self.rpc, sockets) if direct_scans and sockets else None
        self._scans = ScanPaths(self.rpc, targets, direct, direct_sql)
        self._kv = DirectKV(self.rpc, sockets) if direct_kv and sockets else None

    # -- lifecycle --

    def close(self) -> None:
        """Close the connection and stop the client's thread. Idempotent."""
        sockets = self._sockets
        # Every thread's sockets first (blocked readers wake), the scan pool after the
        # router's.
        first = sockets.close if sockets is not None else None
        self.rpc.close(first=first, on_loop=self._scans.close)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.connected_address or "not connected"
        return f"<shardex.Client {self.name} -> {where}>"

    @property
    def connected_address(self) -> str | None:
        return self.rpc.connected_address

    # The connection settings, as given to ``connect`` (the session's).
    @property
    def addresses(self) -> list[str]:
        return self.rpc.addresses

    @property
    def name(self) -> str:
        return self.rpc.name

    @property
    def connect_timeout(self) -> float:
        return self.rpc.connect_timeout

    @connect_timeout.setter
    def connect_timeout(self, value: float) -> None:
        self.rpc.connect_timeout = value

    @property
    def request_timeout(self) -> float:
        return self.rpc.request_timeout

    @request_timeout.setter
    def request_timeout(self, value: float) -> None:
        self.rpc.request_timeout = value

    # -- calls --

    def ping(self) -> NodeStatus:
        """Authenticated round trip to the connected node; returns who answered and how fast."""

        async def go() -> tuple[StatusReply, float]:
            loop = asyncio.get_running_loop()
            start = loop.time()
            reply = await self.rpc.request(StatusRequest(), StatusReply, idempotent=True)
            return reply, loop.time() - start

        reply, rtt = self.rpc.run(go())
        return node_status_from(reply, rtt)

    def cluster_status(self) -> ClusterStatus:
        """The membership view (members, up/down, versions) of the connected node."""
        return cluster_status_from(self.rpc.call(MembersRequest(), MembersReply))

    # -- keyspaces and documents --

    def create_keyspace(
        self,
        name: str,
        num_partitions: int = DEFAULT_NUM_PARTITIONS,
        num_replicas: int | None = None,
        *,
        max_ttl: int = 0,
    ) -> KeyspaceDescription:
        """Create a keyspace with ``num_partitions`` partitions placed over the data nodes,
        each with ``num_replicas`` replica copies (0-3) on other nodes (None: 1 when two or
        more data nodes are up, else 0); returns once every node of the chains has opened
        its copies. KEYSPACE_EXISTS if it exists. What the placement could not honour (too
        few nodes or server groups) is in the result's ``warnings``. ``max_ttl``: seconds,
        the expiry of a document written without one and the most any may ask (0: none)."""
        check_keyspace_name(name)
        check_num_partitions(num_partitions)
        if num_replicas is not None:
            check_num_replicas(num_replicas)
        msg = CreateKeyspace(
            name=name,
            num_partitions=num_partitions,
            num_replicas=num_replicas,
            request_id=_request_id(),
            max_ttl=check_max_ttl(max_ttl),
        )
        # Retried on another node with the same request id: the coordinator deduplicates.
        reply = self.rpc.call(msg, KeyspaceCreated, idempotent=True)
        self.rpc.run(self.rpc.router.refresh())
        return describe(reply.meta, reply.topology, reply.warnings)

    def set_keyspace_replicas(self, name: str, num_replicas: int) -> KeyspaceDescription:
        """Change keyspace ``name``'s replica count (0-3). The chains are widened or
        narrowed at once (no active moves); the new copies are built from the actives' data
        in the background, on the serving data nodes, and majority-durable writes count
        the new chain length from now on. What the placement could not honour is in the
        result's ``warnings``. KEYSPACE_NOT_FOUND if there is none; BAD_REQUEST while a
        rebalance moves its partitions."""
        check_keyspace_name(name)
        check_num_replicas(num_replicas)
        msg = SetKeyspaceReplicas(name=name, num_replicas=num_replicas, request_id=_request_id())
        reply = self.rpc.call(msg, KeyspaceReplicasSet, idempotent=True)
        self.rpc.run(self.rpc.router.refresh())
        return describe(reply.meta, reply.topology, reply.warnings)

    def list_keyspaces(self) -> list[KeyspaceDescription]:
        reply = self.rpc.call(ListKeyspaces(request_id=_request_id()), KeyspaceList)
        return [describe(m, reply.topologies.get(m.name)) for m in reply.keyspaces]

    def drop_keyspace(self, name: str) -> None:
        """Drop a keyspace and its documents. KEYSPACE_NOT_FOUND if there is none."""
        msg = DropKeyspace(name=name, request_id=_request_id())
        self.rpc.call(msg, KeyspaceDropped, idempotent=True)
        self.rpc.router.forget(name)

    # -- users (``client/users.py``; needs the admin role) --

    def create_user(self, name: str, password: str, roles: list[str]) -> UserInfo:
        """Create user ``name`` with ``roles`` (``"data_reader(orders)"``; see
        ``shardex.api.privileges``). The password stays here: only keys derived from it
        (Argon2id, SCRAM) are sent and stored."""
        return user_ops.create_user(self.rpc, name, password, roles)

    def drop_user(self, name: str) -> UserInfo:
        return user_ops.drop_user(self.rpc, name)

    def grant_roles(self, name: str, roles: list[str]) -> UserInfo:
        return user_ops.grant_roles(self.rpc, name, roles)

    def revoke_roles(self, name: str, roles: list[str]) -> UserInfo:
        return user_ops.revoke_roles(self.rpc, name, roles)

    def list_users(self) -> list[UserInfo]:
        return user_ops.list_users(self.rpc)

    def keyspace(self, name: str) -> Keyspace:
        """The document API of keyspace ``name`` (no network call until it is used)."""
        return Keyspace(self.rpc, check_keyspace_name(name), self._kv)

    def high_seqnos(self, keyspace: str) -> Timestamp:
        """Every partition's current (high seqno, uuid), gathered by a data node from the
        owners: what session consistency waits for."""
        reply = self.rpc.run(self._keyspace_wide(HighSeqnos(keyspace=keyspace), HighSeqnosReply))
        return Timestamp.from_wire(reply.entries)

    def keyspace_stats(self, keyspace: str) -> KeyspaceStatsResult:
        """Per partition: owner node, live document count, high seqno, uuid."""
        msg = KeyspaceStats(keyspace=keyspace)
        return stats_from(
            keyspace, self.rpc.run(self._keyspace_wide(msg, KeyspaceStatsReply)).partitions
        )

    # -- index scans (``shardex.client.scan``) --

    def scan(
        self,
        keyspace: str,
        index: str,
        spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        consistency: str = "not_bounded",
        at: Any = None,
        limit: int | None = None,
        offset: int | None = None,
        ordered: bool = True,
        covering: bool = True,
        *,
        stability: str | None = None,
        timeout: float = DEFAULT_SCAN_TIMEOUT,
    ) -> ScanResult:
        """Scan an index: an iterator of ``{"docid", "key"}`` rows (``key`` only with
        ``covering``). ``spans``: ``[{"low": [...], "high": [...], "inclusion": "both" |
        "low" | "high" | "neither"}]`` in index order (None: everything). ``consistency``:
        not_bounded, request_plus (every write acknowledged before the call), at_plus (``at``:
        the writes' MutationResults or a Timestamp). ``stability``: none, scan (default for
        request_plus / at_plus); ``query_context()`` for query stability. ``timeout``: how
        long the index may take to catch up (SCAN_TIMEOUT after)."""
        return open_scan(
            self._scans,
            keyspace,
            index,
            spans,
            consistency,
            at,
            limit,
            offset,
            ordered,
            covering,
            stability=stability,
            timeout=timeout,
        )

    def scan_page(
        self,
        keyspace: str,
        index: str,
        spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        consistency: str = "not_bounded",
        page_size: int = 100,
        continuation: str | None = None,
        *,
        at: Any = None,
        stability: str | None = None,
        ordered: bool = False,
        timeout: float = DEFAULT_SCAN_TIMEOUT,
    ) -> ScanPage:
        """One page (at most ``page_size`` rows) of a paginated scan that loses and doubles
        nothing while partitions migrate; pass the returned ``continuation`` for the next
        page (None: done). ``index="#primary"`` scans the documents (spans bound the docid).
        ``ordered``: rows in key order across shards. request_plus / at_plus pin one
        stability TS for every page (``shardex.client.scan_page``)."""
        msg = build_page_request(
            keyspace,
            index,
            spans,
            consistency,
            page_size,
            continuation,
            at=at,
            stability=stability,
            ordered=ordered,
            timeout=timeout,
        )
        return scan_page(self.rpc, msg)

    def query(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        consistency: str = "request_plus",
        *,
        at: Any = None,
        timeout: float = 120.0,
        memory_quota: int | None = None,
        spill: bool = True,
        window: int | None = None,
        tuning: Mapping[str, bool] | None = None,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> QueryRows:
        """Run one SQL++ statement (``shardex.client.query``): an iterator of rows (dicts)
        with ``metrics`` once exhausted. ``params``: a list for $1, $2 or a mapping for
        $name. ``consistency``: request_plus (default), not_bounded, at_plus (with ``at``).
        ``durability``: of every document a DML statement writes (as ``Keyspace.upsert``);
        ``durability_timeout``: how long each of those writes waits for its copies at a
        majority level (as ``Keyspace.upsert``'s; None: the node's default).
        ``memory_quota``: bytes the statement may hold on each node (None: the node's
        ``sql_query_memory``, also the most it may ask for); past it sorts and aggregations
        spill to disk, or with ``spill=False`` fail with QUERY_MEMORY_LIMIT."""
        return run_query(
            self._scans,
            self.execute_ddl,
            sql,
            params,
            consistency,
            at=at,
            timeout=timeout,
            memory_quota=memory_quota,
            spill=spill,
            window=window,
            tuning=tuning,
            durability=durability,
            durability_timeout=durability_timeout,
        )

    def query_context(self) -> QueryContext:
        """Scans through the context share one stability TS per keyspace (query stability)."""
        return QueryContext(self._scans)

    async def _keyspace_wide(self, msg: HighSeqnos | KeyspaceStats, expect: type[M]) -> M:
        """Ask a data node (an owner of the keyspace, the first that answers) for a
        keyspace-wide answer it gathers from the others; the control node may not run the
        data service."""
        router = self.rpc.router
        _, topology = await router.keyspace(msg.keyspace)  # KEYSPACE_NOT_FOUND
        last: ShardexError | None = None
        for node in topology.nodes():
            try:
                return await router.to_node(node, msg, expect)
            except RETRYABLE as exc:
                last = exc
        assert last is not None
        raise last


def _request_id() -> str:
    return uuid.uuid4().hex


def connect(
    address: str | Sequence[str],
    *,
    secret: str | None = None,
    username: str | None = None,
    password: str | None = None,
    name: str = "shardex-client",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    direct_scans: bool = True,
    direct_kv: bool = True,
    tls_ca: str | Path | None = None,
    tls: TlsConfig | None = None,
) -> Client:
    """Connect to a node (or the first reachable of several addresses). ``direct_scans``,
    ``direct_kv``: scans, single-document requests run over a socket of the calling thread
    (False: through the client's loop thread, as every other call; for comparisons).

    Credentials: ``username`` and ``password`` log in as that user (a SCRAM exchange: the
    password never leaves this process); ``secret`` is the node secret, for nodes and the
    cluster's own tools.

    ``tls_ca``: the cluster CA's certificate; every connection is then TLS and each node's
    certificate is verified against it and the address dialled. ``tls``: the whole TLS
    setting instead (a node's certificate too, for a process that acts as a node)."""
    addresses = [address] if isinstance(address, str) else list(address)
    if tls is None and tls_ca is not None:
        tls = TlsConfig(ca=Path(tls_ca))
    client = Client(
        addresses,
        _credentials(secret, username, password),
        name=name,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
        transport=TcpTransport(tls=tls) if tls is not None else None,
        direct_scans=direct_scans,
        direct_kv=direct_kv,
    )
    try:
        client.rpc.connect()
        client._scans.preconnect()
    except BaseException:
        client.close()
        raise
    return client


def _credentials(secret: str | None, username: str | None, password: str | None) -> Credentials:
    if username is not None or password is not None:
        if secret is not None:
            raise ConfigError(
                "give either username and password or the node secret, not both",
                details={"hint": "users log in with username= and password="},
            )
        return UserLogin(username or "", password or "")
    if secret is None:
        raise ConfigError(
            "no credentials given",
            details={"hint": "connect(address, username='...', password='...')"},
        )
    return NodeSecret(secret)


def connect_local(
    cluster_dir: str | Path,
    *,
    name: str = "shardex-client",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    direct_scans: bool = True,
    direct_kv: bool = True,
    as_node: bool = False,
) -> Client:
    """Connect to the local cluster in ``cluster_dir`` (made by ``shardex cluster start``)
    as its ``admin`` user (the password in the directory's ``admin-password``; the node
    secret for a directory made before users existed): reads cluster.json, connects to the
    first live node, then the next; a cluster with TLS is verified with the directory's CA
    certificate. ``as_node``: authenticate with the node secret instead, as the cluster's own
    processes do (the pipeline driver sends internal messages no user may send)."""
    from shardex.meta import cluster_dir as cdir

    path = Path(cluster_dir)
    spec = cdir.load(path)
    password = None if as_node else cdir.read_admin_password(path, spec)
    return connect(
        [n.address for n in spec.nodes],
        secret=cdir.read_secret(path, spec) if password is None else None,
        username=None if password is None else cdir.ADMIN_USER,
        password=password,
        tls_ca=cdir.tls_ca(path, spec),
        name=name,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
        direct_scans=direct_scans,
        direct_kv=direct_kv,
    )

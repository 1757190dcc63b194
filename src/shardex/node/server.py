"""The services of one node behind one RPC server, independent of processes and files.

``Node`` takes a ``Transport`` and a ``MemberStore``, so the very same object runs inside a
``shardex node`` process (TCP, files in the data dir; see ``shardex.node.process``) and inside
the simulator (SimTransport, in-memory store, virtual time).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from shardex import __version__
from shardex.api.node import MetricsSample, MetricsSampleRequest, StatusReply, StatusRequest
from shardex.api.scan_streams import OutStreams
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.auto_failover import AutoFailover, AutoFailoverSettings
from shardex.manager.coordinator import Coordinator, CoordinatorTiming
from shardex.manager.failover import register_failover_ops
from shardex.manager.index_ddl import IndexDDL, register_index_ddl
from shardex.manager.keyspace_replicas import register_keyspace_replica_ops
from shardex.manager.keyspaces import register_keyspace_ops
from shardex.manager.membership import Membership, MemberStore
from shardex.manager.rebalance import Rebalancer
from shardex.manager.timekeeper import Timekeeper
from shardex.manager.users import register_user_ops
from shardex.meta.node_defaults import DEFAULT_EXPIRY_PAGER_BATCH, DEFAULT_EXPIRY_PAGER_INTERVAL
from shardex.meta.state import MemoryStateStore, StateStore
from shardex.meta.users import UserRecord
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.credentials import UserDirectory
from shardex.net.messages import Message
from shardex.net.tls import TlsConfig
from shardex.net.transport import Transport, split_address
from shardex.node.audit import AUDIT_FILE, AuditLog
from shardex.node.metrics import NodeMetrics
from shardex.node.users import RemoteUsers, StateUsers
from shardex.runtime.admission import DEFAULT_QUEUED
from shardex.scan.coordinator import ScanCoordinator
from shardex.scan.elastic_adapters_index import IndexScanMigrations
from shardex.scan.paging_store_proxy import PagingService
from shardex.sql.exec.memory import DEFAULT_QUERY_MEMORY, NodeMemory

if TYPE_CHECKING:
    from shardex.data.service import DataService
    from shardex.index.engine_host import SliceEngine
    from shardex.index.scan_server import IndexScanServer
    from shardex.index.service import IndexService
    from shardex.node.http.server import HttpServer

log = logging.getLogger(__name__)

# How long a keyspace create or drop sent over HTTP from a node without a coordinator waits
# for the manager's answer (a create returns once every chain's copies are open).
REST_OP_TIMEOUT = 120.0


class Node:
    """One node: RPC server + membership + status. Services (data, index, ...) plug in here
    as later issues add them."""

    def __init__(
        self,
        *,
        transport: Transport,
        secret: str,
        name: str,
        member_id: str,
        address: str,
        services: Iterable[str],
        advertise: str | None = None,
        store: MemberStore,
        seeds: Iterable[str] = (),
        heartbeat_interval: float = 0.5,
        failure_timeout: float = 3.0,
        http_port: int | None = None,
        data_dir: Path | None = None,
        state_store: StateStore | None = None,
        id_factory: Callable[[], str] | None = None,
        index_engine: Callable[[], SliceEngine] | None = None,
        auto_failover: AutoFailoverSettings | None = None,
        group: str = "",
        users: UserDirectory | None = None,
        bootstrap_admin: UserRecord | None = None,
        sql_max_running: int | None = None,
        sql_max_queued: int = DEFAULT_QUEUED,
        sql_max_fragments: int | None = None,
        max_connections: int | None = None,
        sql_query_memory: int = DEFAULT_QUERY_MEMORY,
        sql_node_memory: int | None = None,
        sql_spill: bool = True,
        tls: TlsConfig | None = None,
        expiry_pager: tuple[float, int] = (
            DEFAULT_EXPIRY_PAGER_INTERVAL,
            DEFAULT_EXPIRY_PAGER_BATCH,
        ),
    ) -> None:
        self.transport = transport
        self.group = group
        self.name = name
        self.member_id = member_id
        self.bind_address = address
        # The host others dial (membership, joins, topology, client routing); None: the
        # bound host. Its port is always the bound one (port 0 is only known once bound).
        self._advertise_host = advertise
        self.services = tuple(services)
        # The HTTP services' port (None: none served; 0: a free one, known once bound) and
        # their TLS (the node's certificate: HTTPS when the node runs TLS).
        self.http_port = http_port
        self._tls = tls
        self.http: HttpServer | None = None
        self._peer_http: dict[tuple[str, str], int] = {}  # (member id, address) -> HTTP port
        self._secret = secret
        self._store = store
        self._seeds = tuple(seeds)
        self._heartbeat_interval = heartbeat_interval
        self._failure_timeout = failure_timeout
        # Nodes prove the node secret; users log in against ``users`` and may send what
        # their roles allow (``shardex.api.privileges``), checked before any handler runs.
        # Logins are checked against the committed users: a manager node's own replica, any
        # other node's copy refreshed from the managers (``node/users.py``).
        self._remote_users: RemoteUsers | None = None
        if users is None and "manager" in self.services:
            users = StateUsers(lambda: self.coordinator)
        elif users is None:
            self._remote_users = users = RemoteUsers(
                ConnectionPool(transport, secret, name=f"{name}/users"),
                lambda: self.membership.members if self.membership else [],
            )
        self._users = users
        self.audit = AuditLog(Path(data_dir) / AUDIT_FILE if data_dir is not None else None)
        self.server = RpcServer(
            transport,
            secret,
            name=name,
            users=users,
            authorizer=self.audit.authorize,
            on_login=self.audit.on_login,
            max_connections=max_connections,  # users' only: nodes always get through
        )
        self.server.route(StatusRequest, self._on_status)
        self.server.route(MetricsSampleRequest, self._on_metrics_sample)
        self.membership: Membership | None = None
        # The manager service's replicated coordinator. Built here, before start, so other
        # services can register their ops on it; routed and started with membership.
        self.coordinator: Coordinator | None = None
        if "manager" in self.services:
            self.coordinator = Coordinator(
                transport=transport,
                secret=secret,
                name=name,
                store=state_store if state_store is not None else MemoryStateStore(),
                timing=CoordinatorTiming.for_membership(heartbeat_interval, failure_timeout),
                id_factory=id_factory,
            )
        self._started_loop_time = 0.0
        self._started_wall = 0.0
        # Prometheus metrics (``GET /metrics`` on the HTTP port): read at scrape time.
        self.metrics = NodeMetrics(self)
        # The data service needs a directory (RocksDB); without one (simulations) it is off.
        self.data: DataService | None = None
        if "data" in self.services and data_dir is not None:
            from shardex.data.service import DataService  # RocksDB: not for StatusRequest users

            self.data = DataService(
                data_dir=data_dir,
                node_name=name,
                transport=transport,
                secret=secret,
                coordinator=lambda: self.coordinator,
                members=lambda: self.membership.members if self.membership else [],
                lease=self._serving_lease,
                expiry_pager_interval=expiry_pager[0],
                expiry_pager_batch=expiry_pager[1],
            )
            self.data.install(self.server)
        # The index service: the indexer's slices in <data-dir>/index, or in the engine
        # ``index_engine`` makes (simulations: in memory, inline I/O).
        self.index: IndexService | None = None
        if "index" in self.services and (data_dir is not None or index_engine is not None):
            from shardex.index.service import IndexService

            self.index = IndexService(
                node_name=name,
                transport=transport,
                secret=secret,
                path=Path(data_dir) / "index" if data_dir is not None else None,
                engine_factory=index_engine,
                inline_io=index_engine is not None,
                coordinator=lambda: self.coordinator,
                members=lambda: self.membership.members if self.membership else [],
                scan_migrations=IndexScanMigrations(name),
            )
            self.index.install(self.server)
        # Index scans: the coordinator on every node, the slice reader on indexers; one
        # registry of outgoing block streams for both (``shardex.scan``).
        self.scan_streams = OutStreams()
        self.scan_streams.install(self.server.router)
        self.scan = ScanCoordinator(
            transport=transport,
            secret=secret,
            name=name,
            coordinator=lambda: self.coordinator,
            members=lambda: self.membership.members if self.membership else [],
            streams=self.scan_streams,
        )
        self.scan.install(self.server)
        if self.data is not None:  # request_plus reads this node's high seqnos in-process
            self.scan.view.local_seqnos = self.data.local_high_seqnos
        self.index_scan: IndexScanServer | None = None
        if self.index is not None:
            from shardex.index.scan_server import IndexScanServer

            self.index_scan = IndexScanServer(
                self.index.host,
                self.scan_streams,
                check_serving=self.index.slice_moves.check_serving,
            )
            self.index_scan.install(self.server)
            self.scan.local_index = self.index_scan  # own slices read in-process
            if self.data is not None:  # request_plus high seqnos ride in ScanSlices
                self.index_scan.local_seqnos = self.data.local_high_seqnos
        # Paginated scans under elasticity: the proxy on every node, shard batches on data and
        # index nodes (``shardex.scan.paging_store_proxy``).
        self.paging = PagingService(
            name=name,
            secret=secret,
            transport=transport,
            scan=self.scan,
            data=self.data,
            index=self.index,
        )
        self.paging.install(self.server)
        # SQL: the execution protocol and the client-facing statement service.
        from shardex.sql.exec.mount import SqlMount

        self.sql = SqlMount(
            name=name,
            member_id=member_id,
            transport=transport,
            secret=secret,
            membership=lambda: self.membership,
            scan=self.scan,
            index_scan=self.index_scan,
            scan_streams=self.scan_streams,
            max_running=sql_max_running,
            max_queued=sql_max_queued,
            max_fragments=sql_max_fragments,
            memory=NodeMemory(
                sql_node_memory,
                query_max=sql_query_memory,
                data_dir=Path(data_dir) if data_dir is not None else None,
                spill=sql_spill,
            ),
        )
        if self.data is not None:  # SQL reads this node's own documents in-process
            self.sql.documents.local_get_many = self.data.get_many_local
            self.sql.documents.local_get_many_now = self.data.get_many_now
        self.sql.install(self.server)
        self.index_ddl: IndexDDL | None = None
        # The timekeeper (end of each pipeline micro-batch): on every manager node, reading
        # its local replica of the state.
        self.timekeeper: Timekeeper | None = None
        if self.coordinator is not None:
            register_keyspace_ops(self.coordinator)
            register_keyspace_replica_ops(self.coordinator)
            register_user_ops(self.coordinator, bootstrap_admin)
            self.index_ddl = register_index_ddl(self.coordinator)
            Rebalancer(self.coordinator).register()
            register_failover_ops(self.coordinator)
            # Off unless given (simulations and in-process tests fail nothing over by
            # themselves); a node process passes its config's settings, on by default.
            AutoFailover(
                self.coordinator, auto_failover or AutoFailoverSettings(enabled=False)
            ).register()
            self.timekeeper = Timekeeper(
                transport=transport,
                secret=secret,
                name=name,
                coordinator=lambda: self.coordinator,
                membership=lambda: self.membership,
            )
            self.timekeeper.install(self.server)

    @property
    def address(self) -> str:
        """The address announced to the cluster: the advertised host and the bound port
        (differs from ``bind_address`` for port 0 or a separate advertised host)."""
        return self.membership.me.address if self.membership else self.bind_address

    def _serving_lease(self) -> bool:
        """The data service serves replicated copies only while a majority of managers hear
        this node (``Membership.majority_heard``)."""
        return self.membership is None or self.membership.majority_heard(self._failure_timeout)

    async def start(self) -> None:
        self._started_loop_time = asyncio.get_running_loop().time()
        self._started_wall = time.time()
        if self.data is not None:
            await self.data.start()  # the engine is open before the first request arrives
        if self.index is not None:
            await self.index.start()
        await self.server.start(self.bind_address)
        actual = self.server.address or self.bind_address
        if self._advertise_host is not None:
            actual = f"{self._advertise_host}:{split_address(actual)[1]}"
        # Membership needs the real address (port 0 is only resolved by binding), so its
        # routes go in right after the bind; a peer that arrives in between gets
        # UNKNOWN_MESSAGE once and retries on its next heartbeat.
        self.membership = Membership(
            transport=self.transport,
            secret=self._secret,
            member_id=self.member_id,
            name=self.name,
            address=actual,
            services=self.services,
            seeds=self._seeds,
            heartbeat_interval=self._heartbeat_interval,
            failure_timeout=self._failure_timeout,
            store=self._store,
            group=self.group,
        )
        self.membership.install(self.server)
        if self.coordinator is not None:
            self.coordinator.install(self.server)
        await self.membership.start()
        if self.coordinator is not None:
            await self.coordinator.start(self.membership)
        await self.sql.start()
        if self._remote_users is not None and self.data is not None:
            self._remote_users.start()  # a real node: users known before the first login
        if self.http_port is not None:
            await self._start_http(self.http_port)
        log.info(
            "node %s (%s) listening on %s, services %s, %s",
            self.name,
            self.member_id,
            actual,
            ",".join(self.services),
            f"joining through {', '.join(self._seeds)}" if self._seeds else "founding/resuming",
        )

    async def _start_http(self, port: int) -> None:
        """The N1QL query service on the node's own host (the RPC listener's)."""
        from shardex.node.http.cluster_charts import ClusterCharts
        from shardex.node.http.cluster_rest import ClusterRest, slices_through
        from shardex.node.http.server import HttpServer

        # The loop-lag timer only where the metrics are served: a simulated node (no
        # HTTP) gets no extra timer in its virtual time.
        self.metrics.start()
        self.http = HttpServer(
            sql=self.sql.sql,
            users=self._users,
            authorize=self.audit.authorize,
            node_name=self.name,
            tls=self._tls,
            on_login=self.audit.on_login,
            max_connections=self.server.max_connections or 1000,
            metrics=self.metrics.exposition,
            charts=ClusterCharts(self.metrics.sample, self._peers, self.scan.view.pool.request),
            address=lambda: self.address,
            rest=ClusterRest(
                members=lambda: self.membership.view() if self.membership else None,
                state=self.scan.view.state,
                authorize=self.audit.authorize,
                submit=self._submit_op,
                slices=slices_through(self.scan.view.pool, self.scan.view.address),
                high_seqnos=self.scan.view.high_seqnos_wire,
                http_ports=self._http_ports,
            ),
        )
        await self.http.start(split_address(self.bind_address)[0], port)
        self.http_port = self.http.port

    def _peers(self) -> list[tuple[str, str]]:
        """The other members (name, RPC address), for the console's cluster-wide charts."""
        members = self.membership.members if self.membership is not None else []
        return [(m.name, m.address) for m in members if m.member_id != self.member_id]

    async def _http_ports(self, members: list[tuple[str, str]]) -> dict[str, int]:
        """member id -> HTTP port of each (member id, RPC address): this node's own, the
        others' from their status (asked at once, 2 s bound), remembered per member id and
        address: a node's HTTP port is its config's, which a restart keeps (one that
        restarts on another port is listed at the old one until this node restarts)."""
        out: dict[str, int] = {}
        ask: list[tuple[str, str]] = []
        for member_id, address in members:
            if member_id == self.member_id:
                if self.http_port:
                    out[member_id] = self.http_port
            elif (port := self._peer_http.get((member_id, address))) is not None:
                out[member_id] = port
            else:
                ask.append((member_id, address))

        async def status(address: str) -> StatusReply:
            return await self.scan.view.pool.request(
                address, StatusRequest(), 2.0, expect=StatusReply
            )

        replies = await asyncio.gather(*(status(a) for _, a in ask), return_exceptions=True)
        for (member_id, address), reply in zip(ask, replies, strict=True):
            if isinstance(reply, StatusReply) and reply.http_port:
                out[member_id] = self._peer_http[(member_id, address)] = reply.http_port
        return out

    async def _on_metrics_sample(
        self, msg: MetricsSampleRequest, conn: Connection
    ) -> MetricsSample:
        return self.metrics.sample()

    async def _submit_op(self, msg: Message) -> Message:
        """A coordinator op sent over HTTP: to this node's coordinator (which runs it on the
        master wherever it is), else to the managers in turn as the client's RPC does."""
        if self.coordinator is not None:
            return await self.coordinator.submit(msg)
        members = self.membership.members if self.membership is not None else []
        managers = [m for m in members if "manager" in m.services]
        failure: ShardexError | None = None
        for m in managers:
            try:
                return await self.scan.view.pool.request(m.address, msg, REST_OP_TIMEOUT)
            except ShardexError as e:
                if e.code not in (ErrorCode.NODE_UNAVAILABLE, ErrorCode.CONNECTION_CLOSED):
                    raise
                failure = e
        raise failure or NodeUnavailable("no manager is known to this node", details={})

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()
        if self.timekeeper is not None:
            await self.timekeeper.stop()
        if self.coordinator is not None:
            await self.coordinator.stop()
        await self.sql.stop()
        # Membership first: no heartbeat may go out from a node that is closing its listener.
        if self.membership is not None:
            await self.membership.stop()
        await self.server.stop()
        await self.scan_streams.close()
        await self.scan.stop()
        await self.paging.stop()
        if self.index_scan is not None:
            await self.index_scan.close()
        if self.index is not None:
            await self.index.stop()
        if self.data is not None:
            await self.data.stop()
        if self._remote_users is not None:
            await self._remote_users.stop()
        await self.metrics.stop()
        self.audit.close()
        log.info("node %s stopped", self.name)

    async def _on_status(self, msg: StatusRequest, conn: Connection) -> StatusReply:
        m = self.membership
        return StatusReply(
            name=self.name,
            member_id=self.member_id,
            address=self.address,
            services=self.services,
            pid=os.getpid(),
            started_at=self._started_wall,
            uptime=round(asyncio.get_running_loop().time() - self._started_loop_time, 3),
            shardex_version=__version__,
            membership_version=m.version if m else 0,
            joined=bool(m and m.joined.is_set()),
            http_port=self.http_port,
        )

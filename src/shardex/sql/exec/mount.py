"""SQL on a node: the execution protocol (``QueryService``) with the SQL fragments
registered, and the client-facing ``SqlService``. ``Node`` builds one ``SqlMount`` in its
constructor, installs it, starts it after membership and stops it before membership; it
hands in the parts SQL uses (its scan coordinator, the local index scans, the scan streams)
and ``membership``, read when used: the node's membership starts after the mount is built."""

from __future__ import annotations

from collections.abc import Callable

from shardex.api.scan_streams import OutStreams
from shardex.index.scan_server import IndexScanServer
from shardex.manager.membership import Membership
from shardex.net import ConnectionPool, RpcServer
from shardex.net.transport import Transport
from shardex.runtime.admission import DEFAULT_QUEUED, FRAGMENT_SLOTS_PER_CPU, default_cap
from shardex.scan.coordinator import ScanCoordinator
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragments import sql_fragments
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.service import SqlService
from shardex.sql.exec.tuning import BoundedMeter
from shardex.sql.protocol import MembershipDirectory, ProtocolConfig, QueryService

__all__ = ["SqlMount"]


class SqlMount:
    def __init__(
        self,
        *,
        name: str,
        member_id: str,
        transport: Transport,
        secret: str,
        membership: Callable[[], Membership | None],
        scan: ScanCoordinator,
        index_scan: IndexScanServer | None,
        scan_streams: OutStreams,
        max_running: int | None = None,
        max_queued: int = DEFAULT_QUEUED,
        max_fragments: int | None = None,
        memory: NodeMemory | None = None,
    ) -> None:
        self.member_id = member_id
        # The node's SQL memory and spill directory (decision 0106), shared by the
        # fragments run here and the statements this node initiates.
        self.memory = NodeMemory() if memory is None else memory
        self._membership = membership
        self.pool = ConnectionPool(transport, secret, name=f"{name}/sql-docs")
        self.documents = DocumentAccess(scan.view, self.pool)
        self.query = QueryService(
            member_id=member_id,
            name=name,
            transport=transport,
            secret=secret,
            directory=MembershipDirectory(membership),
            fragments=sql_fragments(index_scan, self.documents, self.memory),
            meter=BoundedMeter(),  # the last queries' exchanges, for ExchangeStats
            config=ProtocolConfig(
                max_executions=(
                    default_cap(FRAGMENT_SLOTS_PER_CPU) if max_fragments is None else max_fragments
                )
            ),
        )
        self.sql = SqlService(
            query=self.query,
            scan=scan,
            documents=self.documents,
            streams=scan_streams,
            members=self._members,
            max_running=max_running,
            max_queued=max_queued,
            memory=self.memory,
        )

    def _members(self) -> dict[str, str]:
        """Node name -> member id of the members the local failure detector holds up."""
        m = self._membership()
        if m is None:
            return {}
        directory = self.query.directory
        return {
            info.name: info.member_id
            for info in m.members
            if info.member_id == self.member_id or not directory.is_down(info.member_id)
        }

    def install(self, server: RpcServer) -> None:
        self.query.install(server)
        self.sql.install(server)

    async def start(self) -> None:
        await self.query.start()

    async def stop(self) -> None:
        await self.query.stop()
        await self.pool.close()
        self.memory.close()

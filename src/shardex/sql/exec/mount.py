"""SQL on a node: the execution protocol (``QueryService``) with the SQL fragments
registered, and the client-facing ``SqlService``. ``Node`` builds one ``SqlMount`` in its
constructor, installs it, starts it after membership and stops it before membership."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardex.net import ConnectionPool, RpcServer
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragments import sql_fragments
from shardex.sql.exec.service import SqlService
from shardex.sql.exec.tuning import BoundedMeter
from shardex.sql.protocol import MembershipDirectory, QueryService

if TYPE_CHECKING:
    from shardex.node.server import Node

__all__ = ["SqlMount"]


class SqlMount:
    def __init__(self, node: Node, secret: str) -> None:
        self.node = node
        self.pool = ConnectionPool(node.transport, secret, name=f"{node.name}/sql-docs")
        self.documents = DocumentAccess(node.scan.view, self.pool)
        self.query = QueryService(
            member_id=node.member_id,
            name=node.name,
            transport=node.transport,
            secret=secret,
            directory=MembershipDirectory(lambda: node.membership),
            fragments=sql_fragments(node.index_scan, self.documents),
            meter=BoundedMeter(),  # the last queries' exchanges, for ExchangeStats
        )
        self.sql = SqlService(
            query=self.query,
            scan=node.scan,
            documents=self.documents,
            streams=node.scan_streams,
            members=self._members,
        )

    def _members(self) -> dict[str, str]:
        """Node name -> member id of the members the local failure detector holds up."""
        m = self.node.membership
        if m is None:
            return {}
        directory = self.query.directory
        return {
            info.name: info.member_id
            for info in m.members
            if info.member_id == self.node.member_id or not directory.is_down(info.member_id)
        }

    def install(self, server: RpcServer) -> None:
        self.query.install(server)
        self.sql.install(server)

    async def start(self) -> None:
        await self.query.start()

    async def stop(self) -> None:
        await self.query.stop()
        await self.pool.close()

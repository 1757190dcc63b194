"""A server's limit on users' connections (``max_connections``), over loopback TCP: one
more user's connection is told TOO_MANY_CONNECTIONS and closed, nodes' connections are never
refused, and a closed connection frees its place."""

from __future__ import annotations

import asyncio

import pytest

from shardex.api.privileges import authorize
from shardex.errors import ErrorCode
from shardex.net import Connection, RpcServer, TcpTransport, connect
from shardex.net.credentials import UserLogin, make_credential
from tests.integration.node.user_fixtures import FAST, Users

pytestmark = pytest.mark.timeout(60)

SECRET = "connection-limit-node-secret"


async def user(address: str, name: str) -> Connection:
    return await connect(TcpTransport(), address, UserLogin("ann", "pw"), name=name)


async def test_a_user_past_the_limit_is_told_why_and_nodes_always_get_in() -> None:
    users = Users(make_credential("ann", "pw", ("admin",), salt=b"s" * 16, params=FAST))
    server = RpcServer(
        TcpTransport(), SECRET, name="n1", users=users, authorizer=authorize, max_connections=2
    )
    address = await server.start("127.0.0.1:0")
    opened: list[Connection] = []
    try:
        opened += [await user(address, "a"), await user(address, "b")]
        for conn in opened:
            await conn.ping(10)
        refused = await user(address, "c")  # it authenticates, then hears why and is closed
        opened.append(refused)
        await asyncio.wait_for(refused.wait_closed(), 30)
        reason = refused.close_reason
        assert reason is not None and reason.details["notice"] == ErrorCode.TOO_MANY_CONNECTIONS
        assert "2 user connections open" in reason.message and "max_connections" in reason.message
        assert server.refused_connections == 1
        # Nodes are not counted and never refused: the cluster's own traffic gets through.
        for i in range(3):
            node = await connect(TcpTransport(), address, SECRET, name=f"node{i}")
            opened.append(node)
            await node.ping(10)
        # A user's closed connection gives its place back.
        await opened[0].close()
        deadline = asyncio.get_running_loop().time() + 30
        while sum(not c.principal.is_node for c in server.connections if c.principal) > 1:
            assert asyncio.get_running_loop().time() < deadline, "the closed one still counts"
            await asyncio.sleep(0.01)
        again = await user(address, "d")
        opened.append(again)
        await again.ping(10)
        assert not again.closed and server.refused_connections == 1
    finally:
        for conn in opened:
            await conn.close()
        await server.stop()

"""What a user's connection may send, over a real RpcServer on loopback TCP: every message
type not in the user table is refused with AUTH_FAILED before its handler runs (request or
one-way), every type in it reaches its handler, a node may send anything, and no message
type is left unclassified."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from shardex.api.privileges import INTERNAL_MESSAGES, USER_MESSAGES, authorize
from shardex.errors import AuthFailed
from shardex.net import Connection, RpcServer, TcpTransport, connect
from shardex.net.credentials import UserLogin, make_credential
from shardex.net.messages import Message, message_type_name
from tests.integration.node.message_samples import all_messages, sample
from tests.integration.node.user_fixtures import FAST, Users

pytestmark = pytest.mark.timeout(60)

SECRET = "user-authorization-node-secret"
MARKER = "data.StreamCredit"  # a user-callable one-way: ordered after the ones refused


@dataclass
class World:
    server: RpcServer
    address: str
    handled: list[str] = field(default_factory=list)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    messages = all_messages()
    users = Users(make_credential("root", "pw", ("admin",), salt=b"s" * 16, params=FAST))
    server = RpcServer(TcpTransport(), SECRET, name="n1", users=users, authorizer=authorize)
    w = World(server, "")

    async def record(msg: Message, conn: Connection) -> None:
        w.handled.append(message_type_name(msg))

    for cls in messages.values():
        server.route(cls, record)
    w.address = await server.start("127.0.0.1:0")
    yield w
    await server.stop()


def test_every_message_type_is_classified_once() -> None:
    tags = set(all_messages())
    assert not set(USER_MESSAGES) & INTERNAL_MESSAGES
    unclassified = tags - set(USER_MESSAGES) - INTERNAL_MESSAGES
    assert not unclassified, f"say in shardex/api/privileges.py who may send {unclassified}"
    assert not (set(USER_MESSAGES) | INTERNAL_MESSAGES) - tags, "stale tags in the tables"


async def test_internal_messages_are_refused_to_a_user_before_any_handler(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shardex.net.connection")
    messages = all_messages()
    internal = sorted(t for t in messages if t not in USER_MESSAGES)
    assert "StateReplicate" in internal and "JoinRequest" in internal
    conn = await connect(TcpTransport(), world.address, UserLogin("root", "pw"), name="root")
    try:
        for tag in internal:
            with pytest.raises(AuthFailed) as info:
                await conn.request(sample(messages[tag]), 10)
            assert info.value.details["type"] == tag
            assert info.value.details["privilege"] == "node"
            assert tag in info.value.message
        # One-way: refused too, and nothing queued behind the marker ran before it.
        for tag in internal:
            await conn.send(sample(messages[tag]))
        await conn.send(sample(messages[MARKER]))
        deadline = asyncio.get_running_loop().time() + 20
        while MARKER not in world.handled:
            assert asyncio.get_running_loop().time() < deadline, "marker never handled"
            await asyncio.sleep(0.01)
        assert world.handled == [MARKER]
        world.handled.clear()
        # The connection kept serving through every refusal.
        await conn.request(sample(messages["StatusRequest"]), 10)
    finally:
        await conn.close()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert world.handled == ["StatusRequest"]
    assert len(refusals) == 2 * len(internal)
    assert all("user root" in r and conn.local_address in r for r in refusals)


async def test_user_callable_messages_reach_their_handlers_for_an_admin(world: World) -> None:
    messages = all_messages()
    conn = await connect(TcpTransport(), world.address, UserLogin("root", "pw"), name="root")
    try:
        for tag in sorted(USER_MESSAGES):
            await conn.request(sample(messages[tag]), 10)
    finally:
        await conn.close()
    assert sorted(world.handled) == sorted(USER_MESSAGES)


async def test_a_node_may_send_internal_messages(world: World) -> None:
    messages = all_messages()
    conn = await connect(TcpTransport(), world.address, SECRET, name="n2")
    try:
        for tag in ("StateReplicate", "JoinRequest", "data.ReplicaApply"):
            await conn.request(sample(messages[tag]), 10)
    finally:
        await conn.close()
    assert world.handled == ["StateReplicate", "JoinRequest", "data.ReplicaApply"]


async def test_without_an_authorizer_a_user_may_send_nothing() -> None:
    users = Users(make_credential("root", "pw", ("admin",), salt=b"s" * 16, params=FAST))
    server = RpcServer(TcpTransport(), SECRET, name="n1", users=users)
    handled: list[Message] = []

    async def record(msg: Message, conn: Connection) -> None:
        handled.append(msg)

    get_cls = all_messages()["data.Get"]
    server.route(get_cls, record)
    address = await server.start("127.0.0.1:0")
    conn = await connect(TcpTransport(), address, UserLogin("root", "pw"), name="root")
    try:
        with pytest.raises(AuthFailed, match="not allowed on a user's connection"):
            await conn.request(sample(get_cls), 10)
    finally:
        await conn.close()
        await server.stop()
    assert handled == []

"""Users log in to a real node (manager service, loopback TCP, in this process) against its
replica of the committed users: the bootstrap admin, a created user, a wrong password, an
unknown user, a replayed login transcript; and what a user's state read leaves out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.data import Get
from shardex.api.node import StatusRequest
from shardex.api.users import CreateUser, DropUser, ListUsers, RevokeRoles, UserInfo, UserList
from shardex.errors import AuthFailed, ErrorCode, ShardexError
from shardex.meta.member_list import MemoryMemberStore
from shardex.meta.users import new_record
from shardex.net import TcpTransport, connect
from shardex.net.auth import ClientHandshake, client_handshake
from shardex.net.credentials import UserLogin
from shardex.net.messages import Envelope, ErrorReply, Kind, UserSalt, decode_frame, encode_frame
from shardex.node.server import Node
from tests.integration.net.test_net_auth import Recorder
from tests.integration.node.user_fixtures import FAST

pytestmark = pytest.mark.timeout(60)

SECRET = "user-login-node-secret-0123456789"
ADMIN_PW = "admin-pass"


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    n = Node(
        transport=TcpTransport(),
        secret=SECRET,
        name="n1",
        member_id="m-n1",
        address="127.0.0.1:0",
        services=("manager",),
        store=MemoryMemberStore(),
        heartbeat_interval=0.1,
        failure_timeout=0.6,
        bootstrap_admin=new_record("admin", ADMIN_PW, ("admin",), FAST),
    )
    await n.start()
    deadline = asyncio.get_running_loop().time() + 30
    while not (n.coordinator and n.coordinator.is_master and n.coordinator.state.users):
        assert asyncio.get_running_loop().time() < deadline, "no bootstrap admin committed"
        await asyncio.sleep(0.02)
    yield n
    await n.stop()


def _nonce(n: int) -> bytes:
    return b"n" * n


async def _login(node: Node, user: str, password: str) -> None:
    conn = await connect(TcpTransport(), node.address, UserLogin(user, password), name=user)
    await conn.close()


async def test_the_bootstrap_admin_logs_in_and_creates_a_user_who_logs_in(node: Node) -> None:
    admin = await connect(TcpTransport(), node.address, UserLogin("admin", ADMIN_PW), name="a")
    try:
        created = await admin.request(
            CreateUser(user=new_record("ann", "ann-pw", ("data_reader(orders)",), FAST)), 10
        )
        assert created == UserInfo(name="ann", roles=["data_reader(orders)"])
        listed = await admin.request(ListUsers(), 10, expect=UserList)
        assert [u.name for u in listed.users] == ["admin", "ann"]
    finally:
        await admin.close()
    conn = await connect(TcpTransport(), node.address, UserLogin("ann", "ann-pw"), name="ann")
    try:
        (server_side,) = [c for c in node.server.connections if c.peer_name == "ann"]
        assert server_side.principal is not None
        assert (server_side.principal.kind, server_side.principal.roles) == (
            "user",
            ("data_reader(orders)",),
        )
        # A user may read the state, but not the users' keys in it.
        reply = await conn.request(StateRequest(), 10, expect=StateReply)
        assert reply.state.users == {}
    finally:
        await conn.close()
    node_conn = await connect(TcpTransport(), node.address, SECRET, name="n2")
    try:
        reply = await node_conn.request(StateRequest(), 10, expect=StateReply)
        assert sorted(reply.state.users) == ["admin", "ann"]
    finally:
        await node_conn.close()


async def test_a_wrong_password_or_an_unknown_user_fails_and_changes_nothing(node: Node) -> None:
    assert node.coordinator is not None
    before = node.coordinator.state
    with pytest.raises(AuthFailed):
        await _login(node, "admin", "not-the-password")
    with pytest.raises(AuthFailed):
        await _login(node, "nobody", "whatever")
    assert node.coordinator.state == before
    assert not [c for c in node.server.connections if c.peer_name in ("admin", "nobody")]
    await _login(node, "admin", ADMIN_PW)  # still serving logins


async def test_an_unknown_user_gets_a_stable_salt_like_a_real_one(node: Node) -> None:
    async def raw_salt(user: str) -> UserSalt:
        comm = await TcpTransport().connect(node.address, 5)
        try:
            hs = ClientHandshake(
                UserLogin(user, "x"), name=user, peer=comm.peer_address, nonce_source=_nonce
            )
            hello = hs.answer(decode_frame(await comm.read()).body)
            await comm.write(encode_frame(Envelope(Kind.ONEWAY, 0, hello)))
            body = decode_frame(await comm.read()).body
            assert isinstance(body, UserSalt)
            return body
        finally:
            comm.abort()

    a1, a2 = await raw_salt("nobody"), await raw_salt("nobody")
    assert a1 == a2 and len(a1.salt) == 16
    assert (await raw_salt("admin")).salt != a1.salt


async def test_a_replayed_login_transcript_is_refused(node: Node) -> None:
    comm = await TcpTransport().connect(node.address, 5)
    rc = Recorder(comm)
    await client_handshake(rc, UserLogin("admin", ADMIN_PW), name="admin")
    hello, proof = rc.sent
    assert ADMIN_PW.encode() not in hello + proof  # the password never crosses the wire
    comm.abort()

    # Same frames to a fresh connection: the server's new nonce makes the old proof wrong.
    comm2 = await TcpTransport().connect(node.address, 5)
    try:
        decode_frame(await comm2.read())  # a fresh challenge, ignored
        await comm2.write(hello)
        assert isinstance(decode_frame(await comm2.read()).body, UserSalt)
        await comm2.write(proof)
        refusal = decode_frame(await comm2.read())
        assert refusal.kind is Kind.ERROR and isinstance(refusal.body, ErrorReply)
        assert refusal.body.code == "AUTH_FAILED"
    finally:
        comm2.abort()


async def test_revoke_and_drop_apply_to_a_connection_already_open(node: Node) -> None:
    admin = await connect(TcpTransport(), node.address, UserLogin("admin", ADMIN_PW), name="a")
    await admin.request(CreateUser(user=new_record("bob", "bob-pw", ("data_reader(*)",), FAST)))
    bob = await connect(TcpTransport(), node.address, UserLogin("bob", "bob-pw"), name="bob")
    get = Get(keyspace="k", docid="d")
    try:
        with pytest.raises(ShardexError) as info:
            await bob.request(get, 10)  # allowed: this node has no data service to answer
        assert info.value.code is ErrorCode.UNKNOWN_MESSAGE
        await admin.request(RevokeRoles(name="bob", roles=["data_reader(*)"]), 10)
        with pytest.raises(AuthFailed, match=r"data\.read"):
            await bob.request(get, 10)
        await bob.request(StatusRequest(), 10)  # every user may still ask this
        await admin.request(DropUser(name="bob"), 10)
        with pytest.raises(AuthFailed, match="no longer exists"):
            await bob.request(StatusRequest(), 10)
    finally:
        await bob.close()
        await admin.close()


async def test_a_node_without_the_manager_service_checks_logins_from_its_copy(
    node: Node,
) -> None:
    other = Node(
        transport=TcpTransport(),
        secret=SECRET,
        name="n2",
        member_id="m-n2",
        address="127.0.0.1:0",
        services=("index",),
        store=MemoryMemberStore(),
        seeds=[node.address],
        heartbeat_interval=0.1,
        failure_timeout=0.6,
    )
    await other.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # Until it has heard of the manager (membership); its copy of the users may still
        # be empty then: the first login asks the manager at once
        # (``RemoteUsers.lookup_missing``) instead of being refused.
        while not any("manager" in m.services for m in other.membership.members):
            assert loop.time() < deadline, "n2 never heard of the manager"
            await asyncio.sleep(0.02)
        await _login(other, "admin", ADMIN_PW)
        with pytest.raises(AuthFailed):
            await _login(other, "admin", "wrong")
    finally:
        await other.stop()

"""The forged-``StateReplicate`` attack on real nodes: a user's connection to a coordinator
replica sends a master's whole-state push with a huge term, through the real codec over TCP.
It is refused with AUTH_FAILED before the replica's handler runs, the replica's promise and
state are untouched, and it takes the real master's next commit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardex.api.coordinator import StateReplicate
from shardex.api.node import StatusRequest
from shardex.client import connect as client_connect
from shardex.errors import AuthFailed
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import TcpTransport, connect
from shardex.net.credentials import UserLogin, make_credential
from shardex.node.server import Node
from shardex.testing.procs import wait_for
from tests.integration.manager.test_keyspace_replicas_node import Cluster
from tests.integration.node.user_fixtures import FAST, Users

pytestmark = pytest.mark.timeout(120)

SECRET = "keyspace-replicas-node-secret"  # the Cluster helper's


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    # Every node of the helper's cluster knows one user, an admin (the strongest role: even
    # it may not send an internal message).
    users = Users(make_credential("mallory", "pw", ("admin",), salt=b"m" * 16, params=FAST))
    real_init = Node.__init__

    def with_users(self: Node, **kwargs: Any) -> None:
        real_init(self, **kwargs, users=users)

    monkeypatch.setattr(Node, "__init__", with_users)
    c = Cluster(tmp_path, {"node1": "", "node2": "", "node3": ""})
    try:
        yield c
    finally:
        c.stop()


def test_forged_state_replicate_from_a_user_is_refused_and_does_no_harm(
    cluster: Cluster,
) -> None:
    nodes = cluster.nodes

    def master() -> Node | None:
        return next((n for n in nodes if n.coordinator and n.coordinator.is_master), None)

    wait_for(
        lambda: master() is not None and len(master().coordinator.voter_names) == 3,
        60,
        what="voters",
    )
    with client_connect(nodes[0].address, secret=SECRET) as c:
        c.create_keyspace("before", num_partitions=4)
    boss = master()
    assert boss is not None
    replica = next(n for n in nodes if n is not boss)
    assert replica.coordinator is not None
    wait_for(lambda: "before" in replica.coordinator.state.keyspaces, 60, what="replica caught up")
    promised = replica.coordinator._group.replica.promised_epoch
    before = replica.coordinator.state

    forged = StateReplicate(
        epoch=10**9,
        leader="mallory",
        state=StateContext(
            cas=10**9,
            epoch=10**9,
            keyspaces={
                "evil": KeyspaceMeta(name="evil", num_partitions=1, uuid="u", created_cas=1)
            },
        ),
    )

    async def attack() -> None:
        conn = await connect(TcpTransport(), replica.address, UserLogin("mallory", "pw"), name="m")
        try:
            with pytest.raises(AuthFailed) as info:
                await conn.request(forged, 10)
            assert info.value.details["type"] == "StateReplicate"
            await conn.send(forged)  # one-way: refused as well
            await conn.request(StatusRequest(), 10)  # the connection still serves
        finally:
            await conn.close()

    cluster.run(attack())
    assert replica.coordinator._group.replica.promised_epoch == promised
    assert replica.coordinator.state == before

    # The real master's next commit reaches the replica.
    with client_connect(boss.address, secret=SECRET) as c:
        c.create_keyspace("after", num_partitions=4)
    wait_for(
        lambda: "after" in replica.coordinator.state.keyspaces, 60, what="replica took the commit"
    )
    assert "evil" not in replica.coordinator.state.keyspaces
    assert "before" in replica.coordinator.state.keyspaces

"""A 3-node cluster across network namespaces: each node binds and advertises its host's
address, joins through a non-founder, and serves clients dialling from another namespace."""

from __future__ import annotations

import pytest
from node_hosts import NodesOnHosts

pytestmark = pytest.mark.cluster


def test_cluster_forms_on_advertised_addresses(nodes: NodesOnHosts) -> None:
    with nodes.connect() as c:
        status = c.cluster_status()
        # Every member is announced at its host's address, none at loopback or a wildcard.
        assert {m.name: m.address for m in status.members} == dict(
            zip(nodes.names, nodes.addresses, strict=True)
        )
        ks = c.create_keyspace("hosts_smoke", 4, num_replicas=1)
        assert set(ks.assignment.values()) <= set(nodes.names)
        docs = c.keyspace("hosts_smoke")
        for i in range(20):
            docs.upsert(f"d{i}", {"n": i}, durability="majority")
        assert [docs.get(f"d{i}")["n"] for i in range(20)] == list(range(20))

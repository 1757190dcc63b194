"""A 3-node cluster across network namespaces: each node advertises its host's address (the
founder binds 0.0.0.0), the third joins through the second (not the founder), and clients
dial them from another namespace."""

from __future__ import annotations

import subprocess

import pytest

from shardex.testing.hosts.netns import PREFIX, remove_leftovers, require_netns
from shardex.testing.hosts.nodes import NodesOnHosts

pytestmark = pytest.mark.cluster


def test_cluster_forms_on_advertised_addresses(nodes: NodesOnHosts) -> None:
    with nodes.connect() as c:
        status = c.cluster_status()
        assert nodes.tls_ca is not None  # the cluster runs over TLS, the client logs in
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


def test_leftovers_of_a_dead_run_are_removed() -> None:
    """What a crashed run left (its pid is in every name) goes at the next run's start."""
    require_netns()
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now names no live process
    ns, bridge = f"{PREFIX}{dead.pid}n1", f"{PREFIX}{dead.pid}b"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    try:
        remove_leftovers()
        assert (
            ns
            not in subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True, check=True
            ).stdout
        )
        shown = subprocess.run(["ip", "link", "show", bridge], capture_output=True, check=False)
        assert shown.returncode != 0  # the bridge is gone
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)

"""Failover across hosts: cutting one host's link (its node runs on, unreachable) fails it
over automatically; nothing acknowledged at durability majority is lost; healing the link
brings it back through recovery and a rebalance. The links carry a netem delay when the
kernel has netem."""

from __future__ import annotations

import subprocess
import warnings

import pytest
from cluster_helpers import wait_for
from data_helpers import Writers, chains_full

from shardex.client import Client
from shardex.testing.hosts.netns import Hosts, NetemUnavailable
from shardex.testing.hosts.nodes import NodesOnHosts

pytestmark = pytest.mark.cluster

KS = "ha"
DOCS = {f"d{i:03}": {"n": i} for i in range(200)}
DELAY_MS = 2


def netem_or_warn(hosts: Hosts) -> bool:
    try:
        for h in hosts.hosts:
            hosts.delay(h.index, DELAY_MS)
    except NetemUnavailable as exc:
        warnings.warn(f"links run without netem delay: {exc}", stacklevel=2)
        return False
    return True


def test_netem_delay_on_every_link(hosts: Hosts) -> None:
    if not netem_or_warn(hosts):
        pytest.skip("the kernel has no netem qdisc (sch_netem)")
    for h in hosts.hosts:
        shown = subprocess.run(
            ["tc", "qdisc", "show", "dev", h.link], capture_output=True, text=True, check=True
        ).stdout
        assert "netem" in shown and f"delay {DELAY_MS}ms" in shown.replace(".0ms", "ms")
        inside = hosts.run(h.index, "tc", "qdisc", "show", "dev", "eth0").stdout
        assert "netem" in inside


def sql_rows(client: Client) -> dict[str, int]:
    keys = ", ".join(f'"{k}"' for k in DOCS)
    rows = client.query(f"SELECT META().id AS id, n FROM {KS} USE KEYS [{keys}]")
    return {r["id"]: r["n"] for r in rows}


def check_docs(client: Client) -> None:
    ks = client.keyspace(KS)
    assert {k: ks.get(k) for k in DOCS} == DOCS
    assert sql_rows(client) == {k: v["n"] for k, v in DOCS.items()}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cut_link_fails_over_and_heal_recovers(hosts: Hosts, nodes: NodesOnHosts) -> None:
    netem_or_warn(hosts)
    victim = 3  # host1 founded the cluster (the coordinator's first master)
    name = nodes.names[victim - 1]
    with nodes.connect("admin") as admin:
        admin.create_keyspace(KS, 8, num_replicas=2)  # a copy on every host
        admin.keyspace(KS).upsert_many(DOCS.items(), durability="majority")
        check_docs(admin)

        def writer(n: str) -> Client:
            return nodes.connect(n, request_timeout=10)

        with Writers(None, KS, 2, 20, connect=writer) as writers:
            wait_for(lambda: writers.acks > 50, 60, what="writers under way")
            hosts.cut(victim)
            wait_for(lambda: name in admin.failed_over(), 60, what=f"{name} failed over")
            floor = writers.acks + 50
            try:
                wait_for(lambda: writers.acks > floor, 60, what="writes after failover")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; writer errors {writers.errors}") from None
            writers.check(admin)
            check_docs(admin)

            hosts.heal(victim)
            wait_for(
                lambda: admin.cluster_status().member(name).state == "up",  # type: ignore[union-attr]
                60,
                what=f"{name} heard again",
            )
            admin.recover(name, "delta")
            admin.rebalance()
            wait_for(lambda: chains_full(admin, KS), 120, what="chains restored")
            writers.check(admin)
        writers.check(admin)
        assert writers.acks > floor
        check_docs(admin)

"""``shardex keyspace``'s replica columns: the configured count, and the shortest chain's
when a failover left it lower."""

from __future__ import annotations

import dataclasses

from shardex.cli.keyspace import describe_created, replicas_cell
from shardex.client import KeyspaceDescription


def desc(num_replicas: int, replicas: dict[int, list[str]]) -> KeyspaceDescription:
    return KeyspaceDescription(
        name="users",
        num_partitions=2,
        uuid="u",
        created_cas=1,
        topology_seq=1,
        assignment={0: "n1", 1: "n2"},
        num_replicas=num_replicas,
        replicas=replicas,
    )


def test_replicas_cell_shows_a_short_chain() -> None:
    assert replicas_cell(desc(0, {})) == "0"
    assert replicas_cell(desc(1, {0: ["n2"], 1: ["n1"]})) == "1"
    assert replicas_cell(desc(2, {0: ["n2", "n3"], 1: ["n1"]})) == "2 (shortest chain: 1)"


def test_created_line_names_nodes_and_replicas() -> None:
    line = describe_created(desc(1, {0: ["n2"], 1: ["n1"]}))
    assert "2 partitions (n1: 1, n2: 1), 1 replica(s) per partition" in line
    assert "replica" not in describe_created(desc(0, {}))
    assert "max_ttl" not in line
    capped = dataclasses.replace(desc(0, {}), max_ttl=3600)
    assert describe_created(capped).endswith(", max_ttl 3600 s")

"""``GET /metrics`` of an index maintained by the pipeline (the session's shared cluster):
the index's items summed over the indexer nodes are the documents written, its pending
mutations and stability lag drain to 0 once a stability TS covers the writes, and a
request_plus scan is timed under its consistency."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cluster_helpers import wait_for
from metrics_http import Samples, scrape, total
from n1ql_http import basic, http_port

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KS = "metered_index"
INDEX = "by_city"
N = 60


def _scrape_all(path: Path) -> list[Samples]:
    auth = basic("admin", (path / "admin-password").read_text().strip())
    return [scrape(http_port(path, i), auth) for i in (1, 2, 3)]


def _index_total(nodes: list[Samples], name: str) -> float:
    return total(nodes, name, index=INDEX, keyspace=KS)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_index_series_follow_the_pipeline(shared_cluster: SharedCluster) -> None:
    path = Path(shared_cluster.path)
    client = shared_cluster.client
    with shared_cluster.keyspace(KS):
        list(client.query(f"CREATE INDEX {INDEX} ON {KS}(city)"))
        client.wait_for_index(KS, INDEX, timeout=240)
        client.keyspace(KS).upsert_many([(f"c{i}", {"city": f"x{i % 7}"}) for i in range(N)])
        scans = "shardex_scan_open_duration_seconds_count"
        before = total(_scrape_all(path), scans, consistency="request_plus")
        rows = client.scan(KS, INDEX, consistency="request_plus", timeout=120)
        assert len(list(rows)) == N
        assert total(_scrape_all(path), scans, consistency="request_plus") == before + 1

        def drained() -> bool:
            nodes = _scrape_all(path)
            lag = "shardex_index_stability_lag_seqnos"
            return (
                _index_total(nodes, "shardex_index_items") == N
                and _index_total(nodes, "shardex_index_pending_mutations") == 0
                # reported (a node runs index and data and was published a TS) and 0
                and any((lag, (("index", INDEX), ("keyspace", KS))) in n for n in nodes)
                and _index_total(nodes, lag) == 0
            )

        wait_for(drained, 120, what="items written, pending mutations and stability lag 0")

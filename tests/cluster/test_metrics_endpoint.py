"""``GET /metrics`` on a real 3-node cluster: each node's Prometheus text parses, needs
cluster.manage, and its series move by exactly the work done (upserts, gets, SQL statements
over HTTP, a scan), summed over the nodes where the client spreads the work by owner.
No index is built (no Spark): the scan is of an index that does not exist, which the scan
coordinator still times under its consistency."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import docids_in, running_cluster
from metrics_http import Samples, scrape, total, value
from n1ql_http import basic, call, http_port, post_json

from shardex.client import Client, connect_local
from shardex.errors import ShardexError

pytestmark = pytest.mark.cluster

KS = "metered"
N_DOCS = 40
N_NONE = 10  # of them written with durability none
N_MANY = 30  # written in batches (MutateMany)
PW = "monitor-password-1"


class Env:
    def __init__(self, cluster: LocalCluster, admin: Client) -> None:
        self.cluster = cluster
        self.admin = admin
        path = Path(cluster.path)
        self.ports = [http_port(path, i) for i in (1, 2, 3)]
        self.auth = basic("admin", (path / "admin-password").read_text().strip())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with (
        running_cluster(tmp_path_factory.mktemp("metrics")) as c,
        connect_local(Path(c.path)) as admin,
    ):
        admin.create_keyspace(KS, 8)
        pw_file = Path(c.path) / "monitor.pw"
        pw_file.write_text(PW + "\n")
        d = ("--dir", str(c.path))
        run_cli(
            "user", "create", "reader", f"data_reader({KS})", *d, "--password-file", str(pw_file)
        )
        yield Env(c, admin)


def scrape_all(env: Env) -> list[Samples]:
    return [scrape(p, env.auth) for p in env.ports]


def test_metrics_need_cluster_manage(env: Env) -> None:
    for auth, status in ((basic("reader", PW), 403), ({}, 401)):
        req = urllib.request.Request(f"http://127.0.0.1:{env.ports[0]}/metrics", headers=auth)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == status


def test_series_move_with_the_work_done(env: Env) -> None:
    ks = env.admin.keyspace(KS)
    before = scrape_all(env)
    for i in range(N_DOCS):  # the client's default durability is persist (persist_active)
        ks.upsert(f"d{i}", {"n": i}, durability="none" if i < N_NONE else "persist")
    ks.upsert_many([(f"m{i}", {"n": i}) for i in range(N_MANY)])  # batches per owner
    for i in range(N_DOCS // 2):
        assert ks.get(f"d{i}") == {"n": i}
    with pytest.raises(ShardexError):
        ks.get("no-such-doc")
    url = f"http://127.0.0.1:{env.ports[1]}/query/service"
    ok = post_json(url, env.auth, {"statement": "SELECT 1 AS one"})
    assert ok.status == 200, ok.body
    bad = post_json(url, env.auth, {"statement": "SELEC nothing"})
    assert bad.status == 400, bad.body
    unknown = post_json(url, env.auth, {"statement": "SELECT 1", "no_such_parameter": 1})
    assert unknown.status == 400 and unknown.codes == [1065], unknown.body
    # over RPC: a key lookup (answered in its loop turn on the owner), a streamed statement
    assert list(env.admin.query(f"SELECT RAW n FROM {KS} USE KEYS $1", ["d1"])) == [1]
    assert len(list(env.admin.query("SELECT x FROM ($1) AS x", [list(range(3000))]))) == 3000
    with pytest.raises(ShardexError):
        env.admin.scan(KS, "no_such_index", consistency="request_plus")
    after = scrape_all(env)

    def moved(name: str, node: int | None = None, **labels: str) -> float:
        if node is not None:
            return value(after[node], name, **labels) - value(before[node], name, **labels)
        return total(after, name, **labels) - total(before, name, **labels)

    # KV: every upsert and get counted once, on its owner; the missing document's get too
    assert moved("shardex_kv_ops_total", op="upsert") == N_DOCS
    assert moved("shardex_kv_op_duration_seconds_count", op="upsert") == N_DOCS
    assert moved("shardex_kv_op_duration_seconds_bucket", op="upsert", le="+Inf") == N_DOCS
    assert moved("shardex_kv_op_duration_seconds_sum", op="upsert") > 0
    assert moved("shardex_kv_write_duration_seconds_count", durability="none") == N_NONE
    persisted = moved("shardex_kv_write_duration_seconds_count", durability="persist_active")
    batches = moved("shardex_kv_ops_total", op="mutate_many")
    assert persisted == N_DOCS - N_NONE + batches  # the batches at the client's default too
    assert moved("shardex_kv_ops_total", op="get") == N_DOCS // 2 + 1
    assert moved("shardex_kv_op_errors_total", op="get") == 1
    assert moved("shardex_kv_op_errors_total", op="upsert") == 0
    assert moved("shardex_kv_ops_total", op="mutate_many") >= 1  # one batch per owner at least
    assert moved("shardex_kv_op_errors_total", op="mutate_many") == 0
    assert total(after, "shardex_keyspace_documents", keyspace=KS) == N_DOCS + N_MANY
    assert total(after, "shardex_keyspace_partitions", keyspace=KS) == 8
    stored = total(after, "shardex_keyspace_disk_bytes", keyspace=KS)
    assert stored + total(after, "shardex_keyspace_memtable_bytes", keyspace=KS) > 0
    # SQL over HTTP on node 2: one success, two errors, on that node (the RPC ones may be too)
    assert moved("shardex_sql_statements_total", 1, outcome="success") == 1
    assert moved("shardex_sql_statements_total", 1, outcome="error") == 2
    assert moved("shardex_sql_statement_duration_seconds_count", 1, outcome="success") == 1
    assert moved("shardex_sql_statements_total", outcome="success") == 3  # and the RPC two
    # the scan, timed under its consistency on the node that coordinated it
    assert moved("shardex_scan_open_duration_seconds_count", consistency="request_plus") == 1
    for node in after:
        assert value(node, "shardex_rpc_connections", peer="node") >= 1
        assert value(node, "shardex_http_connections") >= 1
        assert value(node, "process_resident_memory_bytes") > 0
        assert value(node, "process_cpu_seconds_total") > 0
        assert value(node, "shardex_event_loop_lag_seconds_count") >= 1
        assert value(node, "shardex_sql_statements_running") == 0
        assert ("shardex_rebalance_running", ()) in node  # every node here is a manager
        assert value(node, "shardex_rebalance_running") == 0


def test_a_change_stream_that_is_not_read_falls_behind_by_the_writes_after_it(env: Env) -> None:
    ks_name = "streamed"
    env.admin.create_keyspace(ks_name, 4)
    ks = env.admin.keyspace(ks_name)
    first, later = docids_in(2, 4, 3, "s"), docids_in(2, 4, 5, "t")
    ks.upsert_many([(d, {"d": d}) for d in first])
    # one batch of credit: the node sends the first run, then waits for the client
    with ks.stream(2, follow=True, credit=1):

        def series(name: str) -> float | None:
            nodes = scrape_all(env)
            if total(nodes, "shardex_change_streams_open", keyspace=ks_name) != 1:
                return None
            return total(nodes, name, keyspace=ks_name)

        wait_for(
            lambda: series("shardex_change_stream_lag_seqnos") == 0,
            60,
            what="the stream's first run sent",
        )
        ks.upsert_many([(d, {"d": d}) for d in later])
        wait_for(
            lambda: series("shardex_change_stream_lag_seqnos") == len(later),
            60,
            what="the stream behind by the later writes",
        )
    wait_for(
        lambda: total(scrape_all(env), "shardex_change_streams_open", keyspace=ks_name) == 0,
        60,
        what="the stream closed",
    )


def test_cluster_charts_gather_every_node(env: Env) -> None:
    """``GET /api/charts`` on one node: every node's numbers, each equal to what that node's
    own ``/metrics`` says (no work runs between), and the KV rates of all three nodes, whose
    total is the work done on every owner."""

    def charts(port: int) -> dict[str, Any]:
        answer = call(f"http://127.0.0.1:{port}/api/charts", headers=env.auth)
        assert answer.status == 200, answer.body
        return answer.body

    def kv_of(samples: Samples) -> float:
        return sum(v for (name, _), v in samples.items() if name == "shardex_kv_ops_total")

    first = charts(env.ports[0])
    scraped = scrape_all(env)
    assert first["nodes"] == ["node1", "node2", "node3"] and first["unreachable"] == []
    assert [first["samples"][f"node{i}"]["kv_ops"] for i in (1, 2, 3)] == [
        kv_of(s) for s in scraped
    ]
    ks = env.admin.keyspace(KS)
    keys = [f"c{i}" for i in range(60)]  # on every node's partitions
    ks.upsert_many([(k, {"k": k}) for k in keys])
    for k in keys:
        ks.get(k)
    # the node samples at most every 2 s: the next answer with a point per node has the work
    second, _ = wait_for(
        lambda: (c := charts(env.ports[0]))["charts"]["kv_ops"].get("node1") and c,
        30,
        what="a chart point after the work",
    )
    scraped_after = scrape_all(env)
    grown = [kv_of(a) - kv_of(b) for a, b in zip(scraped_after, scraped, strict=True)]
    assert all(n > 0 for n in grown), grown  # the work reached every node
    assert [second["samples"][f"node{i}"]["kv_ops"] for i in (1, 2, 3)] == [
        kv_of(s) for s in scraped_after
    ]
    # one point per node between the two snapshots: each node's own operations over the
    # one interval, so the rates stand as the work each node answered; the total their sum
    kv = second["charts"]["kv_ops"]
    assert list(kv) == ["node1", "node2", "node3", "total"]
    assert all(len(line) == 1 for line in kv.values()), kv
    rates = [kv[f"node{i}"][0][1] for i in (1, 2, 3)]
    assert kv["total"][0][1] == pytest.approx(sum(rates))
    assert [r / sum(rates) for r in rates] == pytest.approx([g / sum(grown) for g in grown])
    # the other nodes' consoles answer with the same nodes; a reader may not read them
    assert charts(env.ports[2])["nodes"] == ["node1", "node2", "node3"]
    refused = call(f"http://127.0.0.1:{env.ports[1]}/api/charts", headers=basic("reader", PW))
    assert refused.status == 403

"""A local cluster started with ``--tls``: nodes that form the cluster over mutual TLS, and
clients of the directory that verify them with its CA. Documents (over the calling
thread's TLS socket and over the loop's), SQL, a paged primary scan of every document, a
change stream and ``cluster status``; a plaintext client is refused. Index scans over TLS
run in the slow test (they need the pipeline's Spark driver to build an index)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, run_cli
from data_helpers import read_partition, running_cluster

from shardex.client import connect, connect_local
from shardex.errors import AuthFailed
from shardex.meta import cluster_dir as cdir
from shardex.net import TcpTransport
from shardex.net.tls import TlsConfig

pytestmark = pytest.mark.cluster

KS = "people"
DOCS = {f"p{i:03}": {"name": f"n{i}", "age": i % 50, "city": f"c{i % 4}"} for i in range(120)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("tls"), nodes=2, extra=("--tls",)) as c:
        yield c


def test_the_cluster_serves_documents_and_sql_over_tls(cluster: LocalCluster) -> None:
    path = Path(cluster.path)
    assert cdir.tls_ca(path) == (path / "certs" / "ca.pem").absolute()
    with connect_local(path) as client, connect_local(path, direct_kv=False) as loop_client:
        client.create_keyspace(KS, 8, num_replicas=1)
        ks = client.keyspace(KS)
        ks.upsert_many(DOCS.items())
        ks.upsert("extra", {"name": "x", "age": 99})  # the calling thread's TLS socket
        assert ks.get("extra") == {"name": "x", "age": 99}
        assert loop_client.keyspace(KS).get("p007") == DOCS["p007"]  # the loop's
        rows = list(client.query(f"SELECT RAW name FROM {KS} USE KEYS $1", [["p001", "p002"]]))
        assert rows == ["n1", "n2"]
        # Every document, page by page, from both data nodes.
        seen: list[str] = []
        cont = None
        while True:
            page = client.scan_page(KS, "#primary", page_size=50, continuation=cont)
            seen += [r["docid"] for r in page.rows]
            cont = page.continuation
            if cont is None:
                break
        assert sorted(seen) == sorted([*DOCS, "extra"])
        # A partition's change stream, as the pipeline reads it, over TLS.
        _, changes = read_partition(ks, 0)
        assert changes and all(c.docid in DOCS or c.docid == "extra" for c in changes)
        # The nodes talk to each other over mutual TLS: both see each other up.
        status = json.loads(run_cli("cluster", "status", "--dir", str(path), "--json").stdout)
        assert status["up"] == 2
        assert {m["state"] for m in status["membership"]["members"]} == {"up"}


def test_plaintext_and_foreign_clients_are_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    from shardex.net.certs import make_ca

    with pytest.raises(AuthFailed, match="requires TLS"):
        connect(cluster.address(1), secret=cluster.secret(), connect_timeout=5.0)
    make_ca(tmp_path)
    with pytest.raises(AuthFailed, match="cannot verify the certificate"):
        connect(cluster.address(1), secret=cluster.secret(), tls_ca=tmp_path / "ca.pem")


def test_a_client_certificate_names_the_node(cluster: LocalCluster) -> None:
    """A process holding a node's certificate is seen as that node (the hook the
    authentication layer reads); the server's certificate names its node too."""
    from shardex.net import connect as rpc_connect

    path = Path(cluster.path)
    tls = TlsConfig.for_node(path / "certs", "node2")

    async def go() -> tuple[str | None, bool]:
        conn = await rpc_connect(
            TcpTransport(tls=tls), cluster.address(1), cluster.secret(), name="probe"
        )
        try:
            return conn._comm.peer_node, conn._comm.encrypted
        finally:
            await conn.close()

    assert asyncio.run(go()) == ("node1", True)


@pytest.mark.slow
def test_index_scans_over_tls(cluster: LocalCluster) -> None:
    """The pipeline's driver (Spark, local mode) builds an index over TLS; scans read it."""
    path = Path(cluster.path)
    with connect_local(path) as client:
        if KS not in {k.name for k in client.list_keyspaces()}:
            client.create_keyspace(KS, 8, num_replicas=1)
            client.keyspace(KS).upsert_many(DOCS.items())
        client.create_index(KS, "by_city", ["city"])
        # Starts the pipeline driver (the nodes run); `cluster stop` stops it with them.
        run_cli("cluster", "start", "--dir", str(path), timeout=120)
        client.wait_for_index(KS, "by_city", timeout=240)
        rows = list(client.scan(KS, "by_city", [{"low": ["c1"], "high": ["c1"]}]))
        want = sorted(k for k, d in DOCS.items() if d["city"] == "c1")
        assert sorted(r["docid"] for r in rows) == want

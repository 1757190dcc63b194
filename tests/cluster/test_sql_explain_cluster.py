"""EXPLAIN of every statement and ``META().cas`` on a real 3-node cluster. EXPLAIN of INSERT,
UPSERT, DELETE, UPDATE, MERGE and EXECUTE shows the plan of the query each runs (its
fragments) and its write steps under CAS, and writes nothing; ``META().cas`` is the CAS the
client's write returned, on a key lookup run inline and on one run in fragments, and moves
when SQL updates the document. Key lookups need no index, so no Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.sql.exec.plan_kinds import INLINE_KEYS

pytestmark = pytest.mark.cluster

KS = "items"
DOCS = {f"i{i:03}": {"n": i, "g": i % 5} for i in range(120)}
KEYS = ["i001", "i002", "i003"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("sql-explain")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, 16)
        c.keyspace(KS).upsert_many(DOCS.items())
        yield c


def _all(client: Client) -> dict[str, Any]:
    rows = client.query(f"SELECT RAW [META().id, d] FROM {KS} AS d USE KEYS $1", [list(DOCS)])
    return dict(rows)


def _explain(client: Client, sql: str, params: Any = None) -> dict[str, Any]:
    rows = client.query(sql, params)
    [plan] = list(rows)
    return plan


def test_explain_dml_plans_its_query_and_writes_nothing(client: Client) -> None:
    before = _all(client)
    assert before == DOCS
    delete = _explain(client, f"EXPLAIN DELETE FROM {KS} USE KEYS $1 WHERE g = 1", [KEYS])
    assert delete["statement"] == "DELETE"
    assert delete["query"]["distributed"]["source"] == "keys"
    assert [op["operator"] for op in delete["plan"]] == ["FetchWithCas", "Filter", "SendDelete"]
    assert delete["plan"][-1]["under_cas"] is True
    update = _explain(client, f"EXPLAIN UPDATE {KS} USE KEYS $1 SET m = n * 2", [KEYS])
    assert [op["operator"] for op in update["plan"]] == ["FetchWithCas", "Set", "SendUpdate"]
    values = _explain(client, f"EXPLAIN INSERT INTO {KS} VALUES ('new', {{'n': 1}})")
    assert "query" not in values
    assert [op["operator"] for op in values["plan"]] == ["ValueScan", "SendInsert"]
    upsert = _explain(
        client,
        f"EXPLAIN UPSERT INTO {KS} (KEY 'c_' || META(s).id) SELECT s.n FROM {KS} AS s USE KEYS $1",
        [KEYS],
    )
    assert upsert["query"]["distributed"]["source"] == "keys"
    assert upsert["plan"][0]["operator"] == "SendUpsert"
    setop = _explain(
        client,
        f"EXPLAIN INSERT INTO {KS} (KEY k) SELECT 'x' AS k UNION SELECT META().id || 'y' AS k "
        f"FROM {KS} USE KEYS $1",
        [KEYS],
    )
    assert [b["distributed"]["source"] for b in setop["query"]["branches"]] == ["none", "keys"]
    merge = _explain(
        client,
        f"EXPLAIN MERGE INTO {KS} AS t USING {KS} AS s USE KEYS $1 ON KEY META(s).id "
        "WHEN MATCHED THEN DELETE",
        [KEYS],
    )
    assert merge["query"]["distributed"]["source"] == "keys"
    assert merge["plan"][-1]["operator"] == "Merge" and merge["plan"][-1]["under_cas"] is True
    list(client.query(f"PREPARE wipe FROM DELETE FROM {KS} USE KEYS $1"))
    executed = _explain(client, "EXPLAIN EXECUTE wipe", [KEYS])
    assert executed["statement"] == "DELETE" and executed["plan"][-1]["operator"] == "SendDelete"
    assert _all(client) == before  # not one document written or deleted
    gone = client.query("EXECUTE wipe", [["i119"]])  # the statement itself does delete
    list(gone)
    assert gone.metrics.mutation_count == 1
    client.keyspace(KS).upsert("i119", DOCS["i119"])


def test_meta_cas_is_the_cas_of_the_last_write(client: Client) -> None:
    ks = client.keyspace(KS)
    written = {k: ks.upsert(k, {**DOCS[k], "w": 1}).cas for k in KEYS}
    inline = client.query(f"SELECT RAW [META().id, META().cas] FROM {KS} USE KEYS $1", [KEYS])
    assert dict(inline) == written  # a small key lookup: read on the initiator's loop
    many = list(DOCS)[: INLINE_KEYS + 10]
    rows = client.query(f"SELECT RAW [META().id, META().cas] FROM {KS} USE KEYS $1", [many])
    got = dict(rows)  # past the inline limit: the root fragment fetches them
    assert set(got) == set(many)
    assert all(got[k] == written[k] for k in KEYS)
    assert all(got[k] == ks.get_versioned(k).cas for k in many[-3:])
    updated = client.query(f"UPDATE {KS} USE KEYS $1 SET w = 2 RETURNING META().id", [KEYS])
    assert sorted(r["id"] for r in updated) == KEYS
    after = dict(client.query(f"SELECT RAW [META().id, META().cas] FROM {KS} USE KEYS $1", [KEYS]))
    assert all(after[k] != written[k] and after[k] == ks.get_versioned(k).cas for k in KEYS)
    for k in KEYS:
        ks.upsert(k, DOCS[k])

"""The SQL surfaces on a real cluster (the session's shared 3 nodes on loopback and Spark
pipeline, ``shared_cluster``, maintaining the primary index of this module's keyspace):
``shardex sql --json`` as a process, ``shardex.dbapi`` over ``connect(dir=...)``, and (slow)
the DuckDB correctness suite and the Couchbase conformance cases through ``c.query`` at
request_plus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.sql_reference.compare import compare, duck_connection, run_suite
from tests.sql_reference.ctes import with_generators, with_query
from tests.sql_reference.documents import make_documents
from tests.sql_reference.generator import QueryGen
from tests.sql_reference.setops import set_op_query
from tests.sql_reference.windows import window_query

import shardex.dbapi as db
from shardex.client import Client
from shardex.sql.local import LocalEngine
from shardex.testing.sql_conformance import DEFAULT_DIR, ClusterEngine, run_all

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KS = "docs"
N_DOCS = 200
SHARDEX = Path(sys.executable).with_name("shardex")


@dataclass
class Env:
    path: Path
    client: Client
    ref: LocalEngine


@pytest.fixture(scope="module")
def env(shared_cluster: SharedCluster) -> Iterator[Env]:
    docs = make_documents(1, N_DOCS)
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    client = shared_cluster.client
    with shared_cluster.keyspace(KS):
        ks = client.keyspace(KS)
        for docid, doc in docs.items():
            ks.upsert(docid, doc)
        list(client.query(f"CREATE PRIMARY INDEX ON {KS}"))
        client.wait_for_index(KS, "#primary", timeout=240)
        yield Env(shared_cluster.path, client, ref)


def _cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SHARDEX), "sql", "--dir", str(env.path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.timeout(600)
def test_cli_json_prints_exactly_the_rows(env: Env) -> None:
    sql = f"SELECT d.id, d.s FROM {KS} AS d WHERE d.a > $1 ORDER BY d.id LIMIT 5"
    done = _cli(env, "--json", "--param", "10", sql)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == env.ref.query(sql, [10])
    assert done.stdout.strip().startswith("[") and done.stdout.strip().endswith("]")
    done = _cli(env, "--json", f"SELECT RAW COUNT(*) FROM {KS} WHERE a IS MISSING")
    assert json.loads(done.stdout) == env.ref.query(
        f"SELECT RAW COUNT(*) FROM {KS} WHERE a IS MISSING"
    )
    bad = _cli(env, "--json", f"SELECT id FROM {KS} WHERE")
    assert bad.returncode == 1 and bad.stdout == ""
    assert "SQL_SYNTAX" in bad.stderr and "line 1" in bad.stderr and "^" in bad.stderr
    table = _cli(env, f"SELECT d.id, d.g FROM {KS} AS d WHERE d.id < 3 ORDER BY d.id")
    assert table.returncode == 0 and "3 row(s)" in table.stdout


@pytest.mark.timeout(600)
def test_cli_statement_options_reach_the_node(env: Env) -> None:
    """``--memory-quota`` and ``--durability-timeout`` go with the statement: the node
    takes them within its limits and names them when out of them."""
    sql = f"SELECT d.id FROM {KS} AS d ORDER BY d.s, d.id LIMIT 3"
    ok = _cli(env, "--json", "--memory-quota", "1MiB", sql)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == env.ref.query(sql)
    over = _cli(env, "--json", "--memory-quota", "64GiB", sql)
    assert over.returncode == 1 and "memory_quota" in over.stderr, over.stderr
    bad = _cli(env, "--json", "--durability-timeout", "0", f"DELETE FROM {KS} WHERE d = -1")
    assert bad.returncode == 1 and "durability_timeout" in bad.stderr, bad.stderr
    garbled = _cli(env, "--json", "--memory-quota", "lots", sql)
    assert garbled.returncode != 0 and "lots" in garbled.stderr, garbled.stderr


@pytest.mark.timeout(600)
def test_dbapi_through_the_cluster(env: Env) -> None:
    with db.connect(dir=env.path) as conn:
        cur = conn.cursor()
        cur.execute(
            f"SELECT d.id, d.a FROM {KS} AS d WHERE d.a BETWEEN ? AND ? ORDER BY d.id", [3, 5]
        )
        want = env.ref.query(
            f"SELECT d.id, d.a FROM {KS} AS d WHERE d.a BETWEEN 3 AND 5 ORDER BY d.id"
        )
        assert [d[0] for d in cur.description] == ["id", "a"]
        assert cur.fetchall() == [(r["id"], r["a"]) for r in want]
        assert cur.rowcount == len(want) and cur.metrics.index == "#primary"
        cur.execute(f"UPSERT INTO {KS} (KEY, VALUE) VALUES (?, {{'id': ?, 'a': 1000}})", ["zz", -1])
        assert cur.rowcount == 1
        cur.execute(f"SELECT RAW d.id FROM {KS} AS d WHERE d.a = 1000")  # request_plus
        assert cur.fetchall() == [(-1,)]
        cur.execute(f"DELETE FROM {KS} WHERE META().id = ?", ["zz"])
        assert cur.rowcount == 1
        conn.commit()
        with pytest.raises(db.ProgrammingError) as info:
            cur.execute("SELECT * FROM nowhere")
        assert info.value.code is not None and info.value.code.name == "KEYSPACE_NOT_FOUND"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_duckdb_suite_through_the_cluster(env: Env) -> None:
    qs, mismatches = run_suite(
        lambda sql: env.client.query(sql), keyspace=KS, n_docs=N_DOCS, n_queries=300
    )
    assert len(qs) == 300
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_set_operations_with_and_windows_through_the_cluster(env: Env) -> None:
    """The random set operations (each branch its own query over the primary index), WITH
    statements (a term's value read by the leaves as a parameter) and window functions
    (leaves send scope rows, the root windows) through ``c.query``, against DuckDB."""
    con = duck_connection(make_documents(1, N_DOCS))
    gen, over = with_generators(11, KS, "docs")
    setops, windows = QueryGen(7, KS, "docs"), QueryGen(13, KS, "docs")
    qs = [set_op_query(setops) for _ in range(60)] + [with_query(gen, over) for _ in range(40)]
    qs += [window_query(windows) for _ in range(60)]
    mismatches = [m for q in qs if (m := compare(env.client.query, con, q)) is not None]
    con.close()
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_conformance_through_the_cluster(env: Env) -> None:
    if not DEFAULT_DIR.is_dir():
        pytest.skip(f"no conformance cases at {DEFAULT_DIR}")
    local = {(o.file, o.index): o for o in run_all(DEFAULT_DIR)}
    cluster = run_all(DEFAULT_DIR, ClusterEngine(env.client))
    failed = [o for o in cluster if o.outcome == "failed"]
    assert not failed, "\n".join(f"{o.file}#{o.index}: {o.reason}" for o in failed[:15])
    # The cluster passes exactly what the single-process reference passes.
    assert {(o.file, o.index): o.outcome for o in cluster} == {
        k: o.outcome for k, o in local.items()
    }

"""The SQL memory budget on real nodes (decision 0106): 20k documents read by key, with a
1 MiB budget an ORDER BY on an unindexed field and a GROUP BY with 10k groups spill to disk
on the initiator and return the very rows they return with the node's default budget; with
spilling off the same statements fail with QUERY_MEMORY_LIMIT naming the operator (so they
are over the budget indeed); a quota past the node's maximum is refused; an UPDATE whose id
list is over its budget fails before any write; no spill directory is left behind. Key
lookups need no index, so no Spark: the leaves' side is exercised with the 1M-document
benchmark (``bench/sql_memory.py``)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import DEFAULT_QUERY_MEMORY, MIN_QUERY_MEMORY, SPILL_DIR

pytestmark = pytest.mark.cluster

KS = "spilled"
N = 20_000
GROUPS = 10_000
BUDGET = 1 << 20


def _doc(rng: random.Random, i: int) -> dict[str, Any]:
    d: dict[str, Any] = {
        "k": i,
        "grp": rng.randrange(GROUPS),
        "pad": "p" * rng.randrange(10, 60),
    }
    r = rng.random()
    if r < 0.9:  # ties, NULLs, MISSING and mixed types in the sort key
        d["u"] = rng.choice([rng.randrange(500), rng.randrange(500) / 4, str(rng.randrange(50))])
    elif r < 0.95:
        d["u"] = None
    return d


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("sql-memory")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    rng = random.Random(21)
    docs = {f"d{i:05d}": _doc(rng, i) for i in range(N)}
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, 8)
        c.keyspace(KS).upsert_many(docs.items())
        yield c


KEYS = [f"d{i:05d}" for i in range(N)]
ORDER = f"SELECT META().id AS id, u, pad FROM {KS} USE KEYS $1 ORDER BY u DESC, pad"
GROUP = (
    f"SELECT grp, COUNT(*) AS n, ARRAY_AGG(k) AS ks, MIN(u) AS lo FROM {KS} USE KEYS $1 "
    "GROUP BY grp ORDER BY n DESC, grp"
)


def _spills_logged(cluster: LocalCluster) -> int:
    return sum(
        len(re.findall(r"spilled \d+ files", log.read_text()))
        for log in Path(cluster.path).glob("node*/node.log")
    )


@pytest.mark.timeout(900)
def test_spilled_order_by_and_group_by_equal_the_default_budget(
    cluster: LocalCluster, client: Client
) -> None:
    for sql, operator in ((ORDER, "ORDER BY"), (GROUP, "GROUP BY")):
        spills = _spills_logged(cluster)
        want = list(client.query(sql, [KEYS], timeout=600))
        got = list(client.query(sql, [KEYS], timeout=600, memory_quota=BUDGET))
        assert len(want) == (N if sql is ORDER else len({r["grp"] for r in want}))
        assert got == want
        assert _spills_logged(cluster) > spills  # the 1 MiB run wrote spill files
        with pytest.raises(ShardexError) as info:
            list(client.query(sql, [KEYS], timeout=600, memory_quota=BUDGET, spill=False))
        e = info.value
        assert e.code is ErrorCode.QUERY_MEMORY_LIMIT and e.details["limit"] == BUDGET
        assert e.details["operator"] == operator
    for node in sorted(Path(cluster.path).glob("node*")):
        spill_root = node / SPILL_DIR
        assert not spill_root.exists() or list(spill_root.iterdir()) == [], node


def test_a_quota_past_the_node_maximum_is_refused(client: Client) -> None:
    with pytest.raises(ShardexError) as info:
        list(client.query("SELECT 1", memory_quota=DEFAULT_QUERY_MEMORY + 1))
    e = info.value
    assert e.code is ErrorCode.BAD_REQUEST
    assert e.details["value"] == DEFAULT_QUERY_MEMORY + 1
    assert e.details["limit"] == DEFAULT_QUERY_MEMORY and "sql_query_memory" in e.message


def test_update_over_its_budget_fails_before_any_write(client: Client) -> None:
    """DELETE and UPDATE list the ids they change before the first write; the list is
    charged to the statement's budget: past it QUERY_MEMORY_LIMIT names the statement, and
    no document was changed."""
    sql = f"UPDATE {KS} USE KEYS $1 SET touched = TRUE"
    count = f"SELECT RAW COUNT(*) FROM {KS} USE KEYS $1 WHERE touched = TRUE"
    with pytest.raises(ShardexError) as info:
        list(client.query(sql, [KEYS], timeout=600, memory_quota=MIN_QUERY_MEMORY))
    e = info.value
    assert e.code is ErrorCode.QUERY_MEMORY_LIMIT, e
    assert e.details["operator"] == "UPDATE" and e.details["limit"] == MIN_QUERY_MEMORY
    assert list(client.query(count, [KEYS], timeout=600)) == [0]
    done = client.query(sql, [KEYS[:500]], timeout=600, memory_quota=MIN_QUERY_MEMORY)
    list(done)
    assert done.metrics.mutation_count == 500
    assert list(client.query(count, [KEYS], timeout=600)) == [500]

"""SQL end to end: ``c.query`` on a real 3-node cluster with the Spark pipeline (both shared
with other modules: ``shared_cluster``) maintaining a primary and two secondary indexes of
this module's own keyspace, every result compared with ``LocalEngine`` (the
single-process reference) over the very same documents: multisets, or sequences where the
statement has ORDER BY (always with a tie-breaker, so the order is unique)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import MIN_QUERY_MEMORY
from shardex.sql.local import LocalEngine
from shardex.testing.procs import wait_for

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KS = "people"
N_DOCS = 400
WAIT = 120.0

INDEXES = [
    f"CREATE PRIMARY INDEX ON {KS}",
    f"CREATE INDEX by_age ON {KS}(age, name) PARTITION BY HASH(META().id)"
    ' WITH {"num_partition": 4}',
    f"CREATE INDEX by_city ON {KS}(city, score DESC) PARTITION BY HASH(city)"
    ' WITH {"num_partition": 3}',
    f"CREATE INDEX by_tag ON {KS}(DISTINCT ARRAY t FOR t IN tags END, name)"
    ' PARTITION BY HASH(META().id) WITH {"num_partition": 2}',
]


def make_doc(rng: random.Random, i: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": rng.choice(["ann", "bob", "cy", "dee", "eve", "fay"]),
        "city": rng.choice(["paris", "rome", "oslo", "lima", "kyiv"]),
        "score": rng.choice([rng.randrange(100), rng.randrange(1000) / 10, None]),
        "tags": rng.sample(["a", "b", "c", "d"], rng.randrange(3)),
        "active": rng.random() < 0.6,
        "n": i,
    }
    if rng.random() < 0.85:  # some documents have no age at all (MISSING)
        doc["age"] = rng.randrange(18, 70)
    if rng.random() < 0.3:
        doc["address"] = {"zip": f"{rng.randrange(100):05d}", "floor": rng.randrange(5)}
    return doc


@dataclass
class Env:
    path: Path
    client: Client
    ref: LocalEngine

    def check(self, sql: str, params: Any = None, *, ordered: bool | None = None) -> list[Any]:
        """Run ``sql`` on the cluster and on the reference; assert equal results."""
        got = list(self.client.query(sql, params))
        want = self.ref.query(sql, params)
        if ordered is None:
            ordered = "ORDER BY" in sql.upper()
        if ordered:
            assert _numbers(got) == _numbers(want), sql
        else:
            assert sorted(map(_canon, got)) == sorted(map(_canon, want)), sql
        return got

    def both(self, sql: str, params: Any = None) -> Any:
        """A DML statement on both sides; returns the cluster's metrics."""
        rows = self.client.query(sql, params)
        list(rows)
        self.ref.execute(sql, params)
        return rows.metrics


def first(rows: Any) -> Any:
    out = list(rows)
    assert len(out) == 1
    return out[0]


def _canon(v: Any) -> bytes:
    return msgspec.json.encode(_numbers(v), order="sorted")


def _numbers(v: Any) -> Any:
    """JSON numbers by value: a covering scan rebuilds 58.0 from the index key as 58 (the key
    codec orders numbers exactly across int and float, and keeps no type)."""
    if type(v) is float and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers(x) for x in v]
    return v


@pytest.fixture(scope="module")
def env(shared_cluster: SharedCluster) -> Iterator[Env]:
    rng = random.Random(7)
    docs = {f"p{i:04d}": make_doc(rng, i) for i in range(N_DOCS)}
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    client = shared_cluster.client
    with shared_cluster.keyspace(KS):
        ks = client.keyspace(KS)
        for docid, doc in docs.items():
            ks.upsert(docid, doc)
        for ddl in INDEXES:
            list(client.query(ddl))
            ref.execute(ddl)
        for name in ("#primary", "by_age", "by_city", "by_tag"):
            client.wait_for_index(KS, name, timeout=240)
        yield Env(shared_cluster.path, client, ref)


@pytest.mark.timeout(600)
def test_filters_projections_and_params(env: Env) -> None:
    env.check(f"SELECT * FROM {KS}")
    env.check(f"SELECT META().id AS id, name, age FROM {KS} WHERE age > 40")
    env.check(f"SELECT name FROM {KS} WHERE age BETWEEN 20 AND 30 AND name = 'bob'")
    env.check(f"SELECT RAW age FROM {KS} WHERE age >= 60")
    env.check(f"SELECT p.name, p.address.zip FROM {KS} AS p WHERE p.city = 'rome'")
    env.check(f"SELECT city, score FROM {KS} WHERE city IN ['oslo', 'lima'] AND score > 50")
    env.check(f"SELECT n FROM {KS} WHERE city = 'kyiv' AND score IS NULL")
    env.check(f"SELECT n FROM {KS} WHERE age IS MISSING")
    env.check(f"SELECT n, tags FROM {KS} WHERE ANY t IN tags SATISFIES t = 'c' END")
    env.check(f"SELECT n FROM {KS} WHERE name LIKE 'd%' AND active")
    env.check(f"SELECT n FROM {KS} WHERE age < $1 AND name = $2", [25, "eve"])
    env.check(f"SELECT n FROM {KS} WHERE age > $lo AND age < $hi", {"lo": 30, "hi": 33})
    env.check(f"SELECT n, age + 1 AS next FROM {KS} LET a = age WHERE a = 44")
    env.check(f"SELECT VALUE {{'id': META().id, 'x': n * 2}} FROM {KS} WHERE age = 50")
    env.check("SELECT 1 + 2 AS three, 'x' AS y")  # no FROM: the initiator alone
    env.check("SELECT RAW v * 10 FROM [1, 2, 3] AS v WHERE v > 1")


@pytest.mark.timeout(600)
def test_covering_and_non_covering_and_use_index(env: Env) -> None:
    c = env.client
    covered = c.query(f"SELECT age, name FROM {KS} WHERE age > 60")
    assert sorted(map(_canon, covered)) == sorted(
        map(_canon, env.ref.query(f"SELECT age, name FROM {KS} WHERE age > 60"))
    )
    assert covered.metrics is not None and covered.metrics.index == "by_age"
    plan = first(c.query(f"EXPLAIN SELECT age, name FROM {KS} WHERE age > 60"))
    assert plan["distributed"]["index"]["covering"] is True
    plan = first(c.query(f"EXPLAIN SELECT age, city FROM {KS} WHERE age > 60"))
    assert plan["distributed"]["index"]["covering"] is False
    env.check(f"SELECT age, city FROM {KS} WHERE age > 60")
    env.check(f"SELECT META().id FROM {KS} USE INDEX (`#primary`) WHERE age > 60")
    env.check(f"SELECT COUNT(*) AS c FROM {KS}")  # the primary index, covering
    env.check(f"SELECT city, score FROM {KS} USE INDEX (by_city) WHERE city > 'm'")
    rows = c.query(f"SELECT n FROM {KS} USE INDEX (`#primary`) WHERE age = 30")
    list(rows)
    assert rows.metrics is not None and rows.metrics.index == "#primary"


@pytest.mark.timeout(600)
def test_an_array_index_serves_any_and_follows_elements_that_come_and_go(env: Env) -> None:
    c = env.client
    any_b = f"SELECT n, tags FROM {KS} WHERE ANY t IN tags SATISFIES t = 'b' END"
    plan = first(c.query("EXPLAIN " + any_b))
    assert plan["distributed"]["index"]["name"] == "by_tag"
    assert plan["distributed"]["index"]["covering"] is False
    env.check(any_b)
    # Another variable name, a list, a second conjunct on the next key part.
    env.check(
        f"SELECT n FROM {KS} WHERE ANY x IN tags SATISFIES x IN ['a', 'd'] END AND name = 'ann'"
    )
    # A range two elements of one document fall in: the document comes once.
    env.check(f"SELECT n FROM {KS} WHERE ANY t IN tags SATISFIES t >= 'a' END ORDER BY n")
    env.check(f"SELECT COUNT(*) AS c FROM {KS} WHERE ANY t IN tags SATISFIES t > 'a' END")
    # An inner UNNEST's condition on its elements reaches the array index too.
    unnest = f"SELECT p.n, t FROM {KS} AS p UNNEST p.tags AS t WHERE t IN ['b', 'c'] AND p.n > 9"
    plan = first(c.query("EXPLAIN " + unnest))
    assert plan["distributed"]["index"]["name"] == "by_tag"
    env.check(unnest)
    # Elements added, replaced and emptied: the index follows at request_plus.
    env.both(f"UPDATE {KS} SET tags = ['z', 'b', 'z'] WHERE n < 30")
    env.both(f"UPDATE {KS} SET tags = [] WHERE n >= 30 AND n < 60")
    env.both(f"UPDATE {KS} UNSET tags WHERE n >= 60 AND n < 70")
    # UPDATE ... FOR changes elements in place; the array index follows them too.
    env.both(f"UPDATE {KS} SET t = UPPER(t) FOR t IN tags WHEN t = 'z' END WHERE n < 10")
    for tag in ("z", "Z", "b", "a"):
        env.check(f"SELECT n FROM {KS} WHERE ANY t IN tags SATISFIES t = '{tag}' END ORDER BY n")
    zs = list(c.query(f"SELECT RAW n FROM {KS} WHERE ANY t IN tags SATISFIES t = 'z' END"))
    assert sorted(zs) == list(range(10, 30))


@pytest.mark.timeout(600)
def test_order_limit_offset(env: Env) -> None:
    env.check(f"SELECT META().id AS id, age FROM {KS} WHERE age > 20 ORDER BY age, id")
    env.check(f"SELECT META().id AS id, age FROM {KS} WHERE age > 20 ORDER BY age DESC, id LIMIT 7")
    env.check(f"SELECT n, score FROM {KS} ORDER BY score NULLS LAST, n LIMIT 15 OFFSET 5")
    env.check(f"SELECT n, city FROM {KS} WHERE city = 'oslo' ORDER BY n DESC LIMIT 3 OFFSET 2")
    env.check(f"SELECT RAW n FROM {KS} WHERE age > 30 ORDER BY n LIMIT $1", [9])
    env.check(f"SELECT n FROM {KS} ORDER BY age, n OFFSET 390")
    env.check(f"SELECT n FROM {KS} WHERE age > 20 ORDER BY n LIMIT 0")
    got = list(env.client.query(f"SELECT n FROM {KS} WHERE age > 20 LIMIT 5"))
    assert len(got) == 5


@pytest.mark.timeout(600)
def test_group_by_having_every_aggregate_and_distinct(env: Env) -> None:
    env.check(
        f"SELECT city, COUNT(*) AS c, COUNT(age) AS ca, SUM(score) AS s, AVG(score) AS a, "
        f"MIN(age) AS lo, MAX(name) AS hi, COUNT(DISTINCT name) AS names FROM {KS} GROUP BY city"
    )
    env.check(
        f"SELECT name, AVG(age) AS a FROM {KS} WHERE age > 25 GROUP BY name HAVING COUNT(*) > 10 "
        "ORDER BY name"
    )
    env.check(f"SELECT COUNT(*) AS c, SUM(age) AS s, MIN(score) AS m FROM {KS} WHERE age > 1000")
    env.check(
        f"SELECT active, city, COUNT(*) AS c FROM {KS} GROUP BY active, city "
        "ORDER BY c DESC, city, active LIMIT 4"
    )
    env.check(f"SELECT DISTINCT city FROM {KS}")
    env.check(f"SELECT DISTINCT RAW name FROM {KS} WHERE age > 50")
    env.check(f"SELECT DISTINCT city, active FROM {KS} ORDER BY city, active")
    env.check(f"SELECT SUM(DISTINCT age) AS s, AVG(DISTINCT age) AS a FROM {KS}")


@pytest.mark.timeout(600)
def test_meta_id_and_use_keys_go_to_the_data_service(env: Env) -> None:
    env.check(f"SELECT name, META().id AS id FROM {KS} WHERE META().id = 'p0007'")
    env.check(f"SELECT n FROM {KS} WHERE META().id IN ['p0001', 'p0002', 'nope']")
    env.check(f"SELECT n FROM {KS} USE KEYS ['p0003', 'p0004'] WHERE n > 3")
    plan = first(env.client.query(f"EXPLAIN SELECT n FROM {KS} USE KEYS 'p0003'"))
    assert plan["distributed"]["source"] == "keys" and "index" not in plan["distributed"]


@pytest.mark.timeout(600)
def test_dml_then_request_plus_reads_see_it(env: Env) -> None:
    m = env.both(
        f"INSERT INTO {KS} (KEY, VALUE) VALUES ('new1', {{'age': 33, 'name': 'zed', 'n': -1}})"
    )
    assert m.mutation_count == 1
    env.check(f"SELECT META().id AS id, name FROM {KS} WHERE age = 33")
    m = env.both(f"UPDATE {KS} SET age = age + 100 WHERE name = 'fay' AND age < 30")
    assert m.mutation_count == len(
        [
            d
            for d in env.ref.keyspaces[KS].values()
            if d.get("name") == "fay" and 100 <= d.get("age", 0) < 130
        ]
    )
    env.check(f"SELECT n, age FROM {KS} WHERE age > 100")
    m = env.both(f"DELETE FROM {KS} WHERE city = 'lima' AND score > 80")
    assert m.mutation_count > 0
    env.check(f"SELECT n FROM {KS} WHERE city = 'lima'")
    env.check(f"SELECT COUNT(*) AS c FROM {KS}")
    m = env.both(f"UPSERT INTO {KS} (KEY, VALUE) VALUES ('new1', {{'age': 34, 'name': 'zed'}})")
    assert m.mutation_count == 1
    env.check(f"SELECT name FROM {KS} WHERE age = 34")


@pytest.mark.timeout(600)
def test_merge_updates_deletes_and_inserts_by_key_from_each_kind_of_source(env: Env) -> None:
    # A keyspace source with USE KEYS: matched documents updated, the others inserted.
    m = env.both(
        f"MERGE INTO {KS} t USING {KS} s USE KEYS ['p0001', 'p0002'] "
        "ON KEY 'm-' || META(s).id WHEN MATCHED THEN UPDATE SET t.hits = t.hits + 1 "
        "WHEN NOT MATCHED THEN INSERT {s.name, 'hits': 1, 'n': -2}"
    )
    assert m.mutation_count == 2
    m = env.both(
        f"MERGE INTO {KS} t USING {KS} s USE KEYS ['p0001', 'p0003'] "
        "ON KEY 'm-' || META(s).id WHEN MATCHED THEN UPDATE SET t.hits = t.hits + 1 "
        "WHEN NOT MATCHED THEN INSERT {s.name, 'hits': 1, 'n': -3}"
    )
    assert m.mutation_count == 2
    env.check(f"SELECT META().id AS id, name, hits FROM {KS} WHERE n < -1")
    # A SELECT source (a distributed query of its own) and DELETE with its WHERE.
    m = env.both(
        f"MERGE INTO {KS} t USING (SELECT 'm-' || META().id AS k FROM {KS} WHERE n < 5) s "
        "ON KEY s.k WHEN MATCHED THEN DELETE WHERE t.hits = 2"
    )
    assert m.mutation_count == 1
    # An expression source, RETURNING.
    rows = env.client.query(
        f"MERGE INTO {KS} t USING [{{'k': 'm-p0003'}}, {{'k': 'm-new'}}] s ON KEY s.k "
        "WHEN MATCHED THEN UPDATE SET t.hits = 10 WHEN NOT MATCHED THEN INSERT {'n': -4} "
        "RETURNING META(t).id AS id, t.hits"
    )
    assert sorted(map(_canon, rows)) == sorted(
        map(_canon, [{"id": "m-p0003", "hits": 10}, {"id": "m-new"}])
    )
    env.ref.execute(
        f"MERGE INTO {KS} t USING [{{'k': 'm-p0003'}}, {{'k': 'm-new'}}] s ON KEY s.k "
        "WHEN MATCHED THEN UPDATE SET t.hits = 10 WHEN NOT MATCHED THEN INSERT {'n': -4}"
    )
    env.check(f"SELECT META().id AS id, hits FROM {KS} WHERE n < -1")
    # One document named twice: refused before anything is written.
    with pytest.raises(ShardexError) as err:
        list(
            env.client.query(
                f"MERGE INTO {KS} t USING [1, 2] s ON KEY 'm-twice' "
                "WHEN NOT MATCHED THEN INSERT {'n': -9}"
            )
        )
    assert err.value.code is ErrorCode.BAD_REQUEST and "more than once" in err.value.message
    env.check(f"SELECT META().id AS id FROM {KS} WHERE n = -9")


@pytest.mark.timeout(600)
def test_concurrent_updates_lose_nothing_and_recheck_where(env: Env) -> None:
    """Four clients run ``SET n = n + 1 WHERE n < 20`` on one document 8 times each: every
    write carries the CAS of the version its WHERE was checked on, so none is lost (the count
    of mutations equals the increments) and none overshoots (a version that reached 20 no
    longer matches, and is skipped)."""
    env.both(f"UPSERT INTO {KS} (KEY, VALUE) VALUES ('ctr', {{'n': 0, 'name': 'ctr'}})")
    stmt = f"UPDATE {KS} SET n = n + 1 WHERE META().id = 'ctr' AND n < 20"
    counts: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with connect_local(env.path, as_node=True) as c:
                for _ in range(8):
                    rows = c.query(stmt)
                    list(rows)
                    counts.append(rows.metrics.mutation_count)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(counts) == 32
    assert env.client.keyspace(KS).get("ctr")["n"] == 20
    assert sum(counts) == 20
    env.ref.keyspaces[KS]["ctr"] = {"n": 20, "name": "ctr"}
    env.check(f"SELECT n FROM {KS} WHERE name = 'ctr'")


@pytest.mark.timeout(600)
def test_explain_shows_index_spans_fragments_and_exchanges(env: Env) -> None:
    plan = list(
        env.client.query(f"EXPLAIN SELECT name FROM {KS} WHERE city = 'rome' ORDER BY name LIMIT 3")
    )
    assert len(plan) == 1
    dist = plan[0]["distributed"]
    assert dist["index"]["name"] == "by_city"
    assert dist["index"]["spans"] == [{"low": ["rome"], "high": ["rome"], "inclusion": "both"}]
    # PARTITION BY HASH(city): the equality span reads one slice, so one leaf.
    assert len(dist["fragments"]) == 2 and len(dist["exchanges"]) == 1
    assert dist["fragments"][0]["does"][0] == "MergeSort"
    assert "Limit(3)" in dist["fragments"][1]["does"]


@pytest.mark.timeout(600)
def test_joins_probe_indexes_and_gather_sides(env: Env) -> None:
    """JOIN and NEST at the initiator over side statements (decision 0123), on real
    indexes: an index nested loop probes ``by_age`` per batch of rows, a hash join gathers
    its side through an index scan, a lookup join reads by key; all equal the reference."""
    probe = (
        f"SELECT META(p).id AS p, META(q).id AS q FROM {KS} p JOIN {KS} q "
        "ON q.age = p.age + 1 AND q.city = 'oslo' WHERE p.n < 80 ORDER BY p, q"
    )
    assert env.check(probe)
    (plan,) = env.client.query("EXPLAIN " + probe)
    join = next(op for op in plan["plan"] if op["operator"] == "JOIN")
    assert (join["method"], join["index"]) == ("index_nl", "by_age")
    probed = plan["distributed"]["inputs"][1]
    assert probed["plan"]["index"]["name"] == "by_age"
    env.check(
        f"SELECT p.city, COUNT(*) AS n FROM {KS} p JOIN {KS} q USE HASH(BUILD) "
        "ON q.city = p.city AND q.n < 30 WHERE p.age > 60 GROUP BY p.city"
    )
    env.check(
        f"SELECT META(p).id AS p, ARRAY_LENGTH(q) AS n FROM {KS} p LEFT NEST {KS} q "
        "ON q.name = p.name AND q.age < 25 WHERE p.city = 'lima'"
    )
    env.check(
        f"SELECT META(p).id AS p, META(q).id AS q FROM {KS} p RIGHT JOIN {KS} q "
        "ON q.age = p.age AND p.city = 'rome' WHERE q.n < 40"
    )
    env.check(
        f"SELECT META(p).id AS p, q.name FROM {KS} p USE KEYS $1 LEFT JOIN {KS} q "
        "ON KEYS 'p' || SUBSTR(META(p).id, 1) WHERE p.n < 400",
        [[f"p{i:04d}" for i in range(0, 400, 7)]],
    )


def _error(env: Env, sql: str, params: Any = None, **kw: Any) -> ShardexError:
    with pytest.raises(ShardexError) as info:
        list(env.client.query(sql, params, **kw))
    # The server keeps serving: a good query right after every error.
    env.check(f"SELECT COUNT(*) AS c FROM {KS} WHERE age > 50")
    return info.value


@pytest.mark.timeout(600)
def test_errors_are_clear_and_the_server_keeps_serving(env: Env) -> None:
    e = _error(env, f"SELECT name FROM {KS} WHERE age >")
    assert e.code is ErrorCode.SQL_SYNTAX and "line 1" in e.message
    e = _error(env, "SELECT * FROM nowhere")
    assert e.code is ErrorCode.KEYSPACE_NOT_FOUND
    list(env.client.query(f"DROP PRIMARY INDEX ON {KS}"))
    try:
        e = _error(env, f"SELECT n FROM {KS} WHERE name = 'ann'")
        assert e.code is ErrorCode.INDEX_NOT_FOUND
        assert "CREATE PRIMARY INDEX" in e.details["hint"]
    finally:
        list(env.client.query(f"CREATE PRIMARY INDEX ON {KS}"))
        env.client.wait_for_index(KS, "#primary", timeout=240)
    e = _error(env, f"SELECT n FROM {KS} WHERE age = $1 AND name = $2", [1])
    assert e.code is ErrorCode.BAD_REQUEST and e.details["expected"] == 2
    e = _error(env, f"SELECT n FROM {KS} WHERE age > 3 LIMIT 'ten'")
    assert e.code is ErrorCode.BAD_REQUEST and "LIMIT" in e.message
    # 400 groups at the root are over 64 KiB; without spilling, the statement fails.
    by_id = f"SELECT META().id AS id, COUNT(*) AS c FROM {KS} GROUP BY META().id"
    e = _error(env, by_id, memory_quota=MIN_QUERY_MEMORY, spill=False)
    assert e.code is ErrorCode.QUERY_MEMORY_LIMIT and e.details["limit"] == MIN_QUERY_MEMORY
    assert e.details["operator"] == "GROUP BY"
    e = _error(env, f"SELECT n FROM {KS} USE INDEX (nope) WHERE age > 3")
    assert e.code is ErrorCode.INDEX_NOT_FOUND


# Statements whose plan reads one index partition (``by_city`` is partitioned by city): one
# leaf, on one node, whichever node the statement arrives at.
SINGLE_LEAF = [
    (f"SELECT META().id AS id, name, age FROM {KS} WHERE city = $1", ["rome"]),
    (
        f"SELECT name, score FROM {KS} WHERE city = $1 ORDER BY score DESC, META().id LIMIT 7",
        ["paris"],
    ),
    (
        f"SELECT city, COUNT(*) AS n, AVG(age) AS a, ARRAY_AGG(DISTINCT name) AS names"
        f" FROM {KS} WHERE city = $1 GROUP BY city",
        ["oslo"],
    ),
    (f"SELECT DISTINCT name FROM {KS} WHERE city = $1 AND score IS NOT NULL", ["lima"]),
]


@pytest.mark.timeout(600)
def test_single_leaf_statements_run_where_their_slices_are(env: Env) -> None:
    """Sent to each node in turn, a one-leaf statement runs in-process on the node holding
    its slices (``details["local"]``) and elsewhere through the protocol, with the same rows
    as the reference either way; a node that is not the leaf's names it as the route, and
    the client's next run of the statement goes there and runs in-process."""
    from shardex.client import connect
    from shardex.meta import cluster_dir as cdir

    spec = cdir.load(env.path)
    password = cdir.read_admin_password(env.path, spec)
    for sql, params in SINGLE_LEAF:
        want = sorted(map(_canon, env.ref.query(sql, params)))
        local_at: list[str] = []
        routes: set[str] = set()
        for node in spec.nodes:
            with connect(node.address, username=cdir.ADMIN_USER, password=password) as c:
                for run in range(2):
                    rows = c.query(sql, params)
                    got = sorted(map(_canon, rows))
                    assert got == want, (sql, node.name, run)
                    d = rows.metrics.details
                    assert d["leaves"] == 1, (sql, d)
                    if run == 0 and d["local"]:
                        local_at.append(node.address)
                    elif run == 0:
                        routes.add(d["route"])
                    else:  # the hint was followed: the second run is in-process
                        assert d["local"], (sql, node.name, d)
        assert len(local_at) == 1, (sql, local_at)
        assert routes == set(local_at), (sql, routes, local_at)


@pytest.mark.timeout(600)
def test_key_lookups_by_a_parameter_go_to_the_key_owner(env: Env) -> None:
    """``WHERE META().id = $1``: the reply names the parameter as the route; the client
    sends the next run of the statement, with any key, to that key's owner (from its cached
    topology), which reads the document in-process. Rows stay the reference's."""
    from shardex.client import connect
    from shardex.meta import cluster_dir as cdir

    spec = cdir.load(env.path)
    name_of = {n.address: n.name for n in spec.nodes}
    sql = f"SELECT META().id AS id, name, n FROM {KS} WHERE META().id = $1"
    keys = [f"p{i:04d}" for i in range(0, N_DOCS, 37)]
    password = cdir.read_admin_password(env.path, spec)
    with connect(spec.nodes[0].address, username=cdir.ADMIN_USER, password=password) as c:
        first_run = c.query(sql, [keys[0]])
        assert list(first_run) == env.ref.query(sql, [keys[0]])
        assert first_run.metrics.details["route_key"] == {"keyspace": KS, "param": "1"}
        # The keyspace's topology is cached in the background: until then runs go unrouted.
        wait_for(lambda: c.rpc.router.owner_address(KS, keys[0]) is not None, 30)
        owners = set()
        for key in keys:
            rows = c.query(sql, [key])
            assert list(rows) == env.ref.query(sql, [key]), key
            owner = c.rpc.router.owner_address(KS, key)
            assert owner is not None, key
            assert rows.metrics.details["node"] == name_of[owner], key
            owners.add(owner)
        assert len(owners) > 1  # the keys span owners: each run went where its key lives


@pytest.mark.timeout(600)
def test_a_new_clients_first_key_lookup_goes_to_the_key_owner(env: Env) -> None:
    """A new client fetches the cluster's partition map at connect (in the background), and
    a key lookup's route is known from its text: the first run of a statement it never sent
    goes to the key's owner, without a reply to learn from."""
    from shardex.client import connect
    from shardex.meta import cluster_dir as cdir

    spec = cdir.load(env.path)
    name_of = {n.address: n.name for n in spec.nodes}
    keys = [f"p{i:04d}" for i in range(5, N_DOCS, 41)][:8]
    password = cdir.read_admin_password(env.path, spec)
    with connect(spec.nodes[0].address, username=cdir.ADMIN_USER, password=password) as c:
        wait_for(lambda: c.rpc.router.owner_address(KS, keys[0]) is not None, 30)
        served = set()
        for i, key in enumerate(keys):
            # A new text each time: every run is that statement's first.
            sql = f"SELECT META().id AS id, n FROM {KS} WHERE META().id = $1 AND {i} = {i}"
            rows = c.query(sql, [key])
            assert list(rows) == env.ref.query(sql, [key]), key
            owner = c.rpc.router.owner_address(KS, key)
            assert owner is not None and rows.metrics.details["node"] == name_of[owner], key
            served.add(owner)
        assert len(served) > 1  # not all on the client's own node


@pytest.mark.timeout(600)
def test_request_plus_in_process_sees_every_write_acknowledged_before_it(env: Env) -> None:
    """A one-leaf statement run in-process at request_plus reads the newest snapshot while
    the seqno round is out: right after a write the snapshot does not cover it yet and the
    statement must wait for one that does, never answer from the older one."""
    sql = f"SELECT META().id AS id, n FROM {KS} WHERE city = $1 AND n = $2"
    ks = env.client.keyspace(KS)
    list(env.client.query(sql, ["kyiv", -1]))  # learn the route: later runs are in-process
    for i in range(8):
        docid, n = f"spec{i}", 10_000 + i
        ks.upsert(docid, {"city": "kyiv", "n": n, "name": "zed"})
        rows = env.client.query(sql, ["kyiv", n])
        assert list(rows) == [{"id": docid, "n": n}], i
        assert rows.metrics.details["local"], rows.metrics.details
        ks.delete(docid)
        assert list(env.client.query(sql, ["kyiv", n])) == [], i


@pytest.mark.timeout(600)
def test_request_plus_point_read_sees_every_write_acknowledged_before_it(env: Env) -> None:
    """A statement whose index span finds a few entries on the node it runs on reads them,
    fetches and projects as plain calls (``details["point"]``, no leaf pipeline); right
    after a write its newest snapshot does not cover it, and it must read again at one that
    does, never answer from the older one. Switched off, the leaf answers the same."""
    sql = f"SELECT META().id AS id, n FROM {KS} WHERE city = $1 AND score = $2"
    ks = env.client.keyspace(KS)
    list(env.client.query(sql, ["kyiv", -1]))  # learn the route: later runs are in-process
    for i in range(6):
        docid, score = f"point{i}", 5_000 + i
        ks.upsert(docid, {"city": "kyiv", "score": score, "n": i, "name": "zed"})
        rows = env.client.query(sql, ["kyiv", score])
        assert list(rows) == [{"id": docid, "n": i}], i
        assert rows.metrics.details["local"] and rows.metrics.details["point"], i
        off = env.client.query(sql, ["kyiv", score], tuning={"point_read": False})
        assert list(off) == [{"id": docid, "n": i}], i
        assert off.metrics.details["local"] and not off.metrics.details["point"], i
        ks.delete(docid)
        rows = env.client.query(sql, ["kyiv", score])
        assert list(rows) == [] and rows.metrics.details["point"], i


@pytest.mark.timeout(600)
def test_request_plus_over_several_leaves_sees_every_write_acknowledged_before_it(
    env: Env,
) -> None:
    """The leaves' newest snapshots are asked for with the seqnos riding in the same round:
    right after a write they do not cover it, and the statement must wait for snapshots
    that do (a second round), never pin the older ones."""
    sql = f"SELECT META().id AS id, n FROM {KS} WHERE age = $1 AND name = $2"
    ks = env.client.keyspace(KS)
    for i in range(8):
        docid, n = f"ride{i}", 20_000 + i
        ks.upsert(docid, {"age": 99, "name": "ridge", "n": n})
        rows = env.client.query(sql, [99, "ridge"])
        assert list(rows) == [{"id": docid, "n": n}], i
        assert rows.metrics.details["leaves"] > 1, rows.metrics.details
        ks.delete(docid)
        assert list(env.client.query(sql, [99, "ridge"])) == [], i


@pytest.mark.timeout(600)
def test_request_plus_reads_at_the_last_pinned_ts_only_when_it_covers_the_writes(
    env: Env,
) -> None:
    """A request_plus statement over several leaves runs at the TS its index was pinned at
    last while the seqno round is out (``details["guessed"]``). Right after a write that TS
    does not cover the seqnos: the run is dropped and the statement pins anew, its rows
    holding the write."""
    sql = f"SELECT META().id AS id, n FROM {KS} WHERE age = $1 AND name = $2"
    c, ks = env.client, env.client.keyspace(KS)

    def guessed() -> bool:
        rows = c.query(sql, [98, "guess"])
        assert list(rows) == []
        return bool(rows.metrics.details["guessed"])

    for i in range(5):
        wait_for(guessed, 30, what="a run at the last pinned TS")
        docid, n = f"guess{i}", 30_000 + i
        ks.upsert(docid, {"age": 98, "name": "guess", "n": n})
        rows = c.query(sql, [98, "guess"])
        assert list(rows) == [{"id": docid, "n": n}], i
        assert rows.metrics.details["leaves"] > 1 and not rows.metrics.details["guessed"]
        ks.delete(docid)


LATE = f"SELECT META().id AS id, city, n, age FROM {KS} WHERE age >= $1"


@pytest.mark.timeout(600)
def test_order_limit_over_several_leaves_fetches_late_and_equals_the_plain_path(env: Env) -> None:
    """by_age (age, name) over 4 partitions covers the filter and the order but not the
    projection: the leaves send sort keys and docids, the root fetches the rows it returns
    (EXPLAIN's ``late_fetch``); rows as the leaves fetching give them, with ties in ORDER BY,
    OFFSET, a filter on a key part and a top-N sort at the leaves."""
    c = env.client
    plan = first(c.query(f"EXPLAIN {LATE} ORDER BY age, META().id LIMIT 20", [30]))
    assert plan["distributed"]["index"]["late_fetch"] is True
    assert "Fetch" not in plan["distributed"]["fragments"][1]["does"]
    for sql, params in [
        (f"{LATE} ORDER BY age, META().id LIMIT 20", [30]),
        (f"{LATE} AND name != 'bob' ORDER BY age, name, META().id LIMIT 9 OFFSET 4", [25]),
        (f"{LATE} AND age <= 50 ORDER BY age DESC, META().id LIMIT 12", [40]),
    ]:
        env.check(sql, params)
    ties = f"{LATE} ORDER BY age LIMIT 25 OFFSET 3"  # many documents per age
    for consistency in ("request_plus", "not_bounded"):
        late = list(c.query(ties, [30], consistency))
        plain = list(c.query(ties, [30], consistency, tuning={"late": False}))
        assert late == plain and len(late) == 25


@pytest.mark.timeout(600)
def test_late_fetch_skips_documents_deleted_after_the_index_read_them(env: Env) -> None:
    """At not_bounded the index may still hold entries of documents deleted just before:
    the root finds them gone and takes the next candidates (or the statement runs again
    with the leaves fetching); the rows are the reference's all the same."""
    ks = env.client.keyspace(KS)
    added = {
        f"late{i:02d}": {"age": 150 + i % 4, "name": "lou", "n": 50_000 + i} for i in range(40)
    }
    sql = f"{LATE} ORDER BY age, META().id LIMIT 10"
    try:
        for docid, doc in added.items():
            ks.upsert(docid, doc)
            env.ref.keyspaces[KS][docid] = doc
        first_rows = env.check(sql, [150])  # request_plus: every entry indexed now
        for round_ in range(3):
            gone = [r["id"] for r in first_rows[round_ : round_ + 4]]
            for docid in gone:
                ks.delete(docid)
                env.ref.keyspaces[KS].pop(docid, None)
            got = list(env.client.query(sql, [150], "not_bounded"))
            assert _numbers(got) == _numbers(env.ref.query(sql, [150])), round_
            first_rows = got
    finally:
        for docid in added:
            if docid in env.ref.keyspaces[KS]:
                ks.delete(docid)
                env.ref.keyspaces[KS].pop(docid)

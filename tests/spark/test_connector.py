"""The ``shardex`` Spark format for users (``shardex.spark``) on the shared 3-node cluster and
the session's SparkSession: writes read back equal, a pushed-down filter visible in the plan
with the same rows as the snapshot read, a stream that sees inserts and deletes, and bad
options failing ``load()`` with the option named. Every expectation is this module's own
model of the documents it wrote."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

import shardex.spark
from shardex.spark.options import offsets_json

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster
    from pyspark.sql import DataFrame, SparkSession

KEYSPACE = "connector"
WAIT = 240.0  # seconds: an index build or a stream's first batch on a loaded 2-core box

SCHEMA = (
    "_id string, name string, age long, address struct<city:string,zip:long>, tags array<string>"
)


def people(n: int, start: int = 0) -> list[dict[str, Any]]:
    cities = ["paris", "rome", "oslo", "lima"]
    return [
        {
            "_id": f"p{i:04d}",
            "name": f"name{i % 7}",
            "age": i % 50,
            "address": {"city": cities[i % 4], "zip": 1000 + i},
            "tags": [f"t{i % 3}", f"t{i % 5}"],
        }
        for i in range(start, start + n)
    ]


def as_model(rows: list[Any]) -> dict[str, dict[str, Any]]:
    """docid -> the row's fields (``_deleted`` dropped, nulls kept)."""
    out = {}
    for r in rows:
        d = r.asDict(recursive=True)
        d.pop("_deleted", None)
        out[d.pop("_id")] = d
    return out


def strip_id(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["_id"]: {k: v for k, v in d.items() if k != "_id"} for d in docs}


class Env:
    def __init__(self, spark: SparkSession, cluster: SharedCluster) -> None:
        self.spark = spark
        self.cluster = cluster
        self.client = cluster.client

    def reader(self, **options: str) -> Any:
        opts = {"cluster": str(self.cluster.path), "keyspace": KEYSPACE, **options}
        return self.spark.read.format("shardex").options(**opts)

    def write(
        self, rows: list[dict[str, Any]], mode: str, schema: str = SCHEMA, **options: str
    ) -> None:
        df = self.spark.createDataFrame(rows, schema)
        opts = {"cluster": str(self.cluster.path), "keyspace": KEYSPACE, **options}
        df.write.format("shardex").options(**opts).mode(mode).save()


def formatted_plan(df: DataFrame) -> str:
    jvm = df.sparkSession._jvm
    assert jvm is not None
    return jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "formatted")


@pytest.fixture(scope="module")
def env(spark: SparkSession, shared_cluster: SharedCluster) -> Iterator[Env]:
    shardex.spark.register(spark)
    with shared_cluster.keyspace(KEYSPACE, num_partitions=4):
        yield Env(spark, shared_cluster)


@pytest.mark.timeout(600)
def test_append_then_overwrite_read_back_equal(env: Env) -> None:
    docs = people(40)
    env.write(docs, "append")
    got = env.reader().load()
    # the inferred schema: _id first, the fields by name, _deleted last
    assert got.columns == ["_id", "address", "age", "name", "tags", "_deleted"]
    assert as_model(got.collect()) == strip_id(docs)
    # one Spark partition per data partition, each a snapshot at the recorded vector
    assert got.rdd.getNumPartitions() == 4
    assert env.client.keyspace(KEYSPACE).get("p0003") == strip_id(docs)["p0003"]

    # append upserts: changed rows replace their documents, new ones are added
    changed = [{**d, "age": 99} for d in docs[:5]] + people(5, start=40)
    env.write(changed, "append", durability="majority")
    model = {**strip_id(docs), **strip_id(changed)}
    assert as_model(env.reader().schema(SCHEMA).load().collect()) == model

    # a row flagged _deleted deletes its document (an absent one is no error)
    gone = [{"_id": "p0007", "_deleted": True}, {"_id": "nobody", "_deleted": True}]
    env.write(gone, "append", schema="_id string, _deleted boolean")
    del model["p0007"]
    assert as_model(env.reader().schema(SCHEMA).load().collect()) == model

    # overwrite: the keyspace holds exactly what was written
    before = env.client.high_seqnos(KEYSPACE)
    kept = people(10, start=100)
    env.write(kept, "overwrite")
    assert as_model(env.reader().schema(SCHEMA).load().collect()) == strip_id(kept)
    # a read at a recorded vector is the keyspace as it was then
    then = env.reader(snapshot_ts=offsets_json(before)).schema(SCHEMA).load()
    assert as_model(then.collect()) == model


@pytest.mark.timeout(600)
def test_bad_options_fail_the_load_with_the_option_named(env: Env) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    failures = (PySparkException, Py4JJavaError)
    with pytest.raises(failures) as info:
        env.reader(keyspace="no_such_keyspace").load()
    assert "KEYSPACE_NOT_FOUND" in str(info.value) and "no_such_keyspace" in str(info.value)
    with pytest.raises(failures) as info:
        env.reader(consistency="eventually").load()
    assert "'consistency'" in str(info.value) and "eventually" in str(info.value)
    with pytest.raises(failures) as info:
        env.reader(index="no_such_index").schema(SCHEMA).load().collect()
    assert "INDEX_NOT_FOUND" in str(info.value) and "no_such_index" in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_filters_pushed_to_an_index_give_the_snapshot_rows(env: Env) -> None:
    docs = people(200, start=1000)
    env.write(docs, "append")
    env.client.create_index(KEYSPACE, "conn_by_age", ["age"])
    env.client.wait_for_index(KEYSPACE, "conn_by_age", timeout=WAIT)
    everything = as_model(env.reader().schema(SCHEMA).load().collect())

    df = env.reader(consistency="request_plus").schema(SCHEMA).load()
    pushed = df.where("age >= 40 AND name = 'name3'")
    plan = formatted_plan(pushed)
    assert "PushedFilters: [GreaterThanOrEqual(age,40)]" in plan, plan
    want = {k: v for k, v in everything.items() if v["age"] >= 40 and v["name"] == "name3"}
    assert want and as_model(pushed.collect()) == want

    # no index on name: nothing pushed, the same answer from the snapshot read
    by_name = df.where("name = 'name3'")
    assert "PushedFilters" not in formatted_plan(by_name)  # Spark shows none
    want = {k: v for k, v in everything.items() if v["name"] == "name3"}
    assert as_model(by_name.collect()) == want

    # a forced index: the filters on its key pushed; without one it cannot serve the read
    forced = env.reader(index="conn_by_age", consistency="request_plus").schema(SCHEMA).load()
    young = forced.where("age < 3")
    assert "PushedFilters: [LessThan(age,3)]" in formatted_plan(young)
    want = {k: v for k, v in everything.items() if v["age"] < 3}
    assert want and as_model(young.collect()) == want
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        env.reader(index="conn_by_age").schema(SCHEMA).load().collect()
    assert "option 'index'" in str(info.value) and "conn_by_age" in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stream_sees_inserts_and_deletes(env: Env, tmp_path: Path) -> None:
    ks = env.client.keyspace(KEYSPACE)
    start = env.client.high_seqnos(KEYSPACE)
    inserted = people(6, start=5000)
    for d in inserted:
        ks.upsert(d["_id"], {k: v for k, v in d.items() if k != "_id"})
    ks.delete("p5001")
    ks.delete("p5004")

    stream = (
        env.spark.readStream.format("shardex")
        .options(cluster=str(env.cluster.path), keyspace=KEYSPACE)
        .option("starting_offsets", offsets_json(start))
        .schema(SCHEMA + ", _deleted boolean")
        .load()
    )
    seen: list[Any] = []
    query = (
        stream.writeStream.foreachBatch(lambda df, _id: seen.extend(df.collect()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(WAIT), "the availableNow query did not finish"
    finally:
        query.stop()
    changes = [(r["_id"], r["_deleted"], r["age"]) for r in seen]
    # every change once, in seqno order per document: nothing else wrote to the keyspace
    assert sorted(changes, key=str) == sorted(
        [(d["_id"], False, d["age"]) for d in inserted]
        + [("p5001", True, None), ("p5004", True, None)],
        key=str,
    )
    # the offsets are seqno vectors: the query ended at the keyspace's vector
    progress = query.lastProgress
    assert progress is not None
    end = progress["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    assert end == env.client.high_seqnos(KEYSPACE).to_json()

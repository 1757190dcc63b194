"""The Spark change-stream source against a real 3-node cluster.

Few tests, each checking exact record sets (every mutation once, nothing from outside the
requested range) because that is what the index pipeline's correctness rests on. Planning
rules (ranges, task grouping, read limits) are pure functions tested here without Spark.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from data_helpers import docids_in, owner_of, running_cluster

from shardex.client import Client, connect_local
from shardex.core.timestamp import Timestamp
from shardex.pipeline.source.datasource import SourceOptions
from shardex.pipeline.source.follow import FollowSet
from shardex.pipeline.source.plan import group_ranges, limit_offsets, plan_ranges
from shardex.pipeline.source.read import (
    ARROW_SCHEMA,
    SCHEMA_DDL,
    PartitionRange,
    parse_rollback,
    read_ranges,
)

KEYSPACE = "docs"
NUM_PARTITIONS = 16

# (partition, seqno) -> (docid, deleted, body bytes or None)
Expected = dict[tuple[int, int], tuple[str, bool, bytes | None]]


@dataclass
class Cluster:
    path: Path
    client: Client
    options: dict[str, str]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    path = tmp_path_factory.mktemp("spark-source") / "cluster"
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=NUM_PARTITIONS)
        yield Cluster(path, client, {"cluster_dir": str(path), "keyspace": KEYSPACE})


def write_wave(client: Client, tag: str, n: int) -> Expected:
    """Inserts, updates (some twice), deletes and a re-insert; returns every mutation by
    (partition, seqno) as acknowledged."""
    ks = client.keyspace(KEYSPACE)
    out: Expected = {}

    def record(r: Any, docid: str, doc: dict[str, Any] | None) -> None:
        body = None if doc is None else json.dumps(doc, separators=(",", ":")).encode()
        out[(r.partition, r.seqno)] = (docid, doc is None, body)

    docs = [(f"{tag}-{i}", {"i": i, "tag": tag}) for i in range(n)]
    results = ks.upsert_many(docs)
    for (docid, doc), r in zip(docs, results, strict=True):
        record(r, docid, doc)
    for i in range(0, n, 3):  # updates
        doc = {"i": i, "tag": tag, "v": 2}
        record(ks.upsert(f"{tag}-{i}", doc), f"{tag}-{i}", doc)
    for i in range(0, n, 9):  # a second update of some
        doc = {"i": i, "tag": tag, "v": 3}
        record(ks.upsert(f"{tag}-{i}", doc), f"{tag}-{i}", doc)
    for i in range(1, n, 7):  # deletes
        record(ks.delete(f"{tag}-{i}"), f"{tag}-{i}", None)
    doc = {"i": 1, "tag": tag, "back": True}  # re-insert of a deleted docid
    record(ks.upsert(f"{tag}-1", doc), f"{tag}-1", doc)
    return out


def rows_by_position(rows: list[Any]) -> Expected:
    got: Expected = {}
    for r in rows:
        key = (r["partition"], r["seqno"])
        assert key not in got, f"record {key} read twice"
        body = None if r["body"] is None else bytes(r["body"])
        got[key] = (r["docid"], r["deleted"], body)
    return got


def normalize(expected: Expected) -> Expected:
    """Bodies as the data node stores them (the client encodes with msgspec)."""
    return {
        k: (d, dead, None if b is None else json.dumps(json.loads(b)).encode())
        for k, (d, dead, b) in expected.items()
    }


def assert_seqno_order(rows: list[Any]) -> None:
    last: dict[int, int] = {}
    for r in rows:
        p, s = r["partition"], r["seqno"]
        assert s > last.get(p, 0), f"partition {p}: seqno {s} after {last.get(p)}"
        last[p] = s


@pytest.fixture(scope="module")
def first_wave(cluster: Cluster) -> tuple[Timestamp, Timestamp, Expected]:
    before = cluster.client.high_seqnos(KEYSPACE)
    expected = write_wave(cluster.client, "a", 120)
    after = cluster.client.high_seqnos(KEYSPACE)
    return before, after, expected


# --- Spark ------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_batch_read_between_timestamps_and_snapshot(
    spark: Any, cluster: Cluster, first_wave: tuple[Timestamp, Timestamp, Expected]
) -> None:
    before, after, expected = first_wave
    write_wave(cluster.client, "late", 20)  # after `after`: must not be read

    df = (
        spark.read.format("shardex")
        .options(**cluster.options)
        .option("start_ts", json.dumps(before.to_json()))
        .option("end_ts", json.dumps(after.to_json()))
        .load()
    )
    assert df.rdd.getNumPartitions() == 3  # one task per owner node
    rows = df.collect()
    assert normalize(rows_by_position(rows)) == normalize(expected)
    assert_seqno_order(rows)
    assert {(r["partition"], r["uuid"]) for r in rows} <= {(p, e.uuid) for p, e in after.items()}

    # The documents as of `after`: last version per docid, deletions gone.
    state: dict[str, bytes | None] = {}
    for _, (docid, _dead, body) in sorted(normalize(expected).items(), key=lambda kv: kv[0][1]):
        state[docid] = body
    snap = (
        spark.read.format("shardex")
        .options(**cluster.options)
        .option("mode", "snapshot")
        .option("snapshot_ts", json.dumps(after.to_json()))
        .load()
        .collect()
    )
    got = {r["docid"]: json.dumps(json.loads(bytes(r["body"]))).encode() for r in snap}
    assert got == {d: b for d, b in state.items() if b is not None}
    assert not any(r["deleted"] for r in snap)


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("reader", "trigger"),
    # The range-reading driver reader shares its offsets with the partitioned one and its
    # reads with the follow reader's recovery; the rollback test runs it.
    [("partitioned", "availableNow"), ("follow", "continuous")],
)
def test_stream_is_incremental_and_resumes_from_checkpoint(
    spark: Any,
    cluster: Cluster,
    first_wave: tuple[Timestamp, Timestamp, Expected],
    tmp_path: Path,
    reader: str,
    trigger: str,
) -> None:
    start = cluster.client.high_seqnos(KEYSPACE)
    seen: list[Any] = []
    batches: list[int] = []

    def sink(batch_df: Any, batch_id: int) -> None:
        seen.extend(batch_df.collect())
        batches.append(batch_id)

    def run_once(expected: Expected) -> dict[str, Any]:
        writer = (
            spark.readStream.format("shardex")
            .options(**cluster.options)
            .option("starting_offsets", json.dumps(start.to_json()))
            .option("reader", reader)
            .option("max_records_per_batch", "60")
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
        )
        if trigger == "availableNow":
            query = writer.trigger(availableNow=True).start()
            query.awaitTermination(120)
        else:
            # Runs until every expected record was seen and its batch committed (progress is
            # reported after the commit), then stops: the restart must not re-read it.
            query = writer.trigger(processingTime="0 seconds").start()
            try:
                wait_for(lambda: set(expected) <= {(r["partition"], r["seqno"]) for r in seen})
                wait_for(lambda: (query.lastProgress or {}).get("batchId", -1) >= batches[-1])
            finally:
                query.stop()
        assert query.exception() is None
        return query.lastProgress

    wave2 = write_wave(cluster.client, f"b-{reader}", 60)
    progress = run_once(wave2)
    assert normalize(rows_by_position(seen)) == normalize(wave2)
    assert len(batches) >= 2  # the row limit split the wave
    assert_seqno_order(seen)
    end2 = Timestamp.from_json(json.loads(progress["sources"][0]["endOffset"]))
    assert end2 == cluster.client.high_seqnos(KEYSPACE)

    # Restart from the checkpoint: only what came after the last committed batch.
    seen.clear()
    last_batch = batches[-1]
    wave3 = write_wave(cluster.client, f"c-{reader}", 30)
    run_once(wave3)
    assert normalize(rows_by_position(seen)) == normalize(wave3)
    assert min(batches[batches.index(last_batch) + 1 :]) == last_batch + 1


def wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_forged_uuid_surfaces_rollback(
    spark: Any, cluster: Cluster, first_wave: tuple[Timestamp, Timestamp, Expected], tmp_path: Path
) -> None:
    _, after, _ = first_wave
    p = next(p for p, e in after.items() if e.seqno >= 2)
    # A position inside the partition's history, but on a branch it never had.
    forged = after.with_entry(p, after[p].seqno - 1, after[p].uuid ^ 0x5A5A)

    # Batch: the worker's stream open is refused by the data node.
    with pytest.raises(Exception) as batch_err:
        (
            spark.read.format("shardex")
            .options(**cluster.options)
            .option("start_ts", json.dumps(forged.to_json()))
            .option("end_ts", json.dumps(after.to_json()))
            .load()
            .collect()
        )
    info = parse_rollback(batch_err.value)
    assert info is not None and (info.keyspace, info.partition) == (KEYSPACE, p)
    assert info.rollback_seqno == 0  # an unknown uuid shares no provable history

    # Streaming: the driver's latestOffset sees the branch differ and checks it.
    query = (
        spark.readStream.format("shardex")
        .options(**cluster.options)
        .option("starting_offsets", json.dumps(forged.to_json()))
        .option("reader", "driver")
        .load()
        .writeStream.foreachBatch(lambda df, i: None)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as stream_err:
        query.awaitTermination(120)
    info = parse_rollback(stream_err.value)
    assert info is not None and info.partition == p and info.rollback_seqno == 0


# --- a partition migrating mid-read, no Spark -----------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_reads_follow_a_migrating_partition(cluster: Cluster) -> None:
    """Range reads and live follow streams while a partition moves to another node under
    writes: every seqno exactly once, none skipped or renumbered (NOT_MY_PARTITION or a
    closed stream -> refresh -> resume)."""
    client = cluster.client
    p = 5
    ids = docids_in(p, NUM_PARTITIONS, 300, "mig")
    client.keyspace(KEYSPACE).upsert_many((d, {"v": 0}) for d in ids[:50])
    t0 = client.high_seqnos(KEYSPACE)
    follows = FollowSet(client, KEYSPACE)
    follows.sync_to(t0)
    owner = owner_of(client, KEYSPACE, p)
    target = next(n for n in ("node1", "node2", "node3") if n != owner)
    stop = threading.Event()
    problems: list[str] = []

    def write() -> None:
        ks = client.keyspace(KEYSPACE)
        for d in ids[50:]:
            if stop.is_set():
                return
            ks.upsert(d, {"v": 1})

    def read_ranges_meanwhile() -> None:
        while not stop.is_set():
            now = client.high_seqnos(KEYSPACE)
            got = [
                s
                for b in read_ranges(client, KEYSPACE, plan_ranges(KEYSPACE, t0, now))
                for s in b.column("seqno").to_pylist()
            ]
            want = sum(now[q].seqno - t0[q].seqno for q in now)
            if len(got) != want:
                problems.append(f"range read of {want} records returned {len(got)}")

    threads = [threading.Thread(target=write), threading.Thread(target=read_ranges_meanwhile)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        assert client.move_partition(KEYSPACE, p, target).state == "done"
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert owner_of(client, KEYSPACE, p) == target
    end = client.high_seqnos(KEYSPACE)
    assert not problems

    seqnos = [
        s
        for b in read_ranges(
            client,
            KEYSPACE,
            [PartitionRange(p, t0[p].seqno, t0[p].uuid, end[p].seqno, end[p].uuid)],
        )
        for s in b.column("seqno").to_pylist()
    ]
    assert seqnos == list(range(t0[p].seqno + 1, end[p].seqno + 1))

    followed: list[int] = []
    try:
        wait_for(lambda: _drain(follows, p, followed) == end, timeout=30)
    finally:
        follows.close()
    assert followed == list(range(t0[p].seqno + 1, end[p].seqno + 1))
    assert follows.resumes >= 1  # the stream on the old owner was cut and resumed


def _drain(follows: FollowSet, partition: int, into: list[int]) -> Timestamp:
    chunks, handed = follows.take()
    into.extend(c.seqno for ch in chunks if ch.partition == partition for c in ch.changes)
    return handed


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_projected_read_hands_spark_the_key_versions(
    spark: Any, cluster: Cluster, first_wave: tuple[Timestamp, Timestamp, Expected]
) -> None:
    """With ``project`` the read tasks project where they read: Spark gets exactly the key
    versions that the projector makes of the plain read's changes (error rows: the unit
    test; a worker has no test-only function to raise one here)."""
    from shardex.index import make_definition
    from shardex.index.keyversion import from_arrow
    from shardex.pipeline.project.projector import project_arrow
    from shardex.pipeline.source.projected import ProjectSpec

    before, after, _ = first_wave
    defs = [
        make_definition(id="by_i", name="by_i", keyspace=KEYSPACE, keys=["i"], where="v = 2"),
        make_definition(
            id="by_tag",
            name="by_tag",
            keyspace=KEYSPACE,
            keys=["tag", "v"],
            partition_by=["META().id"],
            num_partition=3,
        ),
    ]
    between = {
        **cluster.options,
        "start_ts": json.dumps(before.to_json()),
        "end_ts": json.dumps(after.to_json()),
    }
    plain = spark.read.format("shardex").options(**between).load().toArrow()
    expected: list[tuple[Any, ...]] = []
    for batch in plain.to_batches():
        kv, _ = project_arrow(defs, batch)
        expected.extend(from_arrow(kv))
    projected = (
        spark.read.format("shardex")
        .options(**between, project=ProjectSpec.definitions_option(defs))
        .load()
        .toArrow()
    )
    got = [row for b in projected.to_batches() for row in from_arrow(b)]
    assert len(expected) == 2 * plain.num_rows  # one key version per change and index
    assert sorted(got) == sorted(expected)


# --- schema, planning and options ---------------------------------------------------------------


def test_arrow_schema_matches_spark(spark: Any) -> None:
    """Spark rejects a returned RecordBatch whose schema differs in any field."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    assert to_arrow_schema(StructType.fromDDL(SCHEMA_DDL), timezone="UTC").equals(ARROW_SCHEMA)
    from shardex.index.keyversion import KEY_VERSION_DDL, KEY_VERSION_SCHEMA
    from shardex.pipeline.source.projected import COUNTS_ARROW, COUNTS_SCHEMA

    # The projected modes' schemas, likewise.
    for ddl, arrow in ((KEY_VERSION_DDL, KEY_VERSION_SCHEMA), (COUNTS_SCHEMA, COUNTS_ARROW)):
        assert to_arrow_schema(StructType.fromDDL(ddl), timezone="UTC").equals(arrow)


def test_plan_ranges_and_grouping() -> None:
    start = Timestamp({0: (5, 7), 1: (3, 7), 2: (0, 0)})
    end = Timestamp({0: (9, 7), 1: (3, 7), 2: (4, 8), 3: (2, 9)})
    ranges = plan_ranges("k", start, end)
    assert ranges == [
        PartitionRange(0, 5, 7, 9, 7),
        PartitionRange(2, 0, 0, 4, 8),
        PartitionRange(3, 0, 0, 2, 9),
    ]
    owners = {0: "n1", 2: "n2", 3: "n1"}
    assert [[r.partition for r in g] for g in group_ranges(ranges, owners, "owner")] == [
        [0, 3],
        [2],
    ]
    assert len(group_ranges(ranges, owners, "partition")) == 3
    assert sorted(len(g) for g in group_ranges(ranges, owners, 2)) == [1, 2]
    with pytest.raises(Exception) as err:
        plan_ranges("k", Timestamp({0: (10, 7)}), Timestamp({0: (9, 7)}))
    info = parse_rollback(err.value)
    assert info is not None and (info.partition, info.rollback_seqno) == (0, 9)


def test_limit_offsets_is_exact_and_fair() -> None:
    start = Timestamp({0: (0, 0), 1: (10, 5), 2: (0, 0), 3: (7, 5)})
    end = Timestamp({0: (2, 5), 1: (110, 5), 2: (50, 6), 3: (7, 5)})
    cut = limit_offsets(start, end, 40)
    taken = {p: cut[p].seqno - start[p].seqno for p in end}
    assert sum(taken.values()) == 40
    assert taken == {0: 2, 1: 19, 2: 19, 3: 0}
    assert cut[1].uuid == 5 and cut[2].uuid == 6
    assert limit_offsets(start, end, 1000) == end


def test_options_are_checked() -> None:
    with pytest.raises(Exception, match="keyspace"):
        SourceOptions.parse({"addresses": "127.0.0.1:1", "secret": "s"})
    with pytest.raises(Exception, match="cluster_dir"):
        SourceOptions.parse({"keyspace": "k"})
    with pytest.raises(Exception, match="timestamp"):
        SourceOptions.parse({"keyspace": "k", "addresses": "a:1", "secret": "s", "end_ts": "[1]"})
    opts = SourceOptions.parse(
        {"keyspace": "k", "addresses": "a:1, b:2", "secret": "hush-42", "tasks": "3"}
    )
    assert opts.endpoint.access.addresses == ("a:1", "b:2") and opts.tasks == 3
    assert "hush-42" not in repr(opts)  # plans and logs print partitions and options

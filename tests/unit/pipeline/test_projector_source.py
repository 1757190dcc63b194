"""Projected reads of the change source (``source/projected.py``): the options that select them,
and that a read task's projection is the projector's, error rows included. The load path
(LoadChunk from the read task) runs end to end in tests/spark/test_pipeline.py's builds."""

from __future__ import annotations

import json
import pickle

import msgspec
import pyarrow as pa
import pytest

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index import ERROR, UPSERT, make_definition
from shardex.index.keyversion import KEY_VERSION_DDL, KEY_VERSION_SCHEMA, from_arrow
from shardex.pipeline.project.projector import project_arrow
from shardex.pipeline.source.options import ChangeRangesPartition, SourceOptions, task_partitions
from shardex.pipeline.source.projected import (
    COUNTS_SCHEMA,
    LoadSpec,
    ProjectSpec,
    project_batches,
)
from shardex.pipeline.source.types import ARROW_SCHEMA, SCHEMA_DDL, PartitionRange
from shardex.testing.index import EXPLODE

A = make_definition(
    id="a", name="a", keyspace="ks", keys=[f"{EXPLODE}(age)"], where="type = 'user'"
)
B = make_definition(
    id="b", name="b", keyspace="ks", keys=["city"], partition_by=["city"], num_partition=2
)
T0 = Timestamp({0: (7, 11), 1: (3, 11)})
BASE = {"keyspace": "ks", "addresses": "127.0.0.1:1", "secret": "s"}


def parse(**extra: str) -> SourceOptions:
    return SourceOptions.parse({**BASE, **extra})


def load_options() -> dict[str, str]:
    return {
        "mode": "snapshot",
        "snapshot_ts": json.dumps(T0.to_json()),
        "project": ProjectSpec.definitions_option([A, B]),
        "load": LoadSpec(T0, {"a": ("n1",), "b": ("n1", "n2")}).to_option(),
    }


def changes(rows: list[tuple[str, int, int, bool, object]]) -> pa.RecordBatch:
    """A batch in the change source's schema from (docid, partition, seqno, deleted, doc)."""
    enc = msgspec.json.encode
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([r[1] for r in rows], pa.int32()),
            pa.array([r[2] for r in rows], pa.int64()),
            pa.array([11] * len(rows), pa.int64()),
            pa.array([1] * len(rows), pa.int64()),
            pa.array([r[3] for r in rows], pa.bool_()),
            pa.array([None if r[3] else enc(r[4]) for r in rows], pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )


def test_the_options_choose_what_spark_receives() -> None:
    assert parse().schema_ddl == SCHEMA_DDL
    projected = parse(project=ProjectSpec.definitions_option([A, B]))
    assert projected.schema_ddl == KEY_VERSION_DDL
    assert projected.project is not None and projected.project.definitions == (A, B)
    loading = parse(**load_options())
    assert loading.schema_ddl == COUNTS_SCHEMA
    assert loading.project is not None and loading.project.load is not None
    assert loading.project.load.ts0 == T0
    assert loading.project.load.owners == {"a": ("n1",), "b": ("n1", "n2")}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"project": "[{"}, "not a list of index definitions"),
        ({"project": "[]"}, "names no index"),
        ({"project": ""}, "needs 'project'"),  # load without project
        ({"mode": "changes"}, "needs mode=snapshot"),
        ({"snapshot_ts": json.dumps(Timestamp({0: (8, 11)}).to_json())}, "same TS"),
        ({"load": LoadSpec(T0, {"a": ("n1",)}).to_option()}, "no slice owners for index"),
        ({"load": '{"ts0": 1}'}, "not a load spec"),
    ],
)
def test_bad_projection_options_are_config_errors(change: dict[str, str], match: str) -> None:
    opts = {**load_options(), **change}
    with pytest.raises(ShardexError, match=match) as err:
        SourceOptions.parse({**BASE, **opts})
    assert err.value.code is ErrorCode.CONFIG_ERROR


def test_partitions_carry_the_projection_to_the_workers() -> None:
    opts = parse(**load_options())
    ranges = [PartitionRange(0, 0, 0, 7, 11), PartitionRange(1, 0, 0, 3, 11)]
    parts = task_partitions(opts, ranges, {0: "n1", 1: "n2"}, snapshot=True)
    assert len(parts) == 2
    back = pickle.loads(pickle.dumps(parts[0]))  # what Spark does to reach a worker
    assert isinstance(back, ChangeRangesPartition)
    assert back.project == opts.project and back.snapshot


def test_projected_batches_equal_the_projector_with_error_rows() -> None:
    batch = changes(
        [
            ("u1", 0, 1, False, {"type": "user", "age": 30, "city": "Oslo"}),
            ("u2", 0, 2, False, {"type": "bot", "age": 5, "city": "Rome"}),
            ("u3", 1, 1, True, None),
            ("u4", 1, 2, False, {"type": "user", "age": "boom", "city": "Oslo"}),
        ]
    )
    out = list(project_batches([A, B], [batch, changes([])]))
    assert len(out) == 1  # an empty input batch yields nothing
    assert out[0].schema.equals(KEY_VERSION_SCHEMA)
    expected, res = project_arrow([A, B], batch, error_rows=True)
    assert from_arrow(out[0]) == from_arrow(expected)
    rows = from_arrow(out[0])
    assert res.errors == {"a": 1}
    assert [r[4] for r in rows if r[2] == ERROR] == ["u4"]  # the error reaches the driver
    assert {(r[0], r[4]) for r in rows if r[2] == UPSERT} == {
        ("a", "u1"),
        ("b", "u1"),
        ("b", "u2"),
        ("b", "u4"),
    }


def test_maintenance_streams_are_capped_unless_lifted() -> None:
    """Admission control: the stream's batches are capped by default, so a backlog drains as
    moderate batches (each read and projected on the driver), and the cap reaches the
    source's offset planning, which cuts the end offset exactly."""
    from shardex.pipeline.maintain import (
        DEFAULT_DRIVER_READ_MAX,
        DEFAULT_MAX_RECORDS,
        stream_options,
    )
    from shardex.pipeline.source.plan import limit_offsets

    start = Timestamp({0: (5, 11)})
    opts = stream_options(BASE, "ks", start)
    assert opts["max_records_per_batch"] == str(DEFAULT_MAX_RECORDS)
    assert DEFAULT_MAX_RECORDS <= DEFAULT_DRIVER_READ_MAX  # capped batches stay on the driver
    assert Timestamp.from_json(json.loads(opts["starting_offsets"])) == start
    parsed = SourceOptions.parse(opts)
    assert parsed.max_records_per_batch == DEFAULT_MAX_RECORDS
    assert "max_records_per_batch" not in stream_options(
        {**BASE, "max_records_per_batch": "0"}, "ks", None
    )
    assert (
        stream_options({**BASE, "max_records_per_batch": "7"}, "ks", None)["max_records_per_batch"]
        == "7"
    )
    # A backlog of 3 x 30k over three partitions cut at the default cap: exactly the cap.
    begin = Timestamp({p: (0, 11) for p in range(3)})
    backlog = Timestamp({p: (30_000, 11) for p in range(3)})
    cut = limit_offsets(begin, backlog, DEFAULT_MAX_RECORDS)
    assert sum(cut[p].seqno for p in range(3)) == DEFAULT_MAX_RECORDS
    assert max(cut[p].seqno for p in range(3)) - min(cut[p].seqno for p in range(3)) <= 1


def test_gc_pause_nests_and_restores_the_state_it_found() -> None:
    import gc

    from shardex.core.gcpause import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # a second keyspace's batch overlapping the first
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer batch still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failing batch")
    assert gc.isenabled()

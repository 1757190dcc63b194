"""The driver's read + project (``pipeline/source/driver_read.py``) against the path it replaced
(``read_ranges`` -> ``project_arrow(error_rows=True)`` -> ``from_arrow``) on a live cluster:
the same key versions, each change of (start, end] exactly once per index, error rows kept."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import ERROR, KeyVersion, from_arrow
from shardex.meta.index_definition import IndexDefinition, IndexKey
from shardex.pipeline.project.projector import project_arrow
from shardex.pipeline.source.driver_read import read_and_project
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import read_ranges

pytestmark = pytest.mark.cluster

KEYSPACE = "dr"
PARTITIONS = 8
DEFS = [
    IndexDefinition(
        id="dr.1",
        name="by_name",
        keyspace=KEYSPACE,
        keys=[IndexKey(expr="name"), IndexKey(expr="n", desc=True)],
        partition_by=["META().id"],
        num_partition=4,
    ),
    IndexDefinition(
        id="dr.2", name="by_n", keyspace=KEYSPACE, keys=[IndexKey(expr="n")], where="n > 10"
    ),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    path: Path = tmp_path_factory.mktemp("driver-read") / "cluster"
    with running_cluster(path, nodes=2), connect_local(path) as c:
        c.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        yield c


def _reference(client: Client, start: Timestamp, end: Timestamp) -> list[KeyVersion]:
    out: list[KeyVersion] = []
    for b in read_ranges(client, KEYSPACE, plan_ranges(KEYSPACE, start, end)):
        kv, _ = project_arrow(DEFS, b, error_rows=True)
        out.extend(from_arrow(kv))
    return out


def _key(r: KeyVersion) -> tuple:
    return (r[0], r[5], r[6], r[2], r[1], r[3], r[4])


def test_same_key_versions_as_the_arrow_path(client: Client) -> None:
    ks = client.keyspace(KEYSPACE)
    ks.upsert_many([(f"d{i}", {"name": f"n{i % 17}", "n": i}) for i in range(600)])
    mid = client.high_seqnos(KEYSPACE)
    for i in range(0, 600, 5):
        ks.upsert(f"d{i}", {"name": f"m{i}", "n": -i})
    for i in range(1, 600, 7):
        ks.delete(f"d{i}")
    ks.upsert("big", {"name": "x" * 6000, "n": 50})  # entry over the size limit: an error
    end = client.high_seqnos(KEYSPACE)

    for start in (Timestamp({}), mid):
        got = read_and_project(client, KEYSPACE, DEFS, start, end)
        want = _reference(client, start, end)
        assert sorted(got, key=_key) == sorted(want, key=_key)
        # Each change of (start, end] once per index (errors add one ERROR row each).
        per_change = Counter((r[5], r[6]) for r in got if r[2] != ERROR)
        changes = sum(e.seqno - start.seqno(p) for p, e in end.items())
        assert len(per_change) == changes and set(per_change.values()) == {len(DEFS)}
    errors = [r for r in read_and_project(client, KEYSPACE, DEFS, mid, end) if r[2] == ERROR]
    assert [(r[0], r[4]) for r in errors] == [("dr.1", "big")]
    assert read_and_project(client, KEYSPACE, DEFS, end, end) == []

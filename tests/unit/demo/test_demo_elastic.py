"""Assumptions the demo's checks rest on, tested against the real index rules
(``shardex.index.oracle``): the ticker document of the elasticity step is in no index (so the
expected rows stay fixed while it ticks), and no generated user lives in the writer's city (so
a scan over that city returns only the writer's documents)."""

from __future__ import annotations

import pytest

from shardex.core.keycodec import decode_entry
from shardex.demo import elastic, scans
from shardex.demo.datagen import users
from shardex.index.oracle import evaluate_document
from shardex.meta.index_definition import IndexDefinition, make_definition

BY_CITY = make_definition(
    id="1.1.a",
    name="by_city",
    keyspace="users",
    keys=["address.city", "age"],
    partition_by=["META().id"],
    num_partition=4,
)
BY_STATUS = make_definition(
    id="1.2.b",
    name="by_status",
    keyspace="users",
    keys=["status", ("age", True)],
    where="age >= 18",
)


@pytest.mark.parametrize("defn", [BY_CITY, BY_STATUS], ids=["by_city", "by_status"])
def test_the_ticker_document_is_in_no_index(defn: IndexDefinition) -> None:
    for tick in (0, 1, 12345):
        assert evaluate_document(defn, elastic.Ticker.DOCID, {"ticker": tick}) is None


def test_a_generated_user_is_indexed_but_none_lives_in_the_writers_city() -> None:
    docs = list(users(3000, seed=42))
    assert all(d["address"]["city"] != scans.CITY for d in docs)
    assert evaluate_document(BY_CITY, docs[0]["id"], docs[0]) is not None
    moved = {**docs[0], "age": 33, "address": {**docs[0]["address"], "city": scans.CITY}}
    got = evaluate_document(BY_CITY, docs[0]["id"], moved)
    assert got is not None
    # the key the writer records for a moved document ([city, age]) is the key the index holds
    assert decode_entry(got[1]) == ([scans.CITY, 33], docs[0]["id"])


def test_moves_are_counted_by_kind() -> None:
    moved = {("users", "", 3), ("users", "", 4), ("users", "by_city", 1)}
    assert elastic.describe_moves(moved) == "3 partitions moved meanwhile (2 data, 1 index)"
    assert elastic.describe_moves(set()) == "0 partitions moved meanwhile (0 data, 0 index)"


def test_summary_of_a_rebalance_result(capsys: pytest.CaptureFixture[str]) -> None:
    def move(p: int, index: str, status: str = "done") -> dict:
        return {
            "keyspace": "users",
            "partition": p,
            "index": index,
            "status": status,
            "source": "node1",
            "target": "node4",
        }

    elastic.summarise(
        {
            "state": "done",
            "moves": [move(1, ""), move(2, ""), move(0, "by_city"), move(5, "", "failed")],
        }
    )
    out = capsys.readouterr().out
    assert "rebalance done: 2 data and 1 index partitions moved (of 4 planned), to node4" in out
    assert "users.by_city/0: node1 -> node4" in out

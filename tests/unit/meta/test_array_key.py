"""Array index keys: parsing, canonical text, validation and the entries a document gets."""

from __future__ import annotations

import json

import pytest

from shardex.core.keycodec import decode_entry
from shardex.core.values import MISSING
from shardex.errors import ShardexError
from shardex.index.keyversion import UPSERT, UPSERT_DELETION, unpack_entries
from shardex.index.oracle import evaluate_document, expected_entries
from shardex.meta.array_key import array_key_of, compile_elements
from shardex.meta.index_definition import make_definition
from shardex.pipeline.project.projector import Projector
from shardex.sql.ddl import parse_ddl, parse_index_key


def test_canonical_text_round_trips_and_shorthand_expands() -> None:
    k = array_key_of("distinct array lower(i.sku) for i in `items` when i.qty > 0 end")
    assert k is not None
    assert k.to_text() == "DISTINCT ARRAY LOWER(i.sku) FOR i IN items WHEN i.qty > 0 END"
    assert array_key_of(k.to_text()) == k
    assert array_key_of("ALL tags").to_text() == "ALL ARRAY v FOR v IN tags END"
    assert array_key_of("tags") is None
    assert array_key_of("distinctive") is None  # a field whose name starts with the word


def test_elements_follow_when_and_drop_missing() -> None:
    k = array_key_of("DISTINCT ARRAY i.sku FOR i IN items WHEN i.qty > 0 END")
    f = compile_elements(k)
    doc = {
        "items": [
            {"sku": "a", "qty": 1},
            {"sku": "b", "qty": 0},
            {"qty": 3},
            {"sku": "a", "qty": 2},
        ]
    }
    assert f(doc) == ["a", "a"]
    assert f({"items": "not an array"}) == []
    assert f({}) == []
    # A mapping that reads the document as well as the variable sees both.
    g = compile_elements(array_key_of("DISTINCT ARRAY [i, top] FOR i IN xs END"))
    assert g({"xs": [1, 2], "top": "t"}) == [[1, "t"], [2, "t"]]


def test_ddl_and_client_keys_take_array_keys() -> None:
    stmt = parse_ddl(
        "CREATE INDEX ix ON orders(status, DISTINCT ARRAY i.sku FOR i IN items END DESC)"
    )
    assert stmt.keys == (("status", False), ("DISTINCT ARRAY i.sku FOR i IN items END", True))
    assert parse_index_key("all array t for t in tags end") == (
        "ALL ARRAY t FOR t IN tags END",
        False,
    )


@pytest.mark.parametrize(
    ("keys", "fragment"),
    [
        (["DISTINCT a", "ALL b"], "at most one array key"),
        (["DISTINCT ARRAY v FOR v IN a WHEN v = $x END"], "parameter"),
    ],
)
def test_bad_array_keys_are_refused_by_name(keys: list[str], fragment: str) -> None:
    with pytest.raises(ShardexError) as err:
        make_definition(id="i1", name="ix", keyspace="ks", keys=keys)
    assert fragment in str(err.value)


def test_two_variables_are_a_syntax_error_naming_the_token() -> None:
    with pytest.raises(ShardexError) as err:
        parse_ddl("CREATE INDEX ix ON ks(DISTINCT ARRAY v FOR v IN a, w IN b END)")
    assert err.value.code.name == "SQL_SYNTAX"
    assert "binds one variable" in str(err.value) and "column 50" in str(err.value)


def _entries(defn, docid: str, doc: dict) -> list:
    res = Projector([defn]).project([(docid, 0, 1, "upsert", json.dumps(doc).encode())])
    (row,) = res.rows
    if row[2] == UPSERT_DELETION:
        return []
    assert row[2] == UPSERT
    assert (row[1], row[3]) == evaluate_document(defn, docid, doc)  # the oracle agrees
    return [decode_entry(e, defn.desc)[0] for e in unpack_entries(row[3])]


def test_one_entry_per_distinct_element_and_the_leading_rule() -> None:
    lead = make_definition(
        id="a1", name="ix", keyspace="ks", keys=["DISTINCT ARRAY t.k FOR t IN tags END", "n"]
    )
    doc = {"tags": [{"k": "b"}, {"k": "a"}, {"k": "b"}, {"x": 1}], "n": 7}
    assert _entries(lead, "d1", doc) == [["a", 7], ["b", 7]]
    assert _entries(lead, "d2", {"tags": [], "n": 1}) == []  # leading and empty: not indexed
    assert expected_entries(lead, {"d2": {"tags": [], "n": 1}}) == set()
    later = make_definition(id="a2", name="ix2", keyspace="ks", keys=["n", ("ALL tags", True)])
    assert _entries(later, "d3", {"n": 1, "tags": [3, 1, 3]}) == [[1, 3], [1, 1]]  # DESC order
    assert _entries(later, "d4", {"n": 2}) == [[2, MISSING]]  # still found by its leading key
    assert _entries(later, "d5", {"tags": [1]}) == []  # leading key MISSING

"""``entries.key_projection``: a covering leaf whose terms each read one key part or
``META().id`` makes its result values straight from the decoded keys. Whenever the rule
fires, the values equal what the scope rows and the projection make, over keys holding every
JSON type and MISSING, ASC and DESC parts, repeated keys and several docids per key."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.expr import MISSING
from shardex.core.expr.analysis import static_path
from shardex.core.keycodec import encode_entry
from shardex.sql.exec.entries import DOCID_PICK, EntryDecoder, key_projection
from shardex.sql.exec.fragment_rows import leaf_rows
from shardex.sql.exec.statements import bound_statement
from shardex.sql.planner.choose import key_exprs
from tests.unit.sql.budgets import budget

KEYS = ("a", "b.c")
PATHS = [static_path(k) for k in key_exprs(KEYS)]
VALUES: list[Any] = [MISSING, None, False, True, -2, 0, 1.5, "", "x", [], [1, "a"], {}, {"y": 2}]
TERMS = ["a", "b.c", "META().id", "META(t).id AS k", "t.a AS p", "b.c AS c2", "a AS a2"]


def _bound(terms: list[str]) -> Any:
    return bound_statement(f"SELECT {', '.join(terms)} FROM ks AS t WHERE a = 1", False)


def _through_scope_rows(b: Any, entries: list[bytes], desc: list[bool]) -> list[Any]:
    rows = EntryDecoder(desc, PATHS).covered_rows(entries, b.alias, True)
    return list(leaf_rows(b, None, "rows", None, budget(), rows, decided=True))


@settings(max_examples=150, deadline=None)
@given(
    terms=st.lists(st.sampled_from(TERMS), min_size=1, max_size=4, unique=True),
    keys=st.lists(
        st.tuples(st.sampled_from(range(len(VALUES))), st.sampled_from(range(len(VALUES)))),
        min_size=1,
        max_size=12,
    ),
    desc=st.lists(st.booleans(), min_size=2, max_size=2),
    docids=st.integers(min_value=1, max_value=3),
)
def test_values_from_the_keys_equal_the_projection_of_the_scope_rows(
    terms: list[str], keys: list[tuple[int, int]], desc: list[bool], docids: int
) -> None:
    b = _bound(terms)
    picks = key_projection(b, PATHS)
    assert picks is not None, terms
    entries = sorted(
        encode_entry([VALUES[i], VALUES[j]], f"d{n}-{i}-{j}", desc)
        for i, j in keys
        for n in range(docids)
    )
    direct = EntryDecoder(desc, PATHS).projected(entries, picks)
    assert direct == _through_scope_rows(b, entries, desc)


def test_picks_name_the_key_part_or_the_docid() -> None:
    b = _bound(["META().id AS id", "b.c", "a"])
    assert key_projection(b, PATHS) == [("id", DOCID_PICK), ("c", 1), ("a", 0)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT a FROM ks WHERE a = 1",
        "SELECT RAW a FROM ks WHERE a = 1",
        "SELECT a, x FROM ks LET x = a + 1 WHERE a = 1",
        "SELECT * FROM ks WHERE a = 1",
        "SELECT ks.* FROM ks WHERE a = 1",
        "SELECT a + 1 AS n FROM ks WHERE a = 1",
        "SELECT b FROM ks WHERE a = 1",  # the object b: only its c is known
        "SELECT b.d FROM ks WHERE a = 1",  # not a key
        "SELECT META().cas FROM ks WHERE a = 1",
    ],
)
def test_other_projections_keep_the_scope_rows(sql: str) -> None:
    assert key_projection(bound_statement(sql, False), PATHS) is None


@pytest.mark.parametrize("keys", [("a", "a.b"), ("a.b", "a"), ("a[0]", "b"), ("a", "b[1].c")])
def test_keys_that_do_not_rebuild_to_their_parts_keep_the_scope_rows(keys: tuple) -> None:
    paths = [static_path(k) for k in key_exprs(keys)]
    b = bound_statement("SELECT META().id AS id FROM ks WHERE a = 1", False)
    assert key_projection(b, paths) is None

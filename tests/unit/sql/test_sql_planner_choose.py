"""Index selection: eligibility (never miss a row), preference, covering, ORDER BY."""

from __future__ import annotations

import pytest

from shardex.core.expr import MISSING, evaluate, parse_expression
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexKey, make_definition
from shardex.sql.planner.choose import OrderKey, choose_index, covered_document

P = parse_expression


def _idx(name: str, *keys: str, where: str | None = None, primary: bool = False, desc=()):
    return make_definition(
        id=f"id-{name.strip('#')}",
        name=name,
        keyspace="users",
        keys=[IndexKey(expr=k, desc=(k in desc)) for k in keys],
        where=where,
        is_primary=primary,
    )


PRIMARY = _idx("#primary", "META().id", primary=True)
BY_CITY_AGE = _idx("by_city_age", "address.city", "age")
BY_AGE = _idx("by_age", "age")
ACTIVE_EMAIL = _idx("active_email", "email", where='status = "active"')
ALL = [PRIMARY, BY_CITY_AGE, BY_AGE, ACTIVE_EMAIL]


def _choose(where: str | None, read=None, **kw):
    return choose_index(
        ALL, P(where) if where else None, keyspace="users", read_paths=read, **kw
    ).definition.name


def test_prefers_more_equality_keys_then_primary_last() -> None:
    assert _choose('address.city = "Oslo" AND age > 3') == "by_city_age"
    assert _choose("age > 3") == "by_age"
    assert _choose("name = 1") == "#primary"  # nothing sargable: the primary index
    assert _choose(None) == "#primary"


def test_partial_index_needs_its_filter_among_the_conjuncts() -> None:
    assert _choose('email = "a@b" AND status = "active"') == "active_email"
    # Without the filter, the partial index would miss inactive users.
    assert _choose('email = "a@b"') == "#primary"


def test_covering_prefers_the_index_holding_every_read_path() -> None:
    choice = choose_index(
        ALL, P("age > 3"), keyspace="users", read_paths=[("age",), ("address", "city")]
    )
    assert choice.definition.name == "by_age"  # by_city_age: its leading key is unconstrained
    covering = choose_index(
        [BY_CITY_AGE, PRIMARY],
        P('address.city = "x"'),
        keyspace="users",
        read_paths=[("age",), ("address", "city")],
    )
    assert covering.covering
    not_covering = choose_index(
        [BY_CITY_AGE], P('address.city = "x"'), keyspace="users", read_paths=[("name",)]
    )
    assert not not_covering.covering
    star = choose_index([BY_CITY_AGE], P('address.city = "x"'), keyspace="users", read_paths=None)
    assert not star.covering


def test_use_index_hint_and_errors() -> None:
    assert _choose("age > 3", use_index="#primary") == "#primary"
    with pytest.raises(ShardexError) as e:
        _choose("age > 3", use_index="nope")
    assert e.value.code == ErrorCode.INDEX_NOT_FOUND and "nope" in str(e.value)
    with pytest.raises(ShardexError) as e:
        choose_index([BY_AGE], P("name = 1"), keyspace="users", read_paths=None)
    assert "CREATE PRIMARY INDEX" in e.value.details["hint"]


def test_order_by_follows_index_order_after_equality_keys() -> None:
    def ordered(where: str, *order: OrderKey) -> bool:
        return choose_index(
            [BY_CITY_AGE], P(where), keyspace="users", read_paths=None, order_by=order
        ).ordered

    assert ordered('address.city = "x"', OrderKey(P("age")))
    assert ordered('address.city > "x"', OrderKey(P("address.city")), OrderKey(P("age")))
    assert not ordered('address.city > "x"', OrderKey(P("age")))
    assert not ordered('address.city = "x"', OrderKey(P("age"), desc=True))
    assert not ordered('address.city = "x"', OrderKey(P("age"), nulls_first=False))


def test_covered_document_rebuilds_what_the_query_reads() -> None:
    paths = [("address",), ("address", "city"), ("age",)]
    doc = covered_document(paths, [{"city": "Oslo", "zip": "1"}, "Oslo", MISSING])
    assert doc == {"address": {"city": "Oslo", "zip": "1"}}
    assert evaluate("address.zip || address.city", doc) == "1Oslo"
    assert evaluate("age", doc) is MISSING


def test_an_array_index_serves_any_over_its_array_and_never_covers() -> None:
    from shardex.sql.syntax.parser import SqlParser

    def sql_where(text: str):
        return SqlParser.for_text(text).parse_expr()

    by_sku = _idx("by_sku", "DISTINCT ARRAY i.sku FOR i IN items END", "age")
    paid = _idx("paid_sku", "DISTINCT ARRAY i.sku FOR i IN items WHEN i.paid END")
    idx = [PRIMARY, by_sku, paid]

    def choose(where: str, read=None):
        return choose_index(idx, sql_where(where), keyspace="users", read_paths=read)

    got = choose("ANY x IN items SATISFIES x.sku = 'a' END AND age > 3")
    assert got.definition.name == "by_sku" and got.sargable_keys == 2
    assert not got.covering  # its entries are per element, not per document
    assert not choose("age > 3", read=[("age",)]).covering
    # EVERY is true of an empty array, which has no entry: not sargable.
    assert choose("EVERY x IN items SATISFIES x.sku = 'a' END").definition.name == "#primary"
    # Another array, or WITHIN: not this index.
    assert choose("ANY x IN lines SATISFIES x.sku = 'a' END").definition.name == "#primary"
    # The WHEN of an index must be among the ANY's conjuncts.
    got = choose("ANY x IN items SATISFIES x.paid AND x.sku = 'a' END")
    assert got.definition.name in ("paid_sku", "by_sku")
    assert (
        choose_index(
            [PRIMARY, paid],
            sql_where("ANY x IN items SATISFIES x.sku = 'a' END"),
            keyspace="users",
            read_paths=None,
        ).definition.name
        == "#primary"
    )

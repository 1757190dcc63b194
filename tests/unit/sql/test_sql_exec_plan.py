"""Physical planning over a cluster state: source, index, spans, leaves per indexer node
(with partition elimination), the protocol plan it becomes, and EXPLAIN."""

from __future__ import annotations

import pytest

from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import make_definition
from shardex.meta.index_state import ACTIVE, BUILDING, IndexRecord
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.sql.exec.plan import LEAF_KIND, ROOT_KIND, plan_select
from shardex.sql.protocol.plan_layout import layout_plan
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import bind_select

KS = "users"
MEMBERS = {"n1": "m1", "n2": "m2", "n3": "m3"}


def _record(name: str, keys: list[str], *, primary: bool = False, state: str = ACTIVE, **kw):
    defn = make_definition(
        id=f"id-{name.strip('#')}", name=name, keyspace=KS, keys=keys, is_primary=primary, **kw
    )
    return IndexRecord(definition=defn, state=state)


def _state(*records: IndexRecord) -> StateContext:
    topologies = {}
    for r in records:
        n = r.definition.num_partition
        nodes = ["n1", "n2", "n3"]
        topologies[r.id] = [Topology(seq_num=1, assignment={p: nodes[p % 3] for p in range(n)})]
    return StateContext(
        keyspaces={KS: KeyspaceMeta(name=KS, num_partitions=8, uuid="u", created_cas=1)},
        indexes={r.id: r for r in records},
        index_topologies=topologies,
    )


PRIMARY = _record("#primary", ["META().id"], primary=True)
BY_CITY = _record("by_city", ["city", "age"], partition_by=["city"], num_partition=3)
BY_AGE = _record("by_age", ["age"], partition_by=["META().id"], num_partition=4)
STATE = _state(PRIMARY, BY_CITY, BY_AGE)


def _plan(sql: str, params=None, state: StateContext = STATE):
    return plan_select(bind_select(parse_statement(sql)), params, state=state, members=MEMBERS)


def test_equality_on_the_partition_key_reads_one_leaf() -> None:
    p = _plan(f"SELECT city, age FROM {KS} WHERE city = 'rome' ORDER BY age LIMIT 5")
    assert p.record is BY_CITY and p.choice is not None and p.choice.covering
    assert p.spans == [{"low": ["rome"], "high": ["rome"], "inclusion": "both"}]
    assert len(p.leaves) == 1 and p.mode == "sort" and p.top == 5
    qp = p.query_plan("sql text", False, "m9", Timestamp({0: (3, 7)}), 100)
    layout = layout_plan(qp, "m9")
    assert layout.participants == tuple(sorted({"m9", p.leaves[0].member}))
    root, leaf = qp.fragments
    assert root.kind == ROOT_KIND and root.inputs == [1] and root.args["limit"] == 5
    assert leaf.kind == LEAF_KIND and leaf.output == 1 and leaf.args["ts"] == {0: (3, 7)}
    assert leaf.args["partitions"] == p.leaves[0].partitions and leaf.args["top"] == 5


def test_a_range_fans_out_to_every_indexer_holding_slices() -> None:
    p = _plan(f"SELECT name FROM {KS} WHERE age > $1", [30])
    assert p.record is BY_AGE and not p.choice.covering  # name is not an index key
    assert {leaf.node for leaf in p.leaves} == {"n1", "n2", "n3"}
    assert sorted(x for leaf in p.leaves for x in leaf.partitions) == [0, 1, 2, 3]
    assert p.spans == [{"low": [30], "high": None, "inclusion": "high"}]
    explain = p.explain()["distributed"]
    assert [f["kind"] for f in explain["fragments"]] == [ROOT_KIND] + [LEAF_KIND] * 3
    assert len(explain["exchanges"]) == 3 and explain["fragments"][1]["does"][1] == "Fetch"


def test_keys_no_from_and_expression_sources_run_on_the_root_alone() -> None:
    for sql, source in [
        (f"SELECT * FROM {KS} USE KEYS ['a', 'b']", "keys"),
        (f"SELECT * FROM {KS} WHERE META().id = $1 AND age > 3", "keys"),
        (f"SELECT * FROM {KS} WHERE META().id IN ['a']", "keys"),
        ("SELECT 1 AS one", "none"),
        ("SELECT RAW x FROM [1, 2] AS x", "expr"),
    ]:
        p = _plan(sql, ["a"] if "$1" in sql else None)
        assert (p.mode, p.source, p.leaves) == ("local", source, []), sql
        assert [f.kind for f in p.query_plan(sql, False, "m1", None, 10).fragments] == [ROOT_KIND]


def test_grouped_queries_aggregate_in_two_phases_without_pushing_the_limit() -> None:
    p = _plan(f"SELECT city, COUNT(*) AS c FROM {KS} WHERE city > 'a' GROUP BY city LIMIT 2")
    assert p.mode == "group" and p.top is None and p.limit == 2
    assert p.explain()["distributed"]["fragments"][0]["does"][0] == "FinalAggregate"


def test_nothing_can_match_plans_no_leaf_but_still_answers_a_global_aggregate() -> None:
    p = _plan(f"SELECT COUNT(*) AS c FROM {KS} WHERE age = 1 AND age = 2")
    assert p.spans == [] and p.leaves == [] and p.mode == "group"


def test_no_usable_index_names_create_primary_index() -> None:
    state = _state(BY_AGE)
    with pytest.raises(ShardexError) as info:
        _plan(f"SELECT * FROM {KS} WHERE name = 'x'", state=state)
    assert info.value.code is ErrorCode.INDEX_NOT_FOUND
    assert "CREATE PRIMARY INDEX" in info.value.details["hint"]


def test_unknown_keyspace_and_unready_hinted_index() -> None:
    with pytest.raises(ShardexError) as info:
        _plan("SELECT * FROM nope")
    assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    building = _record("slow", ["name"], state=BUILDING)
    with pytest.raises(ShardexError) as info:
        _plan(
            f"SELECT * FROM {KS} USE INDEX (slow) WHERE name = 'x'", state=_state(PRIMARY, building)
        )
    assert info.value.code is ErrorCode.INDEX_NOT_READY
    # Not hinted, a building index is simply not a candidate.
    p = _plan(f"SELECT * FROM {KS} WHERE name = 'x'", state=_state(PRIMARY, building))
    assert p.record is PRIMARY


def test_a_down_indexer_fails_the_plan_before_anything_starts() -> None:
    b = bind_select(parse_statement(f"SELECT age FROM {KS} WHERE age > 1"))
    with pytest.raises(ShardexError) as info:
        plan_select(b, None, state=STATE, members={"n1": "m1", "n2": "m2"})
    assert info.value.code is ErrorCode.NODE_UNAVAILABLE and info.value.details["node"] == "n3"

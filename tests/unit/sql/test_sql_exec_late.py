"""Late materialization of ORDER BY ... LIMIT over several leaves (decision 0111): where the
planner chooses it, what EXPLAIN shows, and that its rows equal the plain path's (leaves
fetching their own top rows) with ties, OFFSET, filters, a top-N leaf sort, and documents
deleted or changed between the index scan and the fetch."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.failover import failing_over
from shardex.sql.exec.fragment_rows import late_leaf_rows, leaf_rows, mode_of, root_rows
from shardex.sql.exec.late import LATE_REFILL, late_refill, late_root_values
from shardex.sql.exec.plan import LATE_MAX_ROWS, PhysicalPlan, bind_statement, plan_select
from shardex.sql.exec.rows import cell_chunks, decode_row, decode_rows, to_batches
from shardex.sql.syntax.bind import META_KEY
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_plan import KS, MEMBERS, STATE

# ``by_age`` (tests.unit.sql.test_sql_exec_plan): keys (age), 4 partitions by META().id
# over 3 nodes: a range on age has 3 leaves.
RANGE = f"SELECT META().id AS id, name, age FROM {KS} WHERE age >= 30 ORDER BY age, META().id"


def _plan(sql: str, params: Any = None, tuning: dict[str, bool] | None = None) -> PhysicalPlan:
    return plan_select(bind_statement(sql, False), params, state=STATE, members=MEMBERS,
                       tuning=tuning)  # fmt: skip


# --- planning -------------------------------------------------------------------------------


def test_a_non_covering_order_limit_over_several_leaves_is_late() -> None:
    p = _plan(RANGE + " LIMIT 20")
    assert p.record is not None and p.record.definition.name == "by_age"
    assert len(p.leaves) == 3 and p.ordered and p.late
    qp = p.query_plan(RANGE, False, "m9", None, 100)
    assert all(f.args["late"] for f in qp.fragments)
    dist = p.explain()["distributed"]
    assert dist["index"]["late_fetch"] is True
    leaf, root = dist["fragments"][1]["does"], dist["fragments"][0]["does"]
    assert "Fetch" not in leaf and leaf[-1] == "SortKeysAndIds"
    assert root[:2] == ["MergeSort", "Fetch (GetMany per owner, top rows only)"]
    # A DML's derived SELECT keeps the leaves fetching.
    assert not any(f.args["late"] for f in p.query_plan(RANGE, True, "m9", None, 100).fragments)


def test_a_top_n_at_the_leaf_is_late_too() -> None:
    p = _plan(f"SELECT name FROM {KS} WHERE age >= 30 ORDER BY age DESC LIMIT 5")
    assert p.late and not p.ordered
    assert "LocalSort" in p.explain()["distributed"]["fragments"][1]["does"]


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        (f"SELECT META().id AS id, age FROM {KS} WHERE age >= 30 ORDER BY age LIMIT 5",
         "covering: nothing to fetch"),
        (RANGE, "no LIMIT"),
        (RANGE + f" LIMIT {LATE_MAX_ROWS + 1}", "a limit too large to hold at the root"),
        (RANGE + f" LIMIT {LATE_MAX_ROWS} OFFSET 1", "offset + limit too large"),
        (f"SELECT name FROM {KS} WHERE age >= 30 AND name > 'b' ORDER BY age LIMIT 5",
         "a filter the index cannot apply"),
        (f"SELECT age FROM {KS} WHERE age >= 30 ORDER BY name LIMIT 5",
         "an order the index cannot give"),
        (f"SELECT name FROM {KS} WHERE age >= 30 AND META().cas > 0 ORDER BY age LIMIT 5",
         "META() beyond id"),
        (f"SELECT DISTINCT name FROM {KS} WHERE age >= 30 ORDER BY name LIMIT 5", "DISTINCT"),
        (f"SELECT name, age FROM {KS} WHERE age >= 30 LIMIT 5", "no ORDER BY"),
        (f"SELECT name, age FROM {KS} WHERE city = 'rome' ORDER BY age LIMIT 5",
         "one leaf: it fetches its top rows only already"),
    ],
)  # fmt: skip
def test_late_is_not_chosen_where_it_cannot_win(sql: str, why: str) -> None:
    p = _plan(sql)
    assert not p.late, why
    assert p.explain()["distributed"]["index"]["late_fetch"] is False


def test_the_switch_turns_it_off() -> None:
    assert not _plan(RANGE + " LIMIT 20", tuning={"late": False}).late


# --- rows: late equals the leaves fetching ----------------------------------------------------

LEAVES = 3


def _docs(n: int = 300, seed: int = 5) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    # Few ages: many ties in ORDER BY age.
    return {f"d{i:03d}": {"age": rng.randrange(25, 40), "name": f"n{i}"} for i in range(n)}


def _entries(index: dict[str, dict[str, Any]], leaf: int) -> list[tuple[Any, str]]:
    """A leaf's index entries (age, docid) in index order (ascending: a DESC order sorts
    at the leaf)."""
    own = [(d["age"], k) for k, d in index.items() if int(k[1:]) % LEAVES == leaf]
    return sorted(own)


def _plain(b: Any, ordered: bool, index: dict, store: dict, limit: int, offset: int) -> list:
    """The plain path: each leaf scans, fetches from ``store`` now, filters, keeps its top."""
    top = offset + limit
    inputs = []
    for leaf in range(LEAVES):
        scope = [
            {b.alias: store[k], META_KEY: {"id": k}} for _, k in _entries(index, leaf) if k in store
        ]
        out = leaf_rows(b, None, mode_of(b), top, budget(), scope, presorted=ordered)
        inputs.append(iter([r for batch in to_batches(out) for r in decode_rows(batch)]))
    return list(root_rows(b, None, "sort", limit, offset, budget(), inputs))


async def _cells(rows: list[Any]) -> AsyncIterator[list[bytes]]:
    for chunk in cell_chunks(rows):
        yield chunk


async def _late(
    b: Any, ordered: bool, index: dict, store: dict, limit: int, offset: int
) -> tuple[list, list[list[str]]]:
    """The late path: leaves rank ``index``'s entries alone; the root fetches from ``store``.
    Also the fetches the root made."""
    top = offset + limit
    inputs = []
    for leaf in range(LEAVES):
        scope = [{b.alias: {"age": a}, META_KEY: {"id": k}} for a, k in _entries(index, leaf)]
        inputs.append(
            _cells(list(late_leaf_rows(b, None, top, budget(), scope, presorted=ordered)))
        )
    fetches: list[list[str]] = []

    async def fetch(keyspace: str, docids: list[str]) -> list[tuple[str, Any]]:
        assert keyspace == KS
        fetches.append(docids)
        return [(d, store[d]) for d in docids if d in store]

    rows = await late_root_values(b, None, KS, fetch, inputs, decode_row, limit, offset)
    return rows, fetches


CASES = [
    (RANGE, True),
    (f"SELECT name, age FROM {KS} WHERE age >= 30 ORDER BY age", True),  # ties: docid order
    (f"SELECT RAW name FROM {KS} WHERE age >= 27 AND age < 35 ORDER BY age DESC", False),
    (f"SELECT name FROM {KS} WHERE age >= 30 AND age != 33 ORDER BY age, META().id", True),
]


@pytest.mark.parametrize(("sql", "ordered"), CASES)
@pytest.mark.parametrize(("limit", "offset"), [(20, 0), (7, 5), (1, 0), (500, 0)])
async def test_late_rows_equal_the_plain_paths(
    sql: str, ordered: bool, limit: int, offset: int
) -> None:
    docs = _docs()
    b = bind_statement(sql, False)
    want = _plain(b, ordered, docs, docs, limit, offset)
    got, fetches = await _late(b, ordered, docs, docs, limit, offset)
    assert got == want and len(want) == min(limit, len(_matching(b, docs)) - offset)
    # One round of fetches, of the rows returned (and the offset's) only.
    assert len(fetches) == 1 and len(fetches[0]) == min(limit + offset, len(_matching(b, docs)))


def _matching(b: Any, docs: dict) -> list[str]:
    return list(
        root_rows(b, None, "local", None, 0, budget(),
                  [iter({b.alias: d, META_KEY: {"id": k}} for k, d in docs.items())])
    )  # fmt: skip


async def test_documents_deleted_after_the_scan_are_refilled_from_the_other_candidates() -> None:
    docs = _docs()
    b = bind_statement(RANGE, False)
    plain_first = _plain(b, True, docs, docs, 20, 0)
    store = dict(docs)
    for row in plain_first[:3]:  # three of the rows the root would return: gone now
        del store[row["id"]]
    want = _plain(b, True, docs, store, 20, 0)
    # Each leaf sent its first 20 (30) candidates: 3 gaps are filled without running dry.
    got, _ = await _late(b, True, docs, store, 20, 10)  # with an offset
    assert got == _plain(b, True, docs, store, 20, 10)
    got, fetches = await _late(b, True, docs, store, 20, 0)
    assert [r["id"] for r in got] == [r["id"] for r in want] and got == want
    assert [len(f) for f in fetches] == [20, 3]  # the gaps fetched in a second round


async def test_documents_failing_where_now_are_dropped_as_a_leaf_would() -> None:
    # ORDER BY an expression many ages share: a document can fail WHERE now and still
    # sort where its entry did.
    sql = f"SELECT name FROM {KS} WHERE age >= 30 AND age != 30 ORDER BY FLOOR(age / 2)"
    b = bind_statement(sql, False)
    index = _docs()
    moved = [k for k, d in index.items() if d["age"] == 31][:4]
    store = {**index, **{k: {**index[k], "age": 30} for k in moved}}
    want = _plain(b, False, index, store, 20, 0)
    got, fetches = await _late(b, False, index, store, 20, 0)
    assert got == want and len(fetches) == 2


async def test_a_document_whose_sort_key_moved_asks_for_a_rerun() -> None:
    docs = _docs()
    b = bind_statement(RANGE, False)
    first = _plain(b, True, docs, docs, 20, 0)[0]["id"]
    store = {**docs, first: {**docs[first], "age": 39}}  # now sorts elsewhere
    with pytest.raises(ShardexError) as err:
        await _late(b, True, docs, store, 20, 0)
    assert err.value.details["reason"] == LATE_REFILL


async def test_running_past_a_leaf_that_sent_its_whole_quota_asks_for_a_rerun() -> None:
    docs = {f"d{i:03d}": {"age": 30 + i, "name": f"n{i}"} for i in range(30)}
    b = bind_statement(RANGE, False)
    # LIMIT 3: leaf 0 (d000, d003, ...) sends d000, d003, d006; leaf 1 d001, d004, d007;
    # leaf 2 d002, d005, d008. With d000-d005 gone the root keeps d006 and then needs a row
    # after leaf 0's last: its fourth (d009) could come before anything left.
    store = {k: v for k, v in docs.items() if k > "d005"}
    with pytest.raises(ShardexError) as err:
        await _late(b, True, docs, store, 3, 0)
    assert err.value.code is ErrorCode.QUERY_STATE
    assert err.value.details["reason"] == LATE_REFILL
    store = {k: v for k, v in docs.items() if k != "d000"}
    # A gap the other candidates fill exactly needs no rerun.
    got, fetches = await _late(b, True, docs, store, 3, 0)
    assert got == _plain(b, True, docs, store, 3, 0) and fetches[1] == ["d003"]


# --- the rerun -------------------------------------------------------------------------------


async def _chunks(rows: list[list[bytes]], error: ShardexError | None) -> AsyncIterator[Any]:
    for chunk in rows:
        yield chunk
    if error is not None:
        raise error


async def test_a_late_refill_runs_the_statement_again_with_the_leaves_fetching() -> None:
    plan = _plan(RANGE + " LIMIT 20")
    assert plan.late
    reruns: list[str | None] = []

    async def rerun(node: str | None) -> tuple[PhysicalPlan, AsyncIterator[Any]]:
        reruns.append(node)
        return _plan(RANGE + " LIMIT 20", tuning={"late": False}), _chunks([[b"a"]], None)

    failing = _chunks([], late_refill("test"))
    got = [c async for c in failing_over(plan, failing, rerun, deadline=1e12)]
    assert got == [[b"a"]] and reruns == [None]
    # A plan that is not late never asks for it (the error is the statement's).
    plain = _plan(RANGE + " LIMIT 20", tuning={"late": False})
    with pytest.raises(ShardexError):
        _ = [c async for c in failing_over(plain, _chunks([], late_refill("x")), rerun, 1e12)]

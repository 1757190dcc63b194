"""The memory budget and spilling (decision 0106): with a budget tiny enough that every
blocking operator spills, the fragment pipelines return the very list they return in memory
(ORDER BY with its stable ties, groups and DISTINCT values first seen first), on seeded
random documents with NULL, MISSING, mixed types and many ties; the query's spill directory
is gone after success, error and cancel; the node's cap binds every query."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.bridge import run_pipeline
from shardex.sql.exec.fragment_rows import leaf_rows, mode_of, root_rows
from shardex.sql.exec.memory import SPILL_DIR, Budget, NodeMemory, QueryMemory, value_size
from shardex.sql.exec.rows import decode_rows, to_batches
from shardex.sql.exec.spill import FAN_IN, external_sort
from shardex.sql.exec.spill_groups import FANOUT, distinct, final_groups, partial_groups
from shardex.sql.exec.statement_checks import check_memory_quota
from shardex.sql.local_rows import eval_count
from shardex.sql.operators import AggSpec, sort_pairs
from shardex.sql.operators.aggregate import aggregate
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import META_KEY, bind_select
from tests.unit.sql.budgets import budget

KS = "t"
TINY = 8 * 1024  # a few dozen rows: every blocking operator below spills, many times
# A window holds one partition once spilled: up to a few dozen rows of about 1.3 KB here.
WINDOW_TINY = 48 * 1024
N_DOCS = 3000


def _docs(n: int = N_DOCS, seed: int = 11) -> dict[str, Any]:
    rng = random.Random(seed)
    out: dict[str, Any] = {}
    for i in range(n):
        d: dict[str, Any] = {
            "g": rng.choice(["x", "y", "z", None, 1, 1.0, True]),
            "v": rng.choice([rng.randrange(50), rng.randrange(500) / 10, None, "s", [1, 2]]),
            "u": rng.randrange(n // 2),  # many groups, each of about two rows
            "k": i,
            "s": rng.choice(["a", "b", "ab", "B", ""]) * rng.randrange(1, 4),
        }
        if rng.random() < 0.8:
            d["a"] = rng.randrange(10)  # MISSING in a fifth of the documents
        out[f"d{i:04d}"] = d
    return out


def _run(
    sql: str, docs: dict[str, Any], make: Any, leaves: int = 3
) -> tuple[list[Any], list[QueryMemory]]:
    """The statement over ``leaves`` leaves and a root, each with a budget from ``make()``;
    the rows and the query accounts (to see whether they spilled)."""
    b = bind_select(parse_statement(sql))
    mode = mode_of(b)
    limit = eval_count(b.limit, None, "LIMIT")
    offset = eval_count(b.offset, None, "OFFSET") or 0
    top = None if limit is None or b.grouped or b.distinct else offset + limit
    items = sorted(docs.items())
    random.Random(leaves).shuffle(items)
    inputs = []
    budgets: list[Budget] = []
    for i in range(leaves):
        scope = [{b.alias: doc, META_KEY: {"id": k}} for k, doc in items[i::leaves]]
        budgets.append(make())
        out = leaf_rows(b, None, mode, top, budgets[-1], scope)
        inputs.append(iter([r for batch in to_batches(out) for r in decode_rows(batch)]))
    budgets.append(make())
    rows = list(root_rows(b, None, mode, limit, offset, budgets[-1], inputs))
    return rows, [x.query for x in budgets]


ORDERED = [
    # Ties on every key (few distinct values): the order among them is the input's.
    f"SELECT k, g, a FROM {KS} ORDER BY g",
    f"SELECT k, a, s FROM {KS} ORDER BY a DESC, s",
    f"SELECT k, v FROM {KS} ORDER BY v NULLS LAST, k DESC",
    f"SELECT RAW s FROM {KS} ORDER BY s DESC NULLS FIRST",
    f"SELECT k, a FROM {KS} ORDER BY a LIMIT 700 OFFSET 40",
    f"SELECT DISTINCT s, a FROM {KS} ORDER BY a, s",
    f"SELECT u, COUNT(*) AS n, ARRAY_AGG(k) AS ks FROM {KS} GROUP BY u ORDER BY u",
    f"SELECT g, SUM(v) AS s, AVG(v) AS m, MIN(v) AS lo, MAX(s) AS hi FROM {KS} "
    "GROUP BY g ORDER BY g",
    f"SELECT u, COUNT(DISTINCT a) AS n FROM {KS} GROUP BY u HAVING COUNT(*) > 1 "
    "ORDER BY n DESC, u LIMIT 300",
    f"SELECT u, MEDIAN(v) AS md, VARIANCE(v) AS va, STDDEV_POP(k) AS sd, COUNTN(v) AS n, "
    f"MEDIAN(DISTINCT a) AS mda FROM {KS} GROUP BY u ORDER BY u",
]
# Windows: partitions of a few rows each (one partition is held at a time once spilled),
# ties among peers (ROW_NUMBER over them follows the input order), several functions with
# different partitions (one sorted pass each), frames, and windows over groups.
WINDOWED = [
    f"SELECT k, ROW_NUMBER() OVER (PARTITION BY k % 500 ORDER BY g) AS rn, "
    f"SUM(k) OVER (PARTITION BY u) AS s FROM {KS}",
    f"SELECT k, RANK() OVER (PARTITION BY u, a ORDER BY s DESC) AS r, "
    f"LAG(k) OVER (PARTITION BY u ORDER BY k) AS p, CUME_DIST() OVER (PARTITION BY u "
    f"ORDER BY v NULLS LAST) AS cd FROM {KS} ORDER BY k",
    f"SELECT k, AVG(v) OVER (PARTITION BY k % 300 ORDER BY k ROWS BETWEEN 1 PRECEDING AND "
    f"1 FOLLOWING) AS m, NTILE(3) OVER (PARTITION BY k % 300 ORDER BY s) AS nt, "
    f"FIRST_VALUE(s) OVER (PARTITION BY g, k % 400 ORDER BY a) AS f FROM {KS} WHERE k > 7",
    f"SELECT u, COUNT(*) AS n, DENSE_RANK() OVER (PARTITION BY u % 100 ORDER BY COUNT(*) "
    f"DESC) AS d FROM {KS} GROUP BY u",
    f"SELECT DISTINCT RAW ROW_NUMBER() OVER (PARTITION BY u ORDER BY k) FROM {KS}",
]
UNORDERED = [
    f"SELECT DISTINCT u FROM {KS}",
    f"SELECT DISTINCT RAW a FROM {KS}",  # NULL-less but MISSING: SELECT RAW drops MISSING
    f"SELECT DISTINCT RAW v FROM {KS}",  # rows that are NULL themselves
    f"SELECT u, a, ARRAY_AGG(DISTINCT s) AS ss, COUNT(v) AS n FROM {KS} GROUP BY u, a",
    f"SELECT COUNT(*) AS n, COUNT(DISTINCT a) AS da, ARRAY_AGG(DISTINCT g) AS gs FROM {KS}",
]


# Ten values, seven groups or one: the values and states (exact sums, MIN/MAX by collation)
# across the leaves' flushes are what these check; their tables fit.
FEW_GROUPS = {ORDERED[7], UNORDERED[1], UNORDERED[4]}


@pytest.mark.parametrize("sql", ORDERED + WINDOWED + UNORDERED)
def test_a_tiny_budget_spills_and_returns_what_memory_returns(sql: str, tmp_path: Path) -> None:
    docs = _docs()
    want, _ = _run(sql, docs, budget)
    quota = WINDOW_TINY if sql in WINDOWED else TINY
    got, accounts = _run(sql, docs, lambda: budget(quota, data_dir=tmp_path))
    assert want, sql  # a query with no rows would prove nothing
    # The same list, also where SQL leaves the order open: groups and DISTINCT values come
    # out first seen first, spilled or not.
    assert got == want
    if sql not in FEW_GROUPS:
        assert sum(q.files for q in accounts) > 0, "the tiny budget did not make it spill"


def test_external_sort_is_the_stable_sort_over_many_merge_passes(tmp_path: Path) -> None:
    rng = random.Random(5)
    pairs = [
        (bytes([rng.randrange(8)]), {"i": i, "pad": "p" * rng.randrange(30)}) for i in range(6000)
    ]
    b = budget(4096, data_dir=tmp_path)
    got = list(external_sort(iter(pairs), b))
    assert got == sort_pairs(pairs)
    assert b.query.files > 2 * FAN_IN  # runs enough for more than one merge pass
    for limit in (1, 37, 5999, 7000):
        b = budget(4096, data_dir=tmp_path)
        assert list(external_sort(iter(pairs), b, limit)) == sort_pairs(pairs, limit)
    assert not list((tmp_path / SPILL_DIR).rglob("run-*"))  # every run read is removed


def test_grouping_partitions_recursively_and_equals_the_in_memory_aggregate(
    tmp_path: Path,
) -> None:
    rng = random.Random(8)
    rows = [{"g": rng.randrange(4000), "v": rng.randrange(100)} for _ in range(20000)]
    keys = [lambda r: r["g"]]
    specs = [
        AggSpec("COUNT", None),
        AggSpec("ARRAY_AGG", lambda r: r["v"]),
        AggSpec("SUM", lambda r: r["v"] / 4),
        AggSpec("COUNT", lambda r: r["v"], distinct=True),
        AggSpec("MEDIAN", lambda r: r["v"]),
        AggSpec("VARIANCE", lambda r: r["v"] / 3),
    ]
    want = list(aggregate(rows, keys, specs))
    b = budget(16 * 1024, data_dir=tmp_path)
    got = list(final_groups(partial_groups(rows, keys, specs, b), specs, b))
    assert got == want  # the groups' order and ARRAY_AGG's element order too
    # Sixteen partitions of 4000 groups are over 16 KiB each: a second level was needed.
    assert b.query.files > FANOUT


def test_one_group_larger_than_the_budget_fails_naming_the_operator(tmp_path: Path) -> None:
    rows = [{"v": "x" * 50} for _ in range(2000)]
    specs = [AggSpec("ARRAY_AGG", lambda r: r["v"])]
    b = budget(16 * 1024, data_dir=tmp_path)
    with pytest.raises(ShardexError) as info:
        list(final_groups(partial_groups(rows, [], specs, b), specs, b, global_group=True))
    e = info.value
    assert e.code is ErrorCode.QUERY_MEMORY_LIMIT and e.details["operator"] == "GROUP BY"
    assert e.details["limit"] == 16 * 1024 and e.details["value"] > 16 * 1024
    assert "one group" in e.message and "hint" in e.details


@pytest.mark.parametrize("spill", [True, False])
def test_one_median_larger_than_the_budget_fails_as_array_agg_does(
    spill: bool, tmp_path: Path
) -> None:
    rows = [{"v": i / 7} for i in range(4000)]  # MEDIAN's state holds every number
    specs = [AggSpec("MEDIAN", lambda r: r["v"])]
    b = budget(16 * 1024, spill=spill, data_dir=tmp_path)
    with pytest.raises(ShardexError) as info:
        list(final_groups(partial_groups(rows, [], specs, b), specs, b, global_group=True))
    assert info.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert info.value.details["operator"] == "GROUP BY"
    if spill:
        assert "MEDIAN" in info.value.message


def test_distinct_keeps_the_first_row_of_each_value_through_recursion(tmp_path: Path) -> None:
    rng = random.Random(2)
    rows = [
        (rng.choice([None, rng.randrange(3000), str(rng.randrange(50))]), i) for i in range(9000)
    ]
    b = budget(4096, data_dir=tmp_path)
    got = list(distinct(iter(rows), b, value_of=lambda r: r[0]))
    firsts: dict[Any, Any] = {}
    for r in rows:
        firsts.setdefault(repr(r[0]), r)
    assert [tuple(r) for r in got] == list(firsts.values())  # in input order
    assert b.query.files > FANOUT  # a second level of partitions


def test_without_spilling_each_operator_fails_naming_itself() -> None:
    cases = [
        (f"SELECT k FROM {KS} ORDER BY s", "ORDER BY"),
        (f"SELECT DISTINCT k FROM {KS}", "DISTINCT"),
        (f"SELECT u, COUNT(*) AS n FROM {KS} GROUP BY u", "GROUP BY"),
        (f"SELECT k, RANK() OVER (PARTITION BY u ORDER BY k) AS r FROM {KS}", "WINDOW"),
    ]
    for sql, operator in cases:
        with pytest.raises(ShardexError) as info:
            _run(sql, _docs(), lambda: budget(TINY, spill=False), leaves=1)
        e = info.value
        assert e.code is ErrorCode.QUERY_MEMORY_LIMIT, sql
        assert e.details["operator"] == operator and e.details["limit"] == TINY
        assert "spilling is off" in e.message and "spill" in e.details["hint"]


def test_one_window_partition_larger_than_the_budget_fails_naming_the_window() -> None:
    sql = f"SELECT k, SUM(k) OVER (PARTITION BY g) AS s FROM {KS}"  # ~500 rows a partition
    with pytest.raises(ShardexError) as info:
        _run(sql, _docs(), lambda: budget(WINDOW_TINY), leaves=1)
    e = info.value
    assert e.code is ErrorCode.QUERY_MEMORY_LIMIT and e.details["operator"] == "WINDOW"
    assert "one window partition" in e.message and e.details["limit"] == WINDOW_TINY


def test_a_spilled_window_leaves_no_directory(tmp_path: Path) -> None:
    sql = f"SELECT k, ROW_NUMBER() OVER (PARTITION BY u ORDER BY s) AS r FROM {KS}"
    node = NodeMemory(1 << 30, query_max=WINDOW_TINY, data_dir=tmp_path)
    with node.fragment("q/window") as f:
        got, [account] = _run(sql, _docs(), f.budget, leaves=1)[0], [f.query]
        assert account.files > 0 and len(_query_dirs(tmp_path)) == 1
    assert _query_dirs(tmp_path) == [] and node.running() == 0 and node.used == 0
    assert got == _run(sql, _docs(), budget, leaves=1)[0]


def _spilling_rows(node: NodeMemory, fail_at: int | None = None) -> Iterator[Any]:
    def rows() -> Iterator[Any]:
        for i in range(5000):
            if i == fail_at:
                raise ValueError("a row that fails")
            yield (str(i % 97).encode(), {"i": i, "pad": "x" * 40})

    with node.fragment("q/1", 16 * 1024) as f:
        yield from external_sort(rows(), f.budget())


def _query_dirs(tmp_path: Path) -> list[Path]:
    root = tmp_path / SPILL_DIR
    return list(root.iterdir()) if root.exists() else []


def test_the_query_directory_goes_after_success_error_and_cancel(tmp_path: Path) -> None:
    node = NodeMemory(1 << 30, query_max=1 << 20, data_dir=tmp_path)
    assert len(list(_spilling_rows(node))) == 5000
    assert _query_dirs(tmp_path) == [] and node.running() == 0 and node.used == 0

    with pytest.raises(ValueError):
        list(_spilling_rows(node, fail_at=4000))  # after several runs were written
    assert _query_dirs(tmp_path) == [] and node.running() == 0 and node.used == 0

    it = _spilling_rows(node)
    next(it)  # every run written, the merge under way
    assert len(_query_dirs(tmp_path)) == 1
    it.close()  # the consumer went away
    assert _query_dirs(tmp_path) == [] and node.running() == 0 and node.used == 0


def test_a_cancelled_threaded_pipeline_leaves_no_directory(tmp_path: Path) -> None:
    """The fragment's way: the rows run in a thread (``bridge``); the consumer stops after
    one batch; the account closes at once, and the thread, still sorting or merging, can
    make no new file there."""
    node = NodeMemory(1 << 30, query_max=1 << 20, data_dir=tmp_path)

    async def source() -> AsyncIterator[list[Any]]:
        for c in range(50):
            yield [
                (str(i % 89).encode(), {"i": i, "pad": "y" * 40})
                for i in range(c * 200, c * 200 + 200)
            ]

    async def main() -> None:
        with node.fragment("q/2", 16 * 1024) as f:
            batches = run_pipeline(
                lambda ins: external_sort(ins[0], f.budget()), [source()], name="t"
            )
            async with contextlib.aclosing(batches):
                async for _ in batches:
                    break
        assert _query_dirs(tmp_path) == [] and node.running() == 0

    asyncio.run(main())


def test_a_closed_account_makes_no_file_and_grows_nothing(tmp_path: Path) -> None:
    node = NodeMemory(1 << 30, data_dir=tmp_path)
    with node.fragment("q/3") as f:
        q = f.query
        q.new_file("run").write_bytes(b"x")
        res = f.budget().reserve("ORDER BY")
    assert _query_dirs(tmp_path) == []
    assert not res.grow(1)
    with pytest.raises(ShardexError) as info:
        q.new_file("run")
    assert info.value.code is ErrorCode.QUERY_CANCELLED


def test_leftovers_are_removed_when_a_node_starts(tmp_path: Path) -> None:
    old = tmp_path / SPILL_DIR / "n1_7"
    old.mkdir(parents=True)
    (old / "run-1").write_bytes(b"left by a killed node")
    NodeMemory(data_dir=tmp_path)
    assert not (tmp_path / SPILL_DIR).exists()


def test_queries_share_the_node_cap(tmp_path: Path) -> None:
    node = NodeMemory(64 * 1024, query_max=64 * 1024, data_dir=tmp_path)
    with node.fragment("a/1") as a, node.fragment("b/1", spill=False) as b:
        hog = a.budget().reserve("GROUP BY")
        assert hog.grow(60 * 1024) and node.used >= 60 * 1024
        pairs = [(str(i).encode(), {"i": i}) for i in range(200)]  # ~20 KiB held
        with pytest.raises(ShardexError) as info:
            list(external_sort(iter(pairs), b.budget()))
        e = info.value
        assert e.code is ErrorCode.QUERY_MEMORY_LIMIT and e.details["node_limit"] == 64 * 1024
        hog.release()
        assert list(external_sort(iter(pairs), b.budget())) == sort_pairs(pairs)
    assert node.used == 0


def test_a_query_may_lower_its_quota_but_not_raise_it_past_the_node() -> None:
    check_memory_quota(None, 1 << 20)
    check_memory_quota(1 << 20, 1 << 20)
    for bad in (2 << 20, 100, True, "1MiB"):
        with pytest.raises(ShardexError) as info:
            check_memory_quota(bad, 1 << 20)
        e = info.value
        assert e.code is ErrorCode.BAD_REQUEST and e.details["limit"] == 1 << 20
        assert str(bad) in e.message or repr(bad) in e.message


def test_value_size_is_close_to_what_decoded_values_allocate() -> None:
    rng = random.Random(4)
    docs = [
        {
            "name": "".join(rng.choice("abcdefgh") for _ in range(rng.randrange(5, 40))),
            "n": rng.randrange(10**9),
            "f": rng.random(),
            "tags": [str(rng.randrange(1000)) for _ in range(rng.randrange(4))],
            "o": {"x": rng.randrange(1000, 10**6), "y": None, "z": True},
        }
        for _ in range(2000)
    ]
    data = [msgspec.msgpack.encode(d) for d in docs]
    dec = msgspec.msgpack.Decoder()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = [dec.decode(x) for x in data]
    allocated = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    estimate = sum(value_size(v) for v in held) + sys.getsizeof(held)
    # Over-counts the keys msgspec shares between documents; never off by more than 2x.
    assert allocated / 2 < estimate < allocated * 2


def test_a_sort_handing_out_from_memory_writes_the_rest_when_another_needs_it(
    tmp_path: Path,
) -> None:
    """A sort that fit in memory hands its pairs out one by one; while its consumer holds
    rows that can go nowhere (a window partition: a ``fixed`` reservation), the pairs not
    handed out yet are written as a run and read back, in the same stable order."""
    b = budget(64 * 1024, data_dir=tmp_path)
    rng = random.Random(4)
    # About 53 KiB of sorted pairs: the sort fits the budget alone, not beside the rows.
    pairs = [(bytes([rng.randrange(8)]), {"i": i, "pad": "p" * 40}) for i in range(300)]
    held = b.reserve("WINDOW", fixed=True)
    got = []
    for key, value in external_sort(iter(pairs), b):
        got.append((key, value))
        if len(got) <= 110:  # the consumer keeps its first rows: about 44 KiB
            assert held.grow(value_size(value))
    assert got == sorted(pairs, key=lambda p: p[0])  # stable: ties in input order
    assert b.query.files == 1  # the rest, written once
    assert not list((tmp_path / SPILL_DIR).rglob("run-*"))  # and removed once read back


WINDOW_SQL = (
    "SELECT o.n, ROW_NUMBER() OVER (PARTITION BY o.cid ORDER BY o.qty) AS r, "
    "SUM(o.qty) OVER (PARTITION BY o.n % 7 ORDER BY o.n) AS s FROM orders o"
)


@pytest.mark.parametrize("n", [240, 300, 400])
def test_two_windows_spill_within_a_tiny_budget(n: int, tmp_path: Path) -> None:
    """Two windows' passes over rows that fit in a sort but not beside a partition: the
    sort that fit writes out what it still holds instead of failing the partition."""
    rng = random.Random(5)
    docs = {
        f"o{i:04d}": {"n": i, "cid": rng.randrange(70), "qty": rng.randrange(6)} for i in range(n)
    }
    b = bind_select(parse_statement(WINDOW_SQL))  # type: ignore[arg-type]
    scope = [{"o": d, META_KEY: {"id": k}} for k, d in docs.items()]
    shipped = [
        r
        for batch in to_batches(leaf_rows(b, None, "window", None, budget(), scope))
        for r in decode_rows(batch)
    ]
    small = budget(64 * 1024, data_dir=tmp_path)
    got = list(root_rows(b, None, "window", None, 0, small, [iter(shipped)]))
    want = list(root_rows(b, None, "window", None, 0, budget(), [iter(shipped)]))
    assert got == want and len(got) == n

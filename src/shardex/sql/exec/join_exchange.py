"""A join run between fragments over hash-partitioned exchanges (decision 0135).

For a statement whose one join is an ANSI INNER, LEFT or RIGHT JOIN by hash
(``planner.joins`` chose ``hash``: an equi-join key, no index nested loop) placed before any
UNNEST, over a FROM keyspace, when both side statements read through index leaves:

* each side statement's leaves (the same ``sql.leaf`` fragments an ordinary SELECT of that
  side runs, at that side's pinned TS) send every row ``[docid, document]`` to one *join
  fragment*, chosen by a hash of its equi-join key's values (``hash_key``: equal under
  ``=``, equal bytes, so equal keys meet on one member whatever their spelling), over a hash
  exchange; a row whose key is NULL or MISSING matches nothing: an inner side's is
  dropped, a LEFT JOIN's left row (a RIGHT JOIN's inner document) goes to a member chosen
  by its docid, to come out alone;
* the join fragments, one on each node that runs a leaf of either side, hold their part
  of the build side (a RIGHT JOIN's: the left rows) and stream the other through the
  operators ``LocalEngine`` runs (``join_steps.joined_rows``, then UNNEST), and then do
  what a leaf does for the statement (LET, WHERE, the projection, a partial aggregate or a
  sort: ``leaf_rows``), so only the joined rows' results reach the initiator;
* the initiator's root is the ordinary ``sql.root`` of the statement's mode (merge the
  partial aggregates, the sorted runs, OFFSET and LIMIT), with ORDER BY each join
  fragment's sorted run an input of its own (``by_sender``).

Everything else (NEST, lookup and index joins, index nested loops, several joins, a FROM by
key or expression) keeps the initiator path of decision 0123 (``join_run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Final

import pyarrow as pa

from shardex.api.sql_protocol import FragmentSpec, QueryPlan
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.bridge import Pack, run_pipeline
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragment_rows import compiled, leaf_rows, mode_of
from shardex.sql.exec.join_plan import HASH, JoinSides, exchange_join, side_meta, side_params
from shardex.sql.exec.join_run import ClusterSides
from shardex.sql.exec.memory import Budget, NodeMemory
from shardex.sql.exec.plan import LEAF_KIND, ROOT_KIND, PhysicalPlan, bind_statement
from shardex.sql.exec.reply import cells_closing
from shardex.sql.exec.rows import BATCH_BYTES, BATCH_ROWS, cells_batch, decode_row, encode_row
from shardex.sql.exec.statements import prepared_off_loop
from shardex.sql.exec.subqueries import Fetch, blocking_fetch
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.join_steps import join_spec, joined_rows
from shardex.sql.local_rows import unnest_specs
from shardex.sql.operators.join import key_bytes, piece
from shardex.sql.planner.joins import JoinPlan, plan_join
from shardex.sql.protocol import FragmentContext
from shardex.sql.syntax.bind import META_KEY, BoundSelect

__all__ = [
    "JOIN_KIND",
    "exchange_query_plan",
    "fragment_rows",
    "hash_key",
    "join_fragment",
    "partition_of",
    "partition_pack",
    "start_exchange_join",
]

JOIN_KIND: Final = "sql.join"
# The edges of an exchange join's plan: join fragments -> root, and each side -> joins.
OUT_EDGE, FROM_EDGE, INNER_EDGE = 1, 2, 3
FROM_SIDE, INNER_SIDE = "from", "inner"


def partition_of(key: bytes, partitions: int) -> int:
    """The join fragment (its position among the join's members) for an equi-join key.
    CRC-32: the same on every member and process (``hash()`` of bytes is salted)."""
    return zlib.crc32(key) % partitions


def hash_key(values: list[Any]) -> bytes | None:
    """Bytes equal for equal join keys (as ``=`` compares them), to hash: a lone string's
    UTF-8 or an integral number's digits (1 and 1.0 alike) straight away, anything else
    ``key_bytes`` (the collation encoding, four times the cost); None when a value is NULL
    or MISSING (equal to nothing). Unequal keys may share bytes ("1" and 1): they only
    share a partition."""
    if len(values) == 1:
        v = values[0]
        t = type(v)
        if t is str:
            return v.encode()
        if t is int:
            return b"%d" % v
        if t is float and v.is_integer() and abs(v) < 2.0**63:
            return b"%d" % int(v)
    return key_bytes(values)


def _side_key(b: BoundSelect, side: str, params: Any) -> tuple[Callable[[Any], Any], bool]:
    """The function from a side statement's row ``[docid, document]`` to its join key's
    values, and whether a row whose key is NULL or MISSING is still sent (the kept side's
    rows come out unmatched: a LEFT JOIN's left rows, a RIGHT JOIN's inner documents;
    anything else without a key matches nothing)."""
    plan = plan_join(b.joins[0])
    spec = join_spec(plan, params, compiled)
    alias = b.alias
    if side == FROM_SIDE:
        outer = spec.outer_key
        assert outer is not None and alias is not None
        return (lambda v: outer({alias: v[1], META_KEY: side_meta(v)})), spec.kind == "left"
    inner = spec.inner_key
    assert inner is not None
    return (lambda v: inner(piece(spec, v[0], v[1], side_meta(v)))), spec.kind == "right"


def partition_pack(b: BoundSelect, side: str, params: Any, partitions: int) -> Pack:
    """A leaf's ``pack`` for a hash exchange: its rows as ``(partition, batch)``, each row
    to the partition of its join key (``partition_of``), batches cut as ``to_batches``
    cuts them."""
    key_of, keep_unkeyed = _side_key(b, side, params)

    def pack(rows: Iterable[Any]) -> Iterator[tuple[int, pa.RecordBatch]]:
        cells: list[list[bytes]] = [[] for _ in range(partitions)]
        sizes = [0] * partitions
        for row in rows:
            key = hash_key(key_of(row))
            if key is None:
                if not keep_unkeyed:
                    continue
                key = str(row[0]).encode()  # spread: any member leaves it unmatched
            p = partition_of(key, partitions)
            cell = encode_row(row)
            cells[p].append(cell)
            sizes[p] += len(cell)
            if len(cells[p]) >= BATCH_ROWS or sizes[p] >= BATCH_BYTES:
                yield p, cells_batch(cells[p])
                cells[p], sizes[p] = [], 0
        for p, left in enumerate(cells):
            if left:
                yield p, cells_batch(left)

    return pack


def leaf_args(args: dict[str, Any], member: str) -> dict[str, Any]:
    """A side's leaf arguments on ``member``: one fragment spans the side's leaf members
    (the exchange's senders), each reading its own index partitions."""
    by_member = args.get("partitions_by_member")
    if by_member is None:
        return args
    return {**args, "partitions": by_member[member]}


async def leaf_pack(ctx: FragmentContext, default: Pack) -> Pack:
    """The ``pack`` of a ``sql.leaf`` fragment: ``default``, or for a side of an exchange
    join the partitioning by its join key among the ``ctx.partitions`` join fragments."""
    part = ctx.args.get("partition")
    if part is None:
        return default
    sql = part["sql"]
    b = await prepared_off_loop(sql, lambda: bind_statement(sql, False))
    return partition_pack(b, part["side"], ctx.parameters, ctx.partitions)


async def _cells(batches: AsyncIterator[pa.RecordBatch]) -> AsyncIterator[list[Any]]:
    async for batch in batches:
        yield batch.column(0).to_pylist()


async def join_fragment(
    ctx: FragmentContext, documents: DocumentAccess, memory: NodeMemory
) -> AsyncIterator[pa.RecordBatch]:
    """One join fragment: its partition of the inner side held, the FROM side's rows of its
    partition joined through it, then the statement's leaf work on the joined rows."""
    a, params, query = ctx.args, ctx.parameters, str(ctx.query_id)
    tuning = check_tuning(a.get("tuning"))
    sql = a["sql"]
    b = await prepared_off_loop(
        sql, lambda: bind_statement(sql, False, cached=tuning["plan_cache"])
    )
    plans = [plan_join(j) for j in b.joins]  # as the initiator planned: no index probed
    if exchange_join(plans, "") != HASH:
        raise ShardexError(
            "a join fragment got a statement whose join is not one hash join",
            code=ErrorCode.INTERNAL,
            details={"value": sql[:200], "hint": "the initiator plans it as decision 0123"},
        )
    sources = [_cells(ctx.inputs[FROM_EDGE]), _cells(ctx.inputs[INNER_EDGE])]
    sub_fetch = blocking_fetch(documents, asyncio.get_running_loop())
    with memory.fragment(query, a["budget"], a.get("spill", True)) as mem:

        def rows(ins: list[Iterator[Any]]) -> Any:
            return fragment_rows(b, plans, ins[0], ins[1], params, a, mem.budget(), sub_fetch)

        batches = run_pipeline(
            rows,
            sources,
            name=f"{query} join",
            inline=False,  # the build side is read whole before the first row
            decode=decode_row,
        )
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield batch


def fragment_rows(
    b: BoundSelect,
    plans: list[JoinPlan],
    from_rows: Iterable[Any],
    inner_rows: Iterable[Any],
    params: Any,
    a: dict[str, Any],
    budget: Budget,
    fetch: Fetch,
) -> Iterator[Any]:
    """A join fragment's output rows: ``inner_rows`` (its partition of the inner side,
    ``[docid, document]``) held, ``from_rows`` (its partition of the FROM side) joined
    through them, then UNNEST and the leaf work of the statement's ``a["mode"]`` (at most
    ``a["top"]`` rows where a limit allows), within ``budget``."""
    alias = b.alias
    assert alias is not None
    inner = ClusterSides(fetch, {0: iter(inner_rows)}, _no_probe, budget)
    scope = ({alias: v[1], META_KEY: side_meta(v)} for v in from_rows)
    joined = joined_rows(b, scope, plans, inner, params, unnest_specs(b, params), compiled)
    return leaf_rows(b, params, a["mode"], a["top"], budget, joined, fetch=fetch)


def _no_probe(k: int, values: list[Any]) -> list[Any]:
    raise AssertionError("an exchange join is a hash join: it never probes")


def exchange_query_plan(
    plan: PhysicalPlan,
    sql: str,
    sides: list[tuple[str, PhysicalPlan, Timestamp | None]],
    initiator: str,
    budget: int,
    spill: bool,
) -> QueryPlan:
    """The fragments of the join statement ``plan`` (text ``sql``) over its two side
    statements (``sides``: FROM's then the inner side's text, plan and TS): each side's
    leaves hash-partition into the join fragments, one on each member that runs a leaf,
    which send the statement's leaf output to the root on the initiator."""
    b = plan.bound
    mode = mode_of(b)
    joiners = sorted({leaf.member for _, p, _ in sides for leaf in p.leaves})
    common = {"sql": sql, "dml": False, "budget": budget, "spill": spill, "tuning": plan.tuning}
    root_args = {
        **common,
        "mode": mode,
        "source": "index",
        "keyspace": None,
        "limit": plan.limit,
        "offset": plan.offset,
        "late": False,
        # Sorted runs merge only one run per input: each join fragment's stream alone. Only
        # then: a fragment sorts all its rows before its first, so none waits on the root
        # while it reads another's; streamed rows (rows, window) the root takes as they
        # come, or a fragment the root is not reading would stall the leaves it shares.
        "by_sender": mode == "sort",
    }
    fragments = [
        FragmentSpec(
            fragment_id=0, kind=ROOT_KIND, members=[initiator], args=root_args, inputs=[OUT_EDGE]
        ),
        FragmentSpec(
            fragment_id=1,
            kind=JOIN_KIND,
            members=joiners,
            args={**common, "mode": mode, "top": plan.top},
            inputs=[FROM_EDGE, INNER_EDGE],
            output=OUT_EDGE,
        ),
    ]
    for fid, (edge, side, (side_sql, p, ts)) in enumerate(
        zip((FROM_EDGE, INNER_EDGE), (FROM_SIDE, INNER_SIDE), sides, strict=True), start=2
    ):
        leaves = p.query_plan(side_sql, False, initiator, ts, budget, spill).fragments[1:]
        assert leaves and all(f.kind == LEAF_KIND for f in leaves)
        args = {
            **leaves[0].args,
            "partitions_by_member": {f.members[0]: f.args["partitions"] for f in leaves},
            "partition": {"sql": sql, "side": side},
        }
        fragments.append(
            FragmentSpec(
                fragment_id=fid,
                kind=LEAF_KIND,
                members=[f.members[0] for f in leaves],
                args=args,
                output=edge,
                exchange=HASH,
            )
        )
    return QueryPlan(fragments=fragments)


def side_texts(sides: JoinSides) -> list[str]:
    """FROM's side statement, then the (one) inner side's."""
    assert sides.from_sql is not None and sides.gathered
    return [sides.from_sql, sides.gathered[0]]


def exchange_params(params: Any) -> Any:
    """The parameters every fragment of an exchange join reads: named, as the side
    statements take them (``side_params``); the statement reads ``$1`` there alike."""
    return side_params(params)


async def start_exchange_join(
    plan: PhysicalPlan,
    sql: str,
    params: Any,
    *,
    plan_side: Callable[[str, Any], Awaitable[PhysicalPlan]],
    pin: Callable[[PhysicalPlan], Awaitable[Timestamp | None]],
    execute: Callable[[QueryPlan, Any], Awaitable[Any]],
    initiator: str,
    budget: int,
    spill: bool,
) -> AsyncIterator[list[bytes]] | None:
    """The rows of the join statement ``plan`` (text ``sql``) joined between fragments, or
    None when a side does not read through index leaves (a key lookup, an expression):
    then the initiator joins. ``plan_side`` plans a side statement with its parameters,
    ``pin`` gives a side plan's TS at the statement's consistency, ``execute`` starts a
    ``QueryPlan`` (``QueryService.execute``)."""
    named = exchange_params(params)
    texts = side_texts(plan.join)
    planned = [await plan_side(text, named) for text in texts]
    if any(p.source != "index" or not p.leaves for p in planned):
        return None
    stamps = [await pin(p) for p in planned]
    sides = list(zip(texts, planned, stamps, strict=True))
    qplan = exchange_query_plan(plan, sql, sides, initiator, budget, spill)
    result = await execute(qplan, named)
    plan.query_id = str(result.query_id)
    assert plan.join is not None
    plan.join.ran = HASH
    return cells_closing(result)

"""The SQL execution protocol over real TCP on 127.0.0.1: three in-process members, each an
``RpcServer`` with a ``QueryService``, running two-fragment queries with a small window."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pyarrow as pa
import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.net import RpcServer, TcpTransport
from shardex.sql.protocol import (
    ExchangeMeter,
    FragmentContext,
    FragmentRegistry,
    FragmentSpec,
    ProtocolConfig,
    QueryPlan,
    QueryService,
)

SECRET = "sql-protocol-tcp-secret"
MEMBERS = ("m1", "m2", "m3")
ROWS = 3000
WINDOW = 4096


class Directory:
    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}

    def address_of(self, member_id: str) -> str | None:
        return self.addresses.get(member_id)

    def is_down(self, member_id: str) -> bool:
        return False


async def emit(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
    base = ctx.instance * ROWS
    for start in range(0, ROWS, 100):
        batch = pa.record_batch(
            {
                "i": pa.array(range(base + start, base + start + 100), pa.int64()),
                "src": pa.array([ctx.member_id] * 100, pa.string()),
            }
        )
        if ctx.partitions == 1:
            yield batch
        else:  # a hash exchange: row i to the reader at position i % partitions
            for p in range(ctx.partitions):
                yield (
                    p,
                    batch.filter(
                        pa.array([i % ctx.partitions == p for i in batch["i"].to_pylist()])
                    ),
                )
        await asyncio.sleep(0)


async def semi_join(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
    """Edge 3 (broadcast) held whole, then edge 2's (hashed) rows whose i it holds, each
    tagged with the member that joined it."""
    build: set[int] = set()
    async for batch in ctx.inputs[3]:
        build.update(batch["i"].to_pylist())
    async for batch in ctx.inputs[2]:
        found = batch.filter(pa.array([i in build for i in batch["i"].to_pylist()]))
        yield found.append_column("at", pa.array([ctx.member_id] * found.num_rows))


async def collect(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
    async for batch in ctx.input():
        yield batch


async def total(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
    count = acc = 0
    async for batch in ctx.input():
        count += batch.num_rows
        acc += sum(batch.column("i").to_pylist())
    yield pa.RecordBatch.from_pylist([{"count": count, "total": acc}])


async def boom(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
    raise ShardexError(f"boom on {ctx.member_id}", code=ErrorCode.EXPRESSION_EVAL)
    yield  # an async generator


async def state_freed(services: Iterable[QueryService], within: float = 10.0) -> None:
    """Wait for every member to free its query state (a participant frees after its last
    batch is written, which may be just after the initiator has read it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        left = {s.member_id: s.describe() for s in services}
        busy = {m: {k: v for k, v in d.items() if v and k != "tombstones"} for m, d in left.items()}
        if not any(busy.values()):
            return
        assert loop.time() < deadline, f"state not freed: {busy}"
        await asyncio.sleep(0.01)


def plan(root_kind: str, leaf_kind: str = "emit") -> QueryPlan:
    return QueryPlan(
        fragments=[
            FragmentSpec(fragment_id=0, kind=root_kind, members=["m1"], inputs=[1]),
            FragmentSpec(fragment_id=1, kind=leaf_kind, members=["m2", "m3"], output=1),
        ]
    )


def exchange_plan() -> QueryPlan:
    """emit on m2, m3 hashed to semi_join on m2, m3; emit on m3 broadcast to them."""
    return QueryPlan(
        fragments=[
            FragmentSpec(fragment_id=0, kind="collect", members=["m1"], inputs=[1]),
            FragmentSpec(fragment_id=1, kind="semi", members=["m2", "m3"], inputs=[2, 3], output=1),
            FragmentSpec(
                fragment_id=2, kind="emit", members=["m2", "m3"], output=2, exchange="hash"
            ),
            FragmentSpec(
                fragment_id=3, kind="emit", members=["m3"], output=3, exchange="broadcast"
            ),
        ]
    )


@pytest.mark.timeout(60)
async def test_two_fragment_queries_over_tcp_with_a_small_window() -> None:
    directory, meter = Directory(), ExchangeMeter()
    fragments = FragmentRegistry(
        {"emit": emit, "collect": collect, "sum": total, "boom": boom, "semi": semi_join}
    )
    config = ProtocolConfig(window=WINDOW, timeout=20.0, check_interval=0.2)
    servers: list[RpcServer] = []
    services: dict[str, QueryService] = {}
    try:
        for m in MEMBERS:
            transport = TcpTransport()
            svc = QueryService(
                member_id=m,
                transport=transport,
                secret=SECRET,
                directory=directory,
                fragments=fragments,
                config=config,
                meter=meter,
            )
            server = RpcServer(transport, SECRET, name=m)
            svc.install(server)
            directory.addresses[m] = await server.start("127.0.0.1:0")
            await svc.start()
            servers.append(server)
            services[m] = svc
        m1 = services["m1"]

        rows = await (await m1.execute(plan("collect"))).all_rows()
        assert sorted(r["i"] for r in rows) == list(range(2 * ROWS))
        assert {r["src"] for r in rows if r["i"] < ROWS} == {"m2"}

        (summary,) = await (await m1.execute(plan("sum"))).all_rows()
        assert summary == {"count": 2 * ROWS, "total": sum(range(2 * ROWS))}

        with pytest.raises(ShardexError) as err:
            await (await m1.execute(plan("collect", "boom"))).all_rows()
        assert err.value.code is ErrorCode.EXPRESSION_EVAL

        # Between fragments off the initiator: the broadcast side (emit on m3, its first
        # instance: i < ROWS) reaches both joiners, each probe row only its partition's.
        rows = await (await m1.execute(exchange_plan())).all_rows()
        assert sorted(r["i"] for r in rows) == list(range(ROWS))
        assert all(r["at"] == ("m2", "m3")[r["i"] % 2] for r in rows)

        # Every stream stayed within the window, and the window really bit.
        assert meter.streams
        for st in meter.streams.values():
            assert st.max_in_flight <= WINDOW and st.max_sender_bound <= WINDOW
        assert any(st.stalls for st in meter.streams.values())
        await state_freed(services.values())
        assert services["m2"].sent["QueryBatch"] > 0 and m1.sent["QueryExecute"] == 8
    finally:
        for svc in services.values():
            await svc.stop()
        for server in servers:
            await server.stop()

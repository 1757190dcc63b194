"""The member's cap on executions of other members' queries (``max_executions``), over real
TCP: one execution past the cap fails its query with QUERY_OVERLOADED at once (no wait, so
no cycle with the initiators' statement slots), the member's own queries are not counted,
an execution's end frees its place, and leaves run by request and reply count too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pyarrow as pa
import pytest

from shardex.api.query_ids import QueryId
from shardex.errors import ErrorCode, ShardexError
from shardex.net import RpcServer, TcpTransport
from shardex.sql.protocol import (
    FragmentContext,
    FragmentRegistry,
    FragmentSpec,
    ProtocolConfig,
    QueryPlan,
    QueryService,
)
from tests.integration.sql.test_sql_protocol_tcp import SECRET, Directory, collect, state_freed


def one_row(i: int) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array([i], pa.int64())})


def plan(root: str, leaf: str, kind: str) -> QueryPlan:
    return QueryPlan(
        fragments=[
            FragmentSpec(fragment_id=0, kind="collect", members=[root], inputs=[1]),
            FragmentSpec(fragment_id=1, kind=kind, members=[leaf], output=1),
        ]
    )


@pytest.mark.timeout(60)
async def test_an_execution_past_the_cap_fails_its_query_at_once() -> None:
    release = asyncio.Event()
    holding = asyncio.Event()

    async def hold(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        holding.set()
        await release.wait()  # the test says when this execution ends
        yield one_row(1)

    async def quick(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        yield one_row(2)

    directory = Directory()
    fragments = FragmentRegistry({"collect": collect, "hold": hold, "quick": quick})
    servers: list[RpcServer] = []
    services: dict[str, QueryService] = {}
    try:
        for m, cap in (("m1", None), ("m2", 1)):
            transport = TcpTransport()
            svc = QueryService(
                member_id=m,
                transport=transport,
                secret=SECRET,
                directory=directory,
                fragments=fragments,
                config=ProtocolConfig(timeout=30.0, check_interval=0.2, max_executions=cap),
            )
            server = RpcServer(transport, SECRET, name=m)
            svc.install(server)
            directory.addresses[m] = await server.start("127.0.0.1:0")
            await svc.start()
            servers.append(server)
            services[m] = svc
        m1, m2 = services["m1"], services["m2"]

        held = await m1.execute(plan("m1", "m2", "hold"))  # m2's one place, until released
        rows = asyncio.ensure_future(held.all_rows())
        await asyncio.wait_for(holding.wait(), 30)
        with pytest.raises(ShardexError) as info:
            await (await m1.execute(plan("m1", "m2", "quick"))).all_rows()
        e = info.value
        assert e.code is ErrorCode.QUERY_OVERLOADED
        assert "limit 1" in e.message and "sql_max_fragments" in e.details["hint"]
        assert m2.registry.stats["executes_overloaded"] == 1
        # m2's own query is admitted by its initiator's statement slot, not by the cap.
        assert await (await m2.execute(plan("m2", "m1", "quick"))).all_rows() == [{"i": 2}]
        release.set()
        assert await rows == [{"i": 1}]
        await state_freed(services.values())
        # The ended execution gave its place back.
        assert await (await m1.execute(plan("m1", "m2", "quick"))).all_rows() == [{"i": 2}]
        # A leaf run by request and reply (``leaf_calls``) takes a place as well.
        with m2.leaf_call(QueryId("m1", "call")):
            with pytest.raises(ShardexError) as info:
                await (await m1.execute(plan("m1", "m2", "quick"))).all_rows()
            assert info.value.code is ErrorCode.QUERY_OVERLOADED
            with pytest.raises(ShardexError) as info, m2.leaf_call(QueryId("m1", "again")):
                pass
            assert info.value.code is ErrorCode.QUERY_OVERLOADED
            with m2.leaf_call(QueryId("m2", "own")):  # m2's own queries are not counted
                pass
        assert m2.calls == 0
        assert await (await m1.execute(plan("m1", "m2", "quick"))).all_rows() == [{"i": 2}]
    finally:
        release.set()
        for svc in services.values():
            await svc.stop()
        for server in servers:
            await server.stop()


def test_a_cap_below_one_is_a_config_error() -> None:
    with pytest.raises(ShardexError) as info:
        ProtocolConfig(max_executions=0)
    assert info.value.code is ErrorCode.CONFIG_ERROR

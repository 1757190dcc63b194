"""Scans of indexes with replicas: each partition is read from one copy, and an indexer that
cannot be reached while the slices are opened is replaced by another copy of its partitions
(``scan/coordinator.py``), also once its rows stream (``scan/failover.py``). Two indexer
nodes on loopback, a replica of every partition on the other node
(``scan_env.Env(replicas=True)``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.scan import coordinator
from tests.integration.scan_env import KS, Env, as_rows, oracle_rows

CASES = [
    ("by_name", None),
    ("by_name", [{"low": ["bob"], "high": ["dee"], "inclusion": "low"}]),
    ("by_age", [{"low": [1], "high": [3], "inclusion": "neither"}]),
    ("by_city", [{"low": ["oslo"], "high": ["rome"]}]),
    ("#primary", None),
]


@pytest.fixture
async def renv(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path, replicas=True)
    await e.start()
    try:
        yield e
    finally:
        await e.stop()


async def test_a_dead_indexer_is_replaced_by_the_other_copy(renv: Env) -> None:
    ts = await renv.round(random.Random(7), 300)
    docs = renv.ks.documents_at(ts)
    wants = {}
    for name, spans in CASES:
        wants[(name, repr(spans))] = want = oracle_rows(renv.defs[name], docs, spans)
        assert want, name
        got = await renv.scan(name, spans, consistency="at_plus", at=ts)
        assert as_rows(got) == want, name
    # Every copy holds the same entries: n2's replicas equal n1's primaries and back.
    for d in renv.defs.values():
        for p, primary in renv.placement[d.id].items():
            (replica,) = renv.replicas[d.id][p]
            copies = [
                renv.nodes[n].svc.engine.slice(d.id, p).entries(None) for n in (primary, replica)
            ]
            assert copies[0] == copies[1], (d.name, p)
    await renv.nodes["n2"].server.stop()  # n2 is gone; the client talks to n1
    for name, spans in CASES:
        got = await renv.scan(name, spans, consistency="at_plus", at=ts, stability="scan")
        assert as_rows(got) == wants[(name, repr(spans))], name
        page = await renv.scan(name, spans, "at_plus", ts, limit=3, offset=1)
        assert as_rows(page) == wants[(name, repr(spans))][1:4], name


async def test_without_replicas_a_dead_indexer_fails_the_scan(env: Env) -> None:
    ts = await env.round(random.Random(7), 100)
    await env.nodes["n2"].server.stop()
    with pytest.raises(ShardexError) as err:
        await env.scan("by_name", None, consistency="at_plus", at=ts)
    assert err.value.code in (ErrorCode.NODE_UNAVAILABLE, ErrorCode.CONNECTION_CLOSED)


@pytest.mark.parametrize("ordered", [True, False])
async def test_an_indexer_dying_mid_stream_is_continued_on_the_other_copy(
    renv: Env, monkeypatch: pytest.MonkeyPatch, ordered: bool
) -> None:
    """Small blocks and one block of credit per slice stream: when the client has its first
    row, n2 has sent at most a few hundred of its thousands of entries (by_age partition 1),
    so stopping it lands in the middle of its stream. The coordinator (n1) continues n2's
    partition on its copy (here: n1's own) after the last entry it read, at the same TS.
    Ages repeat: many entries share a key and differ in their docid."""
    monkeypatch.setattr(coordinator, "BLOCK_ROWS", 100)
    monkeypatch.setattr(coordinator, "SLICE_BLOCK_ROWS", 100)
    monkeypatch.setattr(coordinator, "SLICE_CREDIT", 1)
    ts = await many_users(renv, 9_000)
    want = oracle_rows(renv.defs["by_age"], renv.ks.documents_at(ts), None)

    def first_row() -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
        rows = iter(
            client_of(renv).scan(KS, "by_age", consistency="at_plus", at=ts, ordered=ordered)
        )
        return rows, next(rows)

    rows, first = await asyncio.to_thread(first_row)
    await renv.nodes["n2"].server.stop()
    rest = await asyncio.to_thread(list, rows)
    got = as_rows([first, *rest])
    assert (got if ordered else sorted(got)) == want
    assert len(want) == 9_000
    assert renv.nodes["n1"].coord.stream_failovers == 1


async def test_a_scan_of_the_tips_does_not_fail_over_mid_stream(
    renv: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another copy's tip is another state of the index: a stability-none scan whose
    indexer dies after rows went out ends with the error."""
    monkeypatch.setattr(coordinator, "BLOCK_ROWS", 100)
    monkeypatch.setattr(coordinator, "SLICE_BLOCK_ROWS", 100)
    monkeypatch.setattr(coordinator, "SLICE_CREDIT", 1)
    await many_users(renv, 9_000)

    def first_row() -> Iterator[dict[str, Any]]:
        rows = iter(client_of(renv).scan(KS, "by_age", stability="none"))
        next(rows)
        return rows

    rows = await asyncio.to_thread(first_row)
    await renv.nodes["n2"].server.stop()
    with pytest.raises(ShardexError) as err:
        await asyncio.to_thread(list, rows)
    assert err.value.code is ErrorCode.CONNECTION_CLOSED
    assert renv.nodes["n1"].coord.stream_failovers == 0


async def many_users(env: Env, n: int) -> Timestamp:
    """``n`` documents in by_age (partitioned by docid over n1 and n2), 37 ages shared
    by all of them: delivered and stabilised."""
    for i in range(n):
        env.ks.upsert(f"u{i:05}", {"name": f"n{i % 13}", "age": i % 37})
    ts = env.ks.ts()
    await env.deliver(ts)
    await env.stabilise(ts)
    return ts


def client_of(env: Env) -> Client:
    assert env.client is not None
    return env.client

"""Scans of indexes with replicas: each partition is read from one copy, and an indexer that
cannot be reached while the slices are opened is replaced by another copy of its partitions
(``scan/coordinator.py``). Two indexer nodes on loopback, a replica of every partition on
the other node (``scan_env.Env(replicas=True)``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardex.errors import ErrorCode, ShardexError
from tests.integration.scan_env import Env, as_rows, oracle_rows

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

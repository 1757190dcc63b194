"""SQL statements on the calling thread's socket (``client/direct_sql.py``): the same rows
and errors as the loop path, a streamed result read from that socket, a statement started
while another's rows still stream there taking the loop path, and a result abandoned
half-read leaving the socket usable. No index, so no Spark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

import shardex.client.query as query_module
from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import MIN_QUERY_MEMORY
from shardex.sql.exec.reply import BLOCK_ROWS

pytestmark = pytest.mark.cluster

KS = "people"
DOCS = {f"p{i:03}": {"name": f"n{i}", "age": i % 50} for i in range(60)}
BIG = list(range(3 * BLOCK_ROWS + 11))  # past one block: the rest streams
STREAMED = "SELECT RAW x FROM ($1) AS x"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("sql-direct")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, 8)
        c.keyspace(KS).upsert_many(DOCS.items())
        yield c


@pytest.fixture(scope="module")
def loop_client(cluster: LocalCluster, client: Client) -> Iterator[Client]:
    with connect_local(Path(cluster.path), direct_scans=False) as c:
        yield c


@pytest.fixture
def loop_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements that took the loop path in the test."""
    seen: list[str] = []
    real = query_module._start

    async def spy(scans: Any, msg: Any, *args: Any) -> Any:
        seen.append(msg.statement)
        return await real(scans, msg, *args)

    monkeypatch.setattr(query_module, "_start", spy)
    return seen


def test_rows_and_errors_equal_the_loop_path(
    client: Client, loop_client: Client, loop_starts: list[str]
) -> None:
    cases: list[tuple[str, Any]] = [
        (f"SELECT name FROM {KS} WHERE META().id = $1", ["p007"]),
        (f"SELECT RAW META().id FROM {KS} USE KEYS $1", [sorted(DOCS)[:5]]),
        (STREAMED, [BIG]),
        ("SELECT 1 + 1 AS two", None),
    ]
    for sql, params in cases:
        assert list(client.query(sql, params)) == list(loop_client.query(sql, params)), sql
    bad = "SELECT RAW x FROM ($1) AS x ORDER BY x DESC"
    for c in (client, loop_client):
        with pytest.raises(ShardexError) as info:
            rows = c.query(bad, [list(range(2000))], memory_quota=MIN_QUERY_MEMORY, spill=False)
            list(rows)  # 2000 sorted rows hold over the smallest quota
        assert info.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    # The loop client's statements are the only ones that took the loop path.
    assert len(loop_starts) == len(cases) + 1


def test_a_statement_while_another_streams_takes_the_loop_path(
    client: Client, loop_starts: list[str]
) -> None:
    outer = client.query(STREAMED, [BIG])
    it = iter(outer)
    head = [next(it) for _ in range(BLOCK_ROWS + 5)]  # into the streamed part
    inner = list(client.query(f"SELECT RAW name FROM {KS} USE KEYS 'p001'"))
    assert inner == ["n1"]
    assert head + list(it) == BIG
    assert loop_starts == [f"SELECT RAW name FROM {KS} USE KEYS 'p001'"]
    # The socket is free again: the next statement is back on the calling thread.
    assert list(client.query(f"SELECT RAW name FROM {KS} USE KEYS 'p002'")) == ["n2"]
    assert len(loop_starts) == 1


def test_a_result_abandoned_half_read_leaves_the_socket_serving(
    client: Client, loop_starts: list[str]
) -> None:
    for _ in range(3):
        with client.query(STREAMED, [BIG]) as early:
            it = iter(early)
            assert [next(it) for _ in range(BLOCK_ROWS + 2)] == BIG[: BLOCK_ROWS + 2]
        assert list(client.query(STREAMED, [BIG])) == BIG
    assert loop_starts == []

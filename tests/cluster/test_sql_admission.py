"""Admission control on a real node configured to run one SQL statement at a time with one
waiting (``sql_max_running = 1``, ``sql_max_queued = 1`` in its node.toml): a third
statement is refused with QUERY_OVERLOADED while the other two succeed, and no way a
statement ends (an error, a cancel, a client gone) keeps its slot; with ``max_connections``
set, a user's connection past it is told TOO_MANY_CONNECTIONS.

A statement holds its slot until its last row is sent, so a result larger than the reply's
block plus the client's credit, not read, holds the one slot for as long as the test wants:
no sleeps, no timing."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, free_base_port, kill_leftovers, run_cli

from shardex.client import Client, connect_local
from shardex.client.query import CREDIT, QueryRows
from shardex.errors import ErrorCode, ShardexError
from shardex.meta import cluster_dir as cdir
from shardex.net import Connection, TcpTransport, connect
from shardex.net.credentials import UserLogin
from shardex.runtime.pidfile import pid_alive
from shardex.sql.exec.memory import MIN_QUERY_MEMORY
from shardex.sql.exec.reply import BLOCK_ROWS

pytestmark = pytest.mark.cluster

SQL = "SELECT RAW x FROM ($1) AS x"
# The reply's block, the client's credit and as many again: the producer waits for credit.
N = BLOCK_ROWS * (2 * CREDIT + 4)
ROWS = list(range(N))
MAX_CONNECTIONS = 40  # well above what the other tests' clients hold at once


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("sql-admission")
    c = LocalCluster(path, 1, free_base_port(1))
    spec = cdir.create(path, nodes=1, base_port=c.base_port)
    toml = spec.nodes[0].path(path) / cdir.NODE_CONFIG_FILE
    limits = f"sql_max_running = 1\nsql_max_queued = 1\nmax_connections = {MAX_CONNECTIONS}\n"
    toml.write_text(toml.read_text() + limits)
    try:
        c.start()
        yield c
    finally:
        if c.pid(1) is not None and pid_alive(c.pid(1) or 0):
            run_cli("cluster", "stop", "--dir", str(path), "--timeout", "5", check=False)
        kill_leftovers(path)


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(Path(cluster.path)) as c:
        yield c


def held(c: Client) -> QueryRows:
    """A statement that holds the node's one slot until its rows are read or it is closed."""
    q = c.query(SQL, [ROWS])
    assert q.started.rows is not None and not q.started.done  # rows left on the stream
    return q


def answer(c: Client) -> Any:
    return list(c.query("SELECT RAW 1 + 1"))


def test_a_third_statement_is_overloaded_while_two_succeed(cluster: LocalCluster) -> None:
    with (
        connect_local(Path(cluster.path)) as a,
        connect_local(Path(cluster.path)) as b,
        connect_local(Path(cluster.path)) as c,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        first = held(a)
        # Two more at once: whichever arrives first waits in the one queue place, the
        # other is refused at once (it cannot wait: the queue is full).
        fb = pool.submit(lambda: list(b.query(SQL, [ROWS])))
        fc = pool.submit(lambda: list(c.query(SQL, [ROWS])))
        done, _ = concurrent.futures.wait([fb, fc], return_when="FIRST_COMPLETED", timeout=60)
        assert len(done) == 1, "neither statement was refused while the slot was held"
        (refused,) = done
        with pytest.raises(ShardexError) as info:
            refused.result()
        e = info.value
        assert e.code is ErrorCode.QUERY_OVERLOADED
        assert "1 SQL statements running and 1 queued" in e.message
        assert "sql_max_running" in e.details["hint"]
        assert list(first) == ROWS  # read to the end: the slot passes to the waiter
        waiting = fc if refused is fb else fb
        assert waiting.result(timeout=60) == ROWS
        assert answer(c) == [2]  # the refused client's connection serves on


def test_statements_that_fail_or_are_cancelled_give_their_slot_back(client: Client) -> None:
    for _ in range(5):
        with pytest.raises(ShardexError) as info:
            list(client.query("SELEC nonsense"))
        assert info.value.code is ErrorCode.SQL_SYNTAX
        with pytest.raises(ShardexError) as info:  # fails while its rows flow
            sql = "SELECT RAW x FROM ($1) AS x ORDER BY x"
            list(client.query(sql, [ROWS], memory_quota=MIN_QUERY_MEMORY, spill=False))
        assert info.value.code is ErrorCode.QUERY_MEMORY_LIMIT
        with held(client) as q:  # closed unread: the stream is cancelled
            assert next(iter(q)) == 0
    # Had any of them kept the slot, this one would queue behind it and be refused.
    assert answer(client) == [2]


def test_a_client_gone_mid_statement_gives_its_slot_back(
    cluster: LocalCluster, client: Client
) -> None:
    for _ in range(3):
        gone = connect_local(Path(cluster.path))
        held(gone)
        gone.close()  # the connection drops with the stream open
        # The slot comes free once the node sees the connection closed: the next statement
        # may wait for that (within its queue wait), never be refused.
        assert list(client.query(SQL, [ROWS])) == ROWS


def test_users_past_max_connections_are_told_why(cluster: LocalCluster, client: Client) -> None:
    password = cdir.read_admin_password(cluster.path)
    assert password is not None

    async def open_until_refused() -> tuple[int, str | None]:
        opened: list[Connection] = []
        try:
            for i in range(MAX_CONNECTIONS + 1):
                login = UserLogin(cdir.ADMIN_USER, password)
                conn = await connect(TcpTransport(), cluster.address(1), login, name=f"u{i}")
                opened.append(conn)
                try:
                    await conn.ping(30)
                except ShardexError as exc:
                    return len(opened), exc.details.get("notice")
            return len(opened), None
        finally:
            await asyncio.gather(*(c.close() for c in opened))

    count, notice = asyncio.run(open_until_refused())
    assert notice == ErrorCode.TOO_MANY_CONNECTIONS and count <= MAX_CONNECTIONS
    assert answer(client) == [2]  # connections already open serve on

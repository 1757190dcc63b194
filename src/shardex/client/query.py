"""SQL from the client: ``client.query(sql, params=None, consistency="request_plus")``.

Index DDL (CREATE/DROP/BUILD INDEX) goes to the client's ``execute_ddl``; every other
statement is sent as ``SqlQuery`` to the node the client is connected to (failing over to
the next one if it cannot be reached: nothing ran yet), which becomes the query's initiator.
The reply carries the first block of rows (a small result: every row, and no stream
follows); the rest come on the scan session's connection as ``ScanBlock`` entries (msgpack
rows) with block credits, so however slowly the caller iterates, at most ``CREDIT`` blocks
wait in the client. Rows the reply carried are read without a hop to the client's loop
thread.

``QueryRows`` is the iterator of rows (dicts; the bare values for SELECT RAW). Once it is
exhausted, ``metrics`` holds elapsed seconds, the result count, the bytes received, the
mutation count (DML) and what the statement read (index, stability TS).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import msgspec

from shardex.api.scan import AT_PLUS, CONSISTENCIES, packed_ts
from shardex.api.scan_streams import InStream
from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.api.validation import check_durability, check_durability_timeout
from shardex.client.direct_scan import DirectStream
from shardex.client.routes import Route
from shardex.client.scan import REPLY_MARGIN, to_wire_ts
from shardex.core.timestamp import Timestamp
from shardex.errors import ConnectionClosed, ErrorCode, NodeUnavailable, ShardexError
from shardex.sql.ddl import BuildIndexStmt, CreateIndexStmt, DropIndexStmt
from shardex.sql.exec.analyze import key_lookup, key_route
from shardex.sql.exec.rows import decode_row
from shardex.sql.exec.statements import bound_statement, parsed
from shardex.sql.syntax.ast import SelectStmt

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession
    from shardex.client.scan import ScanPaths

__all__ = ["QueryMetrics", "QueryRows", "run_query"]

CREDIT: Final = 4
DEFAULT_QUERY_TIMEOUT: Final = 120.0
_FAILOVER = (NodeUnavailable, ConnectionClosed)


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


@dataclass
class QueryMetrics:
    elapsed: float  # seconds, from the call to the last row
    result_count: int
    bytes: int  # encoded result bytes received
    mutation_count: int = 0
    statement: str = ""
    index: str | None = None
    # The stability TS the query read, as its reply carried it (None: none), decoded only
    # when ``ts`` is asked for: it names every data partition, and most callers never look.
    packed_ts: bytes | None = field(default=None, repr=False)
    details: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def ts(self) -> Timestamp | None:
        """The stability TS every scan of the query read (None: it read none)."""
        return None if self.packed_ts is None else Timestamp.from_packed(self.packed_ts)


class QueryRows:
    """The rows of one statement, read once. ``metrics`` is None until the rows are
    exhausted. Use as a context manager (or ``close()``) to stop a query early."""

    def __init__(
        self,
        rpc: RpcSession,
        started: SqlStarted,
        stream: InStream | DirectStream | None,
        rows: list[Any] | None,
        t0: float,
        block_timeout: float | None = None,
    ) -> None:
        self._rpc = rpc
        self._stream = stream
        self._block_timeout = block_timeout  # a calling-thread stream's wait per block
        self._rows = rows
        self.started = started
        self._t0 = t0
        self.metrics: QueryMetrics | None = None
        self._count = 0
        self._bytes = 0
        self._iterating = False

    def __iter__(self) -> Iterator[Any]:
        if self._iterating:
            raise _bad("a query's rows can be read once", statement=self.started.statement)
        self._iterating = True
        return self._gen()

    def _gen(self) -> Iterator[Any]:
        if self._rows is not None:
            for row in self._rows:
                self._count += 1
                yield row
            self._done()
            return
        stream = self._stream
        assert stream is not None
        try:
            while True:
                answered, block = stream.poll()  # the reply's rows: no loop round trip
                if not answered:
                    block = self._next_block(stream)
                if block is None:
                    break
                for cell in block:
                    self._count += 1
                    self._bytes += len(cell)
                    yield decode_row(cell)
        finally:
            self.close()
        self._done()

    def _next_block(self, stream: InStream | DirectStream) -> list[bytes] | None:
        """The next streamed block: read by this thread from its socket, or by the loop."""
        if isinstance(stream, DirectStream):
            return stream.read(self._block_timeout)
        return self._rpc.run(stream.next_block())

    def _done(self) -> None:
        s = self.started
        self.metrics = QueryMetrics(
            elapsed=time.monotonic() - self._t0,
            result_count=self._count,
            bytes=self._bytes,
            mutation_count=s.mutation_count,
            statement=s.statement,
            index=s.index,
            packed_ts=packed_ts(s.ts),
            details=dict(s.details),
        )

    def close(self) -> None:
        stream = self._stream
        if stream is None or stream.done or stream.complete:
            return
        if not isinstance(stream, DirectStream):
            self._rpc.run(stream.cancel())
        elif self._rpc.closed:
            stream.release()  # the client closed the socket; the node ends the stream
        else:
            stream.cancel()

    def __enter__(self) -> QueryRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.lru_cache(maxsize=256)
def _text_route(sql: str) -> Route | None:
    """The route of a SELECT known from its text alone: a key lookup of one parameter key
    goes to the key's owner (``key_route``, the rule a node's reply applies)."""
    try:
        b = bound_statement(sql, False)
    except ShardexError:  # the node reports it
        return None
    route = key_route(b, key_lookup(b))
    return None if route is None else Route(keyspace=route[0], param=route[1])


def _order(scans: ScanPaths, msg: SqlQuery) -> tuple[list[str], Route | None, str | None]:
    """The addresses to try in turn, the statement's routing hint and the address it names
    for these parameters (``routes``; for a key lookup the client has no reply to learn
    from yet, its text's route): where the statement runs with the fewest hops first, then
    the client's node and the next ones."""
    rpc = scans.rpc
    addresses = rpc.addresses
    first = rpc.current
    order = [addresses[(first + k) % len(addresses)] for k in range(len(addresses))]
    route = scans.routes.get(msg.statement)
    guide = route if route is not None or not _may_route(msg) else _text_route(msg.statement)
    hint = None if guide is None else guide.target(msg.params, rpc.router.owner_address)
    if hint is not None:
        order = [hint, *(a for a in order if a != hint)]
    return order, route, hint


def _may_route(msg: SqlQuery) -> bool:
    """A SELECT whose tuning leaves routing on (a node answers a key lookup in-process
    only with the ``local`` and ``inline`` switches on)."""
    tuning = msg.tuning or {}
    if tuning.get("local") is False or tuning.get("inline") is False:
        return False
    return isinstance(parsed(msg.statement), SelectStmt)


def _learn(
    scans: ScanPaths,
    msg: SqlQuery,
    started: SqlStarted,
    address: str,
    hint: str | None,
    route: Route | None,
) -> Route | None:
    """Keep what the reply says about where the statement should go; the route when it is
    new (the caller prepares for it: a connection, the topology for key routing)."""
    if started.statement != "select":
        if hint is not None and address != hint:
            scans.routes.drop(msg.statement)  # the hinted node did not answer
        return None
    learned = scans.routes.learn(msg.statement, started.details, address)
    return learned if learned is not None and route is None else None


async def _start(
    scans: ScanPaths, msg: SqlQuery, order: list[str], hint: str | None, route: Route | None
) -> tuple[SqlStarted, InStream, str]:
    """The loop path: ``msg`` to the first address of ``order`` that answers."""
    session = scans.loop_session()
    rpc = scans.rpc
    last: ShardexError | None = None
    for address in order:
        stream = session.inboxes.open()
        try:
            conn = await session.pool.get(address)
            stream.attach(conn)
            req = msgspec.structs.replace(msg, stream_id=stream.scan_id)
            started = await conn.request(req, _reply_timeout(rpc, msg), expect=SqlStarted)
            stream.put_head(started.rows, started.done)
        except _FAILOVER as exc:
            await stream.cancel()
            last = exc
            continue
        except BaseException:
            await stream.cancel()
            raise
        learned = _learn(scans, msg, started, address, hint, route)
        if learned is not None:
            # The next run goes elsewhere: the connection is opened meanwhile, and key
            # routing needs the keyspace's topology in the client's cache.
            for target in [learned.address] if learned.address else rpc.addresses:
                session.pool.connect_soon(target)
            if learned.keyspace is not None:
                await _cache_topology(rpc, learned.keyspace)
        return started, stream, address
    assert last is not None
    raise last


def _reply_timeout(rpc: RpcSession, msg: SqlQuery) -> float:
    return msg.timeout + REPLY_MARGIN + rpc.request_timeout


async def _cache_topology(rpc: RpcSession, keyspace: str) -> None:
    # On failure: no key routing until a request of the client caches the topology.
    with contextlib.suppress(ShardexError):
        await rpc.router.keyspace(keyspace)


def _check_params(params: Any) -> list[Any] | dict[str, Any] | None:
    if params is None:
        return None
    if isinstance(params, Mapping):
        return {str(k).lstrip("$"): v for k, v in params.items()}
    if isinstance(params, str | bytes) or not isinstance(params, Sequence):
        raise _bad(
            f"params must be a list or a mapping, not {type(params).__name__}",
            hint="params=[...] for $1, $2 or {'name': ...} for $name",
        )
    return list(params)


def run_query(
    scans: ScanPaths,
    execute_ddl: Callable[[str], dict[str, Any] | list[dict[str, Any]]],
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] | None = None,
    consistency: str = "request_plus",
    *,
    at: Any = None,
    timeout: float = DEFAULT_QUERY_TIMEOUT,
    memory_quota: int | None = None,
    spill: bool = True,
    window: int | None = None,
    tuning: Mapping[str, bool] | None = None,
    durability: str = "persist",
    durability_timeout: float | None = None,
) -> QueryRows:
    """Rows go over ``scans``' loop-path session; index DDL goes to ``execute_ddl`` (the
    client's). ``window``: the credit window of every exchange of the query, bytes (None: the
    node's default). ``tuning``: switches of the execution (``shardex.sql.exec.tuning``),
    for benchmarks that compare paths; the node rejects unknown names."""
    t0 = time.monotonic()
    if not isinstance(sql, str) or not sql.strip():
        raise _bad(f"a statement must be non-empty text, got {sql!r:.80}", value=repr(sql)[:200])
    if consistency not in CONSISTENCIES:
        raise _bad(
            f"consistency must be one of {', '.join(CONSISTENCIES)}, got {consistency!r}",
            value=repr(consistency),
        )
    if (at is not None) != (consistency == AT_PLUS):
        raise _bad(
            "at_plus needs at=..., and at is only for at_plus",
            consistency=consistency,
            hint="consistency='at_plus', at=<the writes' MutationResults>",
        )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise _bad(f"timeout must be a positive number of seconds, got {timeout!r}")
    check_durability(durability)
    if memory_quota is not None and (
        isinstance(memory_quota, bool) or not isinstance(memory_quota, int) or memory_quota < 1
    ):
        raise _bad(
            f"memory_quota must be a positive number of bytes, got {memory_quota!r}",
            value=repr(memory_quota)[:80],
            hint="e.g. memory_quota=64 * 2**20, or leave it out for the node's default",
        )
    durability_timeout = check_durability_timeout(durability_timeout)
    wire_params = _check_params(params)
    stmt = parsed(sql)  # SQL_SYNTAX here, before anything is sent (parsed once per text)
    if isinstance(stmt, CreateIndexStmt | BuildIndexStmt | DropIndexStmt):
        out = execute_ddl(sql)
        rows = out if isinstance(out, list) else [out]
        started = SqlStarted(stream_id=0, statement="ddl", mutation_count=0)
        return QueryRows(scans.rpc, started, None, [_plain(r) for r in rows], t0)
    msg = SqlQuery(
        stream_id=0,
        statement=sql,
        params=wire_params,
        consistency=consistency,
        at=None if at is None else to_wire_ts(at),
        timeout=float(timeout),
        credit=CREDIT,
        memory_quota=memory_quota,
        spill=spill,
        window=window,
        tuning=None if tuning is None else dict(tuning),
        durability=durability,
        durability_timeout=durability_timeout,
    )
    rpc = scans.rpc
    order, route, hint = _order(scans, msg)
    timeout = _reply_timeout(rpc, msg)
    direct = scans.direct_sql
    opened = None if direct is None else direct.start(msg, order, timeout)
    if opened is None:  # the loop path (no direct path here, or its socket is busy)
        started, stream, _ = rpc.run(_start(scans, msg, order, hint, route))
        return QueryRows(rpc, started, stream, None, t0, timeout)
    started, direct_stream, address = opened
    learned = _learn(scans, msg, started, address, hint, route)
    if learned is not None and learned.keyspace is not None:
        # In the background: until it is cached, statements go where they went before.
        rpc.run_soon(_cache_topology(rpc, learned.keyspace))
    return QueryRows(rpc, started, direct_stream, None, t0, timeout)


def _plain(value: Any) -> Any:
    """A DDL answer as a plain row."""
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    return value

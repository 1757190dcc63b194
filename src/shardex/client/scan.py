"""Index scans from the client: ``client.scan(...)`` and query contexts.

The client sends ``IndexScan`` to the node it is connected to (any node coordinates scans,
``shardex.scan.coordinator``) over a connection pool of its own, whose connections route the
returning ``ScanBlock``/``ScanEnd`` messages to per-scan inboxes; the first reply says the scan
runs, then rows stream in blocks with credit flow control, so however slowly the caller
iterates, at most ``credit`` blocks wait in the client. If the coordinator cannot be reached
(or dies before answering), the scan is sent to the next node: nothing has been returned yet.
A coordinator dying mid-stream ends the iterator with CONNECTION_CLOSED, never silently.
That is the loop path; by default a scan runs the same protocol over a blocking socket of the
calling thread instead (``client/direct_scan.py``, which ``open_scan`` tries first), and this
module holds what the two share: the request (``build_request``), where scans go and how they
fail over (``ScanTargets``), the result (``ScanResult``) and the errors' words.

Rows are dicts ``{"docid": ..., "key": [...]}`` (``key`` decoded with the index's DESC flags;
without ``covering`` only the docid). ``ScanResult.ts`` is the stability TS the scan read
(None: the tips).

Query stability (``scan-request-flow.md``): a ``QueryContext`` pins the stability TS its first
scan of a keyspace read and reads every later scan of that keyspace at the very same TS; once
the indexers have released that snapshot, a scan answers SNAPSHOT_TOO_OLD.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from shardex.api.records import MutationResult
from shardex.api.scan import (
    AT_PLUS,
    CONSISTENCIES,
    NOT_BOUNDED,
    STABILITIES,
    STABILITY_NONE,
    STABILITY_QUERY,
    STABILITY_SCAN,
    IndexScan,
    IndexScanStarted,
    ts_of,
)
from shardex.api.scan_streams import Inboxes, InStream
from shardex.api.spans import to_user_spans
from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.client.routes import RouteHints
from shardex.client.rows import EntryRows as _EntryRows
from shardex.client.rows import Row
from shardex.core.timestamp import Timestamp
from shardex.errors import ConnectionClosed, ErrorCode, NodeUnavailable, ShardexError
from shardex.net import ConnectionPool

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession

__all__ = [
    "QueryContext",
    "ScanPaths",
    "ScanResult",
    "ScanSession",
    "ScanTargets",
    "open_scan",
    "to_wire_ts",
]


DEFAULT_SCAN_TIMEOUT: Final = 30.0
CREDIT: Final = 4
REPLY_MARGIN: Final = 15.0  # the coordinator's own round trips beyond the scan's wait
# Failures that say "this node, now": the scan goes to the next node (nothing returned yet).
FAILOVER: Final = (NodeUnavailable, ConnectionClosed)


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def to_wire_ts(at: Any) -> dict[int, tuple[int, int]]:
    """``at`` for at_plus: a ``Timestamp``, a write's ``MutationResult``, several of them, or
    a mapping partition -> (seqno, uuid) or -> ``MutationResult``. Several results of one
    partition keep the highest seqno."""
    if isinstance(at, Timestamp):
        return dict(at.to_wire())
    if isinstance(at, MutationResult):
        return {at.partition: (at.seqno, at.uuid)}
    out: dict[int, tuple[int, int]] = {}

    def add(p: int, seqno: int, uuid: int) -> None:
        if p not in out or seqno > out[p][0]:
            out[p] = (seqno, uuid)

    if isinstance(at, Mapping):
        for p, v in at.items():
            if isinstance(v, MutationResult):
                add(v.partition, v.seqno, v.uuid)
            elif (
                isinstance(p, int)
                and isinstance(v, (tuple, list))
                and len(v) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            ):
                add(p, v[0], v[1])
            else:
                raise _bad(
                    f"at: partition {p!r} -> {v!r:.60} is not (seqno, uuid)",
                    value=repr(v)[:200],
                    hint="pass the MutationResult a write returned (it carries the uuid)",
                )
        return dict(sorted(out.items()))
    if isinstance(at, Iterable) and not isinstance(at, (str, bytes)):
        for r in at:
            if not isinstance(r, MutationResult):
                raise _bad(f"at: {r!r:.60} is not a MutationResult", value=repr(r)[:200])
            add(r.partition, r.seqno, r.uuid)
        return dict(sorted(out.items()))
    raise _bad(
        f"at must be a Timestamp, MutationResult(s) or {{partition: (seqno, uuid)}}, got "
        f"{type(at).__name__}",
        value=repr(at)[:200],
    )


def _check_int(name: str, value: Any, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"{name} must be an integer >= 0, got {value!r}", value=repr(value))


def build_request(
    keyspace: str,
    index: str,
    spans: Any,
    consistency: str,
    at: Any,
    limit: int | None,
    offset: int | None,
    ordered: bool,
    stability: str | None,
    timeout: float,
    pinned: Timestamp | None = None,
) -> IndexScan:
    """Check the caller's arguments (BAD_REQUEST naming the value) and build the message."""
    if not isinstance(keyspace, str) or not keyspace:
        raise _bad(f"keyspace must be a name, got {keyspace!r}", value=repr(keyspace))
    if not isinstance(index, str) or not index:
        raise _bad(f"index must be a name, got {index!r}", value=repr(index))
    if consistency not in CONSISTENCIES:
        raise _bad(
            f"consistency must be one of {', '.join(CONSISTENCIES)}, got {consistency!r}",
            value=repr(consistency),
        )
    if stability is None:
        stability = STABILITY_NONE if consistency == NOT_BOUNDED else STABILITY_SCAN
    if stability not in STABILITIES:
        raise _bad(
            f"stability must be one of {', '.join(STABILITIES)}, got {stability!r}",
            value=repr(stability),
        )
    if (at is None) != (consistency != AT_PLUS):
        raise _bad(
            "at_plus needs at=..., and at is only for at_plus",
            consistency=consistency,
            hint="consistency='at_plus', at=<the writes' MutationResults>",
        )
    # ``type(...) is`` first (the usual arguments), the full checks otherwise: a client
    # spends these on every scan.
    if limit is not None and (type(limit) is not int or limit < 0):
        _check_int("limit", limit, allow_none=True)
    if offset is not None and (type(offset) is not int or offset < 0):
        _check_int("offset", offset, allow_none=True)
    if ordered is not True and ordered is not False:
        raise _bad(f"ordered must be True or False, got {ordered!r}", value=repr(ordered))
    if type(timeout) is not float or not timeout > 0:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise _bad(f"timeout must be a positive number of seconds, got {timeout!r}")
        timeout = float(timeout)
    # Positional: msgspec matches keyword arguments to fields one by one (~5k instructions
    # for these 13). The order is ``IndexScan``'s own; ``test_scan_request.py`` checks it
    # against the keyword form.
    return IndexScan(
        0,  # scan_id: the inbox's, set per attempt
        keyspace,
        index,
        to_user_spans(spans),
        consistency,
        stability,
        None if at is None else to_wire_ts(at),
        None if pinned is None else dict(pinned.to_wire()),
        limit,
        offset or 0,
        ordered,
        CREDIT,
        timeout,
    )


def reply_timeout(rpc: RpcSession, msg: IndexScan) -> float:
    """How long a scan's opening reply, and then each of its blocks, may take."""
    return msg.timeout + REPLY_MARGIN + rpc.request_timeout


def scan_timed_out(index_id: str, waited: float | None) -> ShardexError:
    """SCAN_TIMEOUT for a scan whose next block did not come within ``waited`` seconds."""
    return ShardexError(
        f"scan of index {index_id} received no rows for {waited}s",
        code=ErrorCode.SCAN_TIMEOUT,
        details={
            "index": index_id,
            "waited": waited,
            "hint": "a node of the scan may be down or overloaded; retry the scan",
        },
    )


class ScanTargets:
    """Which node a client sends a scan to, and in what order it fails over: the node its
    index prefers (the one holding most of its slices, learnt from the previous scan's
    ``IndexScanStarted.prefer``), else the client's node, then the next ones. One per client,
    shared by both scan paths (the loop's ``ScanSession`` and the calling thread's
    ``DirectScans``), so they fail over alike and learn from each other's replies.

    A path tries ``order`` in turn; an address that fails with one of ``FAILOVER`` (nothing
    has been returned to the caller yet) is ``failed`` and the next one tried; the reply of
    the one that answers is ``answered``."""

    def __init__(self) -> None:
        # (keyspace, index) -> the address its last scan's coordinator preferred.
        self.prefer: dict[tuple[str, str], str] = {}

    def order(self, rpc: RpcSession, key: tuple[str, str]) -> tuple[list[str], str | None]:
        """(the addresses to try in turn, the preferred one if any)."""
        addresses = rpc.addresses
        first = rpc.current
        # The addresses from the client's node on, wrapping (C-level slices, no generator).
        order = addresses[first:] + addresses[:first] if first else addresses
        hint = self.prefer.get(key)
        if hint is not None and order[0] != hint:
            rest = list(order)
            if hint in rest:
                rest.remove(hint)
            order = [hint, *rest]
        return order, hint

    def failed(self, key: tuple[str, str], address: str, hint: str | None) -> None:
        if address == hint:
            self.prefer.pop(key, None)

    def answered(
        self, key: tuple[str, str], address: str, hint: str | None, started: IndexScanStarted
    ) -> None:
        if started.prefer:
            self.prefer[key] = started.prefer
        elif address != hint:
            self.prefer.pop(key, None)


class ScanSession:
    """The async side, one per client: a pool whose connections carry scan blocks."""

    def __init__(self, rpc: RpcSession, targets: ScanTargets) -> None:
        self.rpc = rpc
        self.targets = targets
        self.inboxes = Inboxes()
        self.pool = ConnectionPool(
            rpc.transport,
            rpc.secret,
            name=f"{rpc.name}/scan",
            connect_timeout=rpc.connect_timeout,
            handlers=self.inboxes.handlers(),
        )

    async def start(self, msg: IndexScan) -> tuple[IndexScanStarted, InStream]:
        """Send the scan to the node ``ScanTargets`` names first, failing over to the next
        ones."""
        targets = self.targets
        key = (msg.keyspace, msg.index)
        order, hint = targets.order(self.rpc, key)
        timeout = reply_timeout(self.rpc, msg)
        last: ShardexError | None = None
        for address in order:
            stream = self.inboxes.open()
            try:
                conn = await self.pool.get(address)
                stream.attach(conn)
                req = msgspec.structs.replace(msg, scan_id=stream.scan_id)
                started = await conn.request(req, timeout, expect=IndexScanStarted)
                stream.put_head(started.entries, started.done)
            except FAILOVER as exc:
                await stream.cancel()
                targets.failed(key, address, hint)
                last = exc
                continue
            except BaseException:
                await stream.cancel()
                raise
            targets.answered(key, address, hint, started)
            return started, stream
        assert last is not None
        raise last

    async def close(self) -> None:
        await self.pool.close()


class DirectPath(Protocol):
    """The calling thread's scan path (``client/direct_scan.py``'s ``DirectScans``)."""

    def open(self, msg: IndexScan, covering: bool) -> ScanResult | None:
        """The scan started on this thread's socket; None: it must take the loop path."""
        ...


class DirectSqlPath(Protocol):
    """The calling thread's SQL path (``client/direct_sql.py``'s ``DirectSql``)."""

    def start(
        self, msg: SqlQuery, order: list[str], timeout: float
    ) -> tuple[SqlStarted, Any, str] | None:
        """The statement's reply, its row stream and the address that answered; None: it
        must take the loop path."""
        ...

    def preconnect(self, address: str) -> None:
        """Open the calling thread's socket to ``address``."""
        ...


class ScanPaths:
    """A client's two scan paths over its ``RpcSession``: the calling thread's sockets
    (``direct``, None where scans stay on the loop) and the loop's ``ScanSession`` (made by
    the first scan that takes it), sharing one ``ScanTargets``."""

    def __init__(
        self,
        rpc: RpcSession,
        targets: ScanTargets,
        direct: DirectPath | None,
        direct_sql: DirectSqlPath | None = None,
    ) -> None:
        self.rpc = rpc
        self.targets = targets
        self.direct = direct
        self.direct_sql = direct_sql  # SQL statements on the calling thread's sockets
        self.session: ScanSession | None = None
        self.routes = RouteHints()  # SQL statement -> the node to send it to

    def loop_session(self) -> ScanSession:
        session = self.session
        if session is None:
            session = self.session = ScanSession(self.rpc, self.targets)
        return session

    def preconnect(self) -> None:
        """At connect time, open the connections the client's first statements will use -
        the calling thread's sockets to the nodes it was given when statements take the
        calling thread (``direct_sql``; its node first, then the others a routed statement
        may go to), else the loop path's to its node - and start opening the loop path's to
        the others (a stream nested in another): a new client's first queries would
        otherwise each wait for a TCP and login handshake. Best effort: a failure here is
        the first query's to report."""
        session = self.loop_session()
        rpc = self.rpc
        address = rpc.addresses[rpc.current]
        direct = self.direct_sql

        async def open_loop_path() -> None:
            for other in rpc.addresses:
                if other != address or direct is not None:
                    session.pool.connect_soon(other)
            if direct is None:
                with contextlib.suppress(ShardexError):
                    await session.pool.get(address)

        rpc.run(open_loop_path())
        if direct is not None:
            # A key-routed statement's later runs go straight to the key's owner once the
            # client holds the cluster's partition map: fetch it now, in the background,
            # rather than after the first reply names the route (measured: a new client's
            # first three point queries went to its node and on to the owner meanwhile).
            rpc.run_soon(_prefetch_state(rpc))
        if direct is not None:  # the client's node first; a routed statement may go to any
            for other in [address, *(a for a in rpc.addresses if a != address)]:
                with contextlib.suppress(ShardexError):
                    direct.preconnect(other)

    async def close(self) -> None:
        """On the loop: close the loop path's pool."""
        if self.session is not None:
            await self.session.close()


async def _prefetch_state(rpc: RpcSession) -> None:
    # Best effort: on failure, the first routed statement's reply fetches it again.
    with contextlib.suppress(ShardexError):
        await rpc.router.state()


class BlockSource(Protocol):
    """What ``ScanResult`` reads its head through: an ``InStream`` (the loop path) or a
    ``DirectStream`` (the calling thread's socket, ``shardex.client.direct_scan``)."""

    done: bool

    @property
    def complete(self) -> bool: ...

    def poll(self) -> tuple[bool, list[bytes] | None]: ...


class ScanResult:
    """The rows of one scan, as an iterator (read it once). Use it as a context manager (or
    call ``close``) to stop a scan that is not read to its end."""

    def __init__(
        self,
        run: Any,
        stream: InStream | BlockSource,
        started: IndexScanStarted,
        covering: bool,
        block_timeout: float | None = None,
    ) -> None:
        self._run = run
        self._stream = stream
        # The longest wait for the next block: past it the scan ends with SCAN_TIMEOUT
        # instead of waiting forever on a coordinator that went quiet.
        self._block_timeout = block_timeout
        self.started = started
        self.covering = covering
        self._ts: Timestamp | None = None
        self.partitions = list(started.partitions)
        self._desc = list(started.desc)
        self._iterating = False

    @property
    def index_id(self) -> str:
        return self.started.index_id

    @property
    def ts(self) -> Timestamp | None:
        """The stability TS the scan read (None: the tips); built when first asked for (a
        request_plus scan's is one entry per data partition, and most callers never look)."""
        if self._ts is None:
            wire = ts_of(self.started.ts)
            if wire is not None:
                self._ts = Timestamp.from_wire(wire)
        return self._ts

    def blocks(self) -> Iterator[list[bytes]]:
        """Raw index entries (``key + 02 + docid``), block by block."""
        try:
            while True:
                # The reply's own entries (all of a small scan) need no trip to the loop.
                answered, block = self._stream.poll()
                if not answered:
                    block = self._next()
                if block is None:
                    return
                yield block
        finally:
            self.close()

    def _next(self) -> list[bytes] | None:
        """The next block from the network (None: the end). One block per trip, never
        more: taking a block returns its credit, so taking every block already received
        would let the sender run ahead of the reader (``credit`` blocks beyond what it has
        read). ``DirectScanResult`` reads it from the calling thread's socket instead."""
        return self._run(self._next_block())  # type: ignore[no-any-return]

    async def _next_block(self) -> list[bytes] | None:
        try:
            # ``asyncio.timeout``, not ``wait_for``: the latter runs the wait in a Task of
            # its own (Python 3.11), a Task per block.
            async with asyncio.timeout(self._block_timeout):
                return await self._stream.next_block()  # type: ignore[union-attr]
        except TimeoutError:
            raise scan_timed_out(self.index_id, self._block_timeout) from None

    def __iter__(self) -> Iterator[Row]:
        if self._iterating:
            raise _bad("a scan's rows can be read once", index=self.index_id)
        self._iterating = True
        rows = _EntryRows(self._desc, self.covering)
        # A C-level chain of the blocks' row lists: no generator frame resumed per row (the
        # caller's ``list(scan)`` or ``for`` takes each row in C), one per block.
        return chain.from_iterable(map(rows.of, self.blocks()))

    def close(self) -> None:
        stream = self._stream
        if not stream.done and not stream.complete:
            self._run(stream.cancel())  # type: ignore[union-attr]

    def __enter__(self) -> ScanResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_scan(
    scans: ScanPaths,
    keyspace: str,
    index: str,
    spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
    consistency: str = NOT_BOUNDED,
    at: Any = None,
    limit: int | None = None,
    offset: int | None = None,
    ordered: bool = True,
    covering: bool = True,
    *,
    stability: str | None = None,
    timeout: float = DEFAULT_SCAN_TIMEOUT,
    pinned: Timestamp | None = None,
) -> ScanResult:
    msg = build_request(
        keyspace, index, spans, consistency, at, limit, offset, ordered, stability, timeout, pinned
    )
    if not isinstance(covering, bool):
        raise _bad(f"covering must be True or False, got {covering!r}", value=repr(covering))
    direct = scans.direct
    if direct is not None:
        result = direct.open(msg, covering)
        if result is not None:
            return result
        # None: a scan nested in one this thread still reads on that socket: the loop path.
    session = scans.session or scans.loop_session()
    rpc = scans.rpc
    run = rpc.run  # the hand-off to the client's loop thread, for this scan's trips
    started, stream = run(session.start(msg))
    return ScanResult(run, stream, started, covering, reply_timeout(rpc, msg))


class QueryContext:
    """Scans at one stability TS per keyspace (query stability): the first scan of a
    keyspace picks it (as a scan-stable scan with its consistency), later ones reuse it."""

    def __init__(self, scans: ScanPaths) -> None:
        self.scans = scans
        self.pinned: dict[str, Timestamp] = {}

    def scan(
        self,
        keyspace: str,
        index: str,
        spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        consistency: str = NOT_BOUNDED,
        at: Any = None,
        limit: int | None = None,
        offset: int | None = None,
        ordered: bool = True,
        covering: bool = True,
        *,
        timeout: float = DEFAULT_SCAN_TIMEOUT,
    ) -> ScanResult:
        result = open_scan(
            self.scans,
            keyspace,
            index,
            spans,
            consistency,
            at,
            limit,
            offset,
            ordered,
            covering,
            stability=STABILITY_QUERY,
            timeout=timeout,
            pinned=self.pinned.get(keyspace),
        )
        if result.ts is not None:
            self.pinned.setdefault(keyspace, result.ts)
        return result

    def __enter__(self) -> QueryContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pinned.clear()

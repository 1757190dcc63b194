"""The synchronous Python client.

Users call plain methods; underneath, an asyncio loop runs in a background thread owned by
the client and every call is a coroutine submitted to it (``_LoopThread.run``). The
network code is therefore the same async code the nodes use, and the user never sees a loop.
The exception is ``scan``: on TCP it runs over a blocking socket of the calling thread
(``shardex.client.direct_scan``), since the hand-off to the loop thread and back was most of
a scan's client CPU outside its rows.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import contextlib
import threading
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from shardex.api.data import HighSeqnos, HighSeqnosReply, KeyspaceStats, KeyspaceStatsReply
from shardex.api.keyspaces import (
    CreateKeyspace,
    DropKeyspace,
    KeyspaceCreated,
    KeyspaceDropped,
    KeyspaceList,
    ListKeyspaces,
    check_keyspace_name,
)
from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.node import StatusReply, StatusRequest
from shardex.client.direct_scan import DirectScans
from shardex.client.indexes import IndexOps
from shardex.client.keyspace import Keyspace
from shardex.client.query import QueryRows, run_query
from shardex.client.rebalance import RebalanceOps
from shardex.client.routing import DataRouter
from shardex.client.rpc_session import RpcSession
from shardex.client.scan import (
    DEFAULT_SCAN_TIMEOUT,
    QueryContext,
    ScanResult,
    ScanSession,
    ScanTargets,
    client_closed,
    open_scan,
)
from shardex.client.scan import close_session as close_scan_session
from shardex.client.scan_page import ScanPage, build_page_request, scan_page
from shardex.client.types import (
    ClusterStatus,
    KeyspaceDescription,
    KeyspaceStatsResult,
    NodeStatus,
    cluster_status_from,
    describe,
    node_status_from,
    stats_from,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import (
    AuthFailed,
    ConfigError,
    ConnectionClosed,
    NodeUnavailable,
    RequestTimeout,
    ShardexError,
)
from shardex.meta.partitioning import DEFAULT_NUM_PARTITIONS, check_num_partitions
from shardex.net import Connection
from shardex.net import connect as rpc_connect
from shardex.net.loops import new_event_loop
from shardex.net.messages import Message
from shardex.net.tcp import TcpTransport
from shardex.net.transport import Transport

T = TypeVar("T")
M = TypeVar("M", bound=Message)

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_REQUEST_TIMEOUT = 10.0

# Failures that say "this node, now" rather than "this request": worth trying another node.
_RETRYABLE = (NodeUnavailable, ConnectionClosed, RequestTimeout)


class _Call:
    """One synchronous caller waiting for one coroutine on the client's loop.

    The cheap form of ``asyncio.run_coroutine_threadsafe`` (which the client used first):
    no ``concurrent.futures.Future`` with its condition variable, no future chaining with
    its extra callbacks on both sides. The caller holds ``_lock``; the coroutine, wrapped so
    that it releases the lock in the very step it finishes (no done-callback round through
    the loop), hands its outcome over in two attributes. The old hand-off measured ~150-200 us
    of CPU per call, a quarter of a point ``get``'s client CPU; this one ~half."""

    __slots__ = ("_coro", "_exc", "_lock", "_loop", "_result", "_task")

    def __init__(self, coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._coro = coro
        self._loop = loop  # not get_running_loop() in start: that is a getpid() syscall
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._result: Any = None
        self._exc: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """On the loop (``call_soon_threadsafe``): run the coroutine in a task."""
        self._task = self._loop.create_task(self._main())

    async def _main(self) -> None:
        try:
            self._result = await self._coro
        except BaseException as exc:  # the caller re-raises it in its own thread
            self._exc = exc
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise  # KeyboardInterrupt/SystemExit on the loop: as a plain task would
        finally:
            self._lock.release()

    def cancel(self) -> None:
        """On the loop: cancel the task (``start`` ran first: the loop's queue is FIFO)."""
        if self._task is not None:
            self._task.cancel()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0))

    def outcome(self) -> Any:
        exc = self._exc
        if exc is None:
            return self._result
        self._exc = None  # no reference cycle through the traceback
        if isinstance(exc, asyncio.CancelledError):
            # What ``run_coroutine_threadsafe``'s future raised for a cancelled call.
            raise concurrent.futures.CancelledError() from None
        raise exc


class _LoopThread:
    """A private event loop on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()  # uvloop where installed (``net/loops.py``)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        call = _Call(coro, self.loop)
        try:
            self.loop.call_soon_threadsafe(call.start)
        except BaseException:
            coro.close()  # the loop is closed: never started, so never awaited
            raise
        try:
            finished = call.wait(timeout)
        except BaseException:
            self._cancel(call)  # e.g. KeyboardInterrupt in the caller: leave no work running
            raise
        if not finished:
            self._cancel(call)
            raise RequestTimeout(
                f"client call did not finish within {timeout}s", details={"timeout": timeout}
            )
        result: T = call.outcome()
        return result

    def _cancel(self, call: _Call) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing runs
            self.loop.call_soon_threadsafe(call.cancel)

    def stop(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            # Reader tasks of aborted connections etc.: end them here, not in a GC warning.
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_rest(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class Client(RebalanceOps, IndexOps):
    """A connection to a shardex cluster through one node, failing over to the others.

    Build it with ``connect`` or ``connect_local``. Thread-safe: calls from several threads
    run concurrently on the client's loop; index scans run in each calling thread, over
    sockets of its own (``client/direct_scan.py``; ``direct_scans=False``: on the loop too).
    Use as a context manager or call ``close()``."""

    def __init__(
        self,
        addresses: Sequence[str],
        secret: str,
        *,
        name: str = "shardex-client",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        transport: Transport | None = None,
        direct_scans: bool = True,
    ) -> None:
        if not addresses:
            raise ConfigError("no node address given", details={"hint": "pass host:port"})
        self.addresses = list(addresses)
        self.name = name
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._secret = secret
        self._transport = transport or TcpTransport()
        self._conn: Connection | None = None
        self._current = 0  # index into addresses of the node we talk to
        self._closed = False
        self._reconnecting: asyncio.Lock | None = None  # created on the client's loop
        self._io = _LoopThread(f"shardex-client-{name}")
        self._scan_session: ScanSession | None = None  # made by the first scan
        self._scan_targets = ScanTargets()  # where scans go, for both scan paths
        # Scans over a blocking socket in the calling thread (``client/direct_scan.py``):
        # the default on TCP; the simulator's deterministic network keeps the loop path.
        direct = direct_scans and type(self._transport) is TcpTransport
        self._direct_scans: DirectScans | None = DirectScans(self) if direct else None
        self._router = DataRouter(
            transport=self._transport,
            secret=secret,
            name=name,
            control=lambda msg, expect: self._request(msg, expect, True),
            request_timeout=request_timeout,
            connect_timeout=connect_timeout,
        )
        # The RPC parts shardex's own components use (the index pipeline's deliveries,
        # stabilise rounds and change streams): ``client/rpc_session.py``.
        self.rpc = RpcSession(
            run=self._run,
            loop=self._io.loop,
            router=self._router,
            is_closed=lambda: self._closed,
            connection=self._live_conn,
            call=self._call,
            ddl=self._ddl,
        )

    # -- lifecycle --

    def _connect(self) -> None:
        try:
            self._io.run(self._connect_any(self._current), timeout=None)
        except BaseException:
            self.close()
            raise

    async def _connect_any(self, start: int) -> None:
        """Connect to the first reachable address, starting at ``start`` and wrapping."""
        errors: dict[str, str] = {}
        n = len(self.addresses)
        for k in range(n):
            i = (start + k) % n
            address = self.addresses[i]
            try:
                conn = await rpc_connect(
                    self._transport,
                    address,
                    self._secret,
                    name=self.name,
                    timeout=self.connect_timeout,
                )
            except (AuthFailed, ConfigError):
                raise  # a wrong or empty secret: another node will not help
            except ShardexError as e:
                errors[address] = str(e)
                continue
            self._conn, self._current = conn, i
            return
        raise NodeUnavailable(
            f"no shardex node reachable (tried {', '.join(self.addresses)})",
            details={"errors": errors},
        )

    def close(self) -> None:
        """Close the connection and stop the client's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._direct_scans is not None:
            self._direct_scans.close()  # every thread's scan sockets; blocked readers wake
        conn, self._conn = self._conn, None
        with contextlib.suppress(Exception):
            self._io.run(self._router.close(), timeout=5)
        with contextlib.suppress(Exception):
            self._io.run(close_scan_session(self), timeout=5)
        if conn is not None:
            with contextlib.suppress(Exception):
                self._io.run(conn.close(), timeout=5)
        self._io.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.connected_address or "not connected"
        return f"<shardex.Client {self.name} -> {where}>"

    @property
    def connected_address(self) -> str | None:
        conn = self._conn
        return None if conn is None or conn.closed else self.addresses[self._current]

    # -- calls --

    async def _live_conn(self, failed: Connection | None = None) -> Connection:
        """The current connection, or a new one if it is gone (or is ``failed``); one
        reconnect at a time, so concurrent callers share it instead of racing."""
        if self._reconnecting is None:
            self._reconnecting = asyncio.Lock()
        async with self._reconnecting:
            conn = self._conn
            if conn is not None and not conn.closed and conn is not failed:
                return conn
            start = self._current
            if conn is not None and conn is failed:
                conn.abort()
                start += 1  # that node just failed us: begin with the next one
            await self._connect_any(start)
            assert self._conn is not None
            return self._conn

    async def _request(self, msg: Message, expect: type[M], idempotent: bool) -> M:
        conn = await self._live_conn()
        try:
            return await conn.request(msg, self.request_timeout, expect=expect)
        except _RETRYABLE:
            if not idempotent:
                raise
        # The node went away (or hung): move to the next one and try once more.
        conn = await self._live_conn(failed=conn)
        return await conn.request(msg, self.request_timeout, expect=expect)

    def _call(self, msg: Message, expect: type[M], *, idempotent: bool = True) -> M:
        return self._run(self._request(msg, expect, idempotent))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise client_closed()
        return self._io.run(coro)

    def ping(self) -> NodeStatus:
        """Authenticated round trip to the connected node; returns who answered and how fast."""

        async def go() -> tuple[StatusReply, float]:
            loop = asyncio.get_running_loop()
            start = loop.time()
            reply = await self._request(StatusRequest(), StatusReply, idempotent=True)
            return reply, loop.time() - start

        if self._closed:
            raise client_closed()
        reply, rtt = self._io.run(go())
        return node_status_from(reply, rtt)

    def cluster_status(self) -> ClusterStatus:
        """The membership view (members, up/down, versions) of the connected node."""
        return cluster_status_from(self._call(MembersRequest(), MembersReply))

    # -- keyspaces and documents --

    def create_keyspace(
        self, name: str, num_partitions: int = DEFAULT_NUM_PARTITIONS
    ) -> KeyspaceDescription:
        """Create a keyspace with ``num_partitions`` partitions placed over the data nodes;
        returns once every owner has opened its partitions. KEYSPACE_EXISTS if it exists."""
        check_keyspace_name(name)
        check_num_partitions(num_partitions)
        msg = CreateKeyspace(name=name, num_partitions=num_partitions, request_id=_request_id())
        # Retried on another node with the same request id: the coordinator deduplicates.
        reply = self._call(msg, KeyspaceCreated, idempotent=True)
        self._run(self._router.refresh())
        return describe(reply.meta, reply.topology)

    def list_keyspaces(self) -> list[KeyspaceDescription]:
        reply = self._call(ListKeyspaces(request_id=_request_id()), KeyspaceList)
        return [describe(m, reply.topologies.get(m.name)) for m in reply.keyspaces]

    def drop_keyspace(self, name: str) -> None:
        """Drop a keyspace and its documents. KEYSPACE_NOT_FOUND if there is none."""
        msg = DropKeyspace(name=name, request_id=_request_id())
        self._call(msg, KeyspaceDropped, idempotent=True)
        self._router.forget(name)

    def keyspace(self, name: str) -> Keyspace:
        """The document API of keyspace ``name`` (no network call until it is used)."""
        return Keyspace(self, check_keyspace_name(name))

    def high_seqnos(self, keyspace: str) -> Timestamp:
        """Every partition's current (high seqno, uuid), gathered by a data node from the
        owners: what session consistency waits for."""
        reply = self._run(self._keyspace_wide(HighSeqnos(keyspace=keyspace), HighSeqnosReply))
        return Timestamp.from_wire(reply.entries)

    def keyspace_stats(self, keyspace: str) -> KeyspaceStatsResult:
        """Per partition: owner node, live document count, high seqno, uuid."""
        msg = KeyspaceStats(keyspace=keyspace)
        return stats_from(
            keyspace, self._run(self._keyspace_wide(msg, KeyspaceStatsReply)).partitions
        )

    # -- index scans (``shardex.client.scan``) --

    def scan(
        self,
        keyspace: str,
        index: str,
        spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        consistency: str = "not_bounded",
        at: Any = None,
        limit: int | None = None,
        offset: int | None = None,
        ordered: bool = True,
        covering: bool = True,
        *,
        stability: str | None = None,
        timeout: float = DEFAULT_SCAN_TIMEOUT,
    ) -> ScanResult:
        """Scan an index: an iterator of ``{"docid", "key"}`` rows (``key`` only with
        ``covering``). ``spans``: ``[{"low": [...], "high": [...], "inclusion": "both" |
        "low" | "high" | "neither"}]`` in index order (None: everything). ``consistency``:
        not_bounded, request_plus (every write acknowledged before the call), at_plus (``at``:
        the writes' MutationResults or a Timestamp). ``stability``: none, scan (default for
        request_plus / at_plus); ``query_context()`` for query stability. ``timeout``: how
        long the index may take to catch up (SCAN_TIMEOUT after)."""
        return open_scan(
            self,
            keyspace,
            index,
            spans,
            consistency,
            at,
            limit,
            offset,
            ordered,
            covering,
            stability=stability,
            timeout=timeout,
        )

    def scan_page(
        self,
        keyspace: str,
        index: str,
        spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        consistency: str = "not_bounded",
        page_size: int = 100,
        continuation: str | None = None,
        *,
        at: Any = None,
        stability: str | None = None,
        ordered: bool = False,
        timeout: float = DEFAULT_SCAN_TIMEOUT,
    ) -> ScanPage:
        """One page (at most ``page_size`` rows) of a paginated scan that loses and doubles
        nothing while partitions migrate; pass the returned ``continuation`` for the next
        page (None: done). ``index="#primary"`` scans the documents (spans bound the docid).
        ``ordered``: rows in key order across shards. request_plus / at_plus pin one
        stability TS for every page (``shardex.client.scan_page``)."""
        msg = build_page_request(
            keyspace,
            index,
            spans,
            consistency,
            page_size,
            continuation,
            at=at,
            stability=stability,
            ordered=ordered,
            timeout=timeout,
        )
        return scan_page(self, msg)

    def query(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        consistency: str = "request_plus",
        *,
        at: Any = None,
        timeout: float = 120.0,
        max_rows_in_memory: int | None = None,
        window: int | None = None,
        tuning: Mapping[str, bool] | None = None,
    ) -> QueryRows:
        """Run one SQL++ statement (``shardex.client.query``): an iterator of rows (dicts)
        with ``metrics`` once exhausted. ``params``: a list for $1, $2 or a mapping for
        $name. ``consistency``: request_plus (default), not_bounded, at_plus (with ``at``)."""
        return run_query(
            self,
            sql,
            params,
            consistency,
            at=at,
            timeout=timeout,
            max_rows_in_memory=max_rows_in_memory,
            window=window,
            tuning=tuning,
        )

    def query_context(self) -> QueryContext:
        """Scans through the context share one stability TS per keyspace (query stability)."""
        return QueryContext(self)

    async def _keyspace_wide(self, msg: HighSeqnos | KeyspaceStats, expect: type[M]) -> M:
        """Ask a data node (an owner of the keyspace, the first that answers) for a
        keyspace-wide answer it gathers from the others; the control node may not run the
        data service."""
        _, topology = await self._router.keyspace(msg.keyspace)  # KEYSPACE_NOT_FOUND
        last: ShardexError | None = None
        for node in topology.nodes():
            try:
                return await self._router.to_node(node, msg, expect)
            except _RETRYABLE as exc:
                last = exc
        assert last is not None
        raise last


def _request_id() -> str:
    return uuid.uuid4().hex


def connect(
    address: str | Sequence[str],
    *,
    secret: str,
    name: str = "shardex-client",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    direct_scans: bool = True,
) -> Client:
    """Connect to a node (or the first reachable of several addresses). ``direct_scans``:
    scans run over a socket of the calling thread (False: through the client's loop
    thread, as every other call; for comparisons)."""
    addresses = [address] if isinstance(address, str) else list(address)
    client = Client(
        addresses,
        secret,
        name=name,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
        direct_scans=direct_scans,
    )
    client._connect()
    return client


def connect_local(
    cluster_dir: str | Path,
    *,
    name: str = "shardex-client",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    direct_scans: bool = True,
) -> Client:
    """Connect to the local cluster in ``cluster_dir`` (made by ``shardex cluster start``):
    reads cluster.json and the secret, connects to the first live node, then the next."""
    from shardex.meta import cluster_dir as cdir

    path = Path(cluster_dir)
    spec = cdir.load(path)
    return connect(
        [n.address for n in spec.nodes],
        secret=cdir.read_secret(path, spec),
        name=name,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
        direct_scans=direct_scans,
    )

"""The synchronous client's hand-off to its event-loop thread (``shardex.client.loop_thread``) and
the scan iterator's block hand-over (``shardex.client.scan``): outcomes, errors, timeouts
and cancellation cross the thread boundary as before; an error after some blocks comes
after their rows; a scan left half-read releases its stream on the node. Also the cheaper
span-bound text (``shardex.api.spans``) and ``Timestamp.from_wire``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardex.api.scan import IndexScanStarted
from shardex.api.spans import _bound_text
from shardex.client.loop_thread import LoopThread
from shardex.client.scan import ScanResult
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, RequestTimeout, ShardexError
from tests.integration.scan_env import KS, Env, _until


@pytest.fixture
def io() -> Iterator[LoopThread]:
    lt = LoopThread("test-client")
    yield lt
    lt.stop()


# -- LoopThread.run ---------------------------------------------------------------------------


def test_a_call_returns_its_result_and_raises_its_error_in_the_caller(io: LoopThread) -> None:
    async def ok() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert io.run(ok()) == "test-client"  # ran on the loop's thread

    async def bad() -> None:
        raise ShardexError("nope", code=ErrorCode.DOC_NOT_FOUND)

    with pytest.raises(ShardexError) as err:
        io.run(bad())
    assert err.value.code is ErrorCode.DOC_NOT_FOUND
    with pytest.raises(ZeroDivisionError):
        io.run(_div(0))


async def _div(x: int) -> float:
    return 1 / x


def test_run_soon_returns_before_its_coroutine_ends_and_stop_cancels_it() -> None:
    io = LoopThread("test-soon")
    release = threading.Event()
    done, started, cancelled = threading.Event(), threading.Event(), threading.Event()

    async def later() -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        done.set()

    async def forever() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        io.run_soon(later())  # returns while ``later`` waits for the release
        assert not done.is_set()
        release.set()
        assert done.wait(10), "the coroutine never ran to its end"
        io.run_soon(forever())
        assert started.wait(10)
    finally:
        io.stop()
    assert cancelled.is_set(), "stop left a run_soon coroutine running"


def test_a_call_past_its_timeout_raises_request_timeout_and_is_cancelled(io: LoopThread) -> None:
    cancelled = threading.Event()
    release = asyncio.Event()

    async def hang() -> None:
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(RequestTimeout) as err:
        io.run(hang(), timeout=0.05)
    assert err.value.details["timeout"] == 0.05
    assert cancelled.wait(10), "the timed-out call kept running on the loop"


def test_a_call_cancelled_on_the_loop_raises_cancelled_error(io: LoopThread) -> None:
    async def cancel_me() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)

    with pytest.raises(concurrent.futures.CancelledError):
        io.run(cancel_me())


def test_calls_from_several_threads_each_get_their_own_outcome(io: LoopThread) -> None:
    async def echo(i: int) -> int:
        await asyncio.sleep(0)
        if i % 7 == 0:
            raise ValueError(i)
        return i * 2

    def worker(base: int) -> list[Any]:
        out: list[Any] = []
        for i in range(base, base + 200):
            try:
                out.append(io.run(echo(i)))
            except ValueError as exc:
                out.append(("err", exc.args[0]))
        return out

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(worker, [0, 1000, 2000, 3000]))
    for base, got in zip([0, 1000, 2000, 3000], results, strict=True):
        want = [("err", i) if i % 7 == 0 else i * 2 for i in range(base, base + 200)]
        assert got == want


def test_a_call_on_a_stopped_loop_raises_and_leaves_no_unawaited_coroutine() -> None:
    lt = LoopThread("stopped")
    lt.stop()
    coro = _div(1)
    with pytest.raises(RuntimeError):
        lt.run(coro)
    assert coro.cr_frame is None  # closed, so no "never awaited" warning


# -- ScanResult's block hand-over ---------------------------------------------------------------


class _ScriptedStream:
    """An ``InStream`` stand-in: the blocks arrived so far, then either the end or an error."""

    def __init__(self, blocks: list[list[bytes]], error: ShardexError | None = None) -> None:
        self._blocks = list(blocks)
        self._error = error
        self.done = False
        self.complete = False
        self.cancelled = False

    def poll(self) -> tuple[bool, None]:
        return False, None

    def ready(self) -> bool:
        return True  # everything has arrived

    async def next_block(self) -> list[bytes] | None:
        if self._blocks:
            return self._blocks.pop(0)
        self.done = True
        if self._error is not None:
            raise self._error
        return None

    async def cancel(self) -> None:
        self.cancelled = True
        self.done = True


def _entry(docid: str) -> bytes:
    # key: the ASC string "k", then the docid marker and the docid (``keycodec`` layout)
    return b"\x50k\x00\x01\x02" + docid.encode() + b"\x00\x01"


def _result(stream: _ScriptedStream) -> tuple[ScanResult, list[int]]:
    loop = asyncio.new_event_loop()
    trips: list[int] = []

    def run(coro: Coroutine[Any, Any, Any]) -> Any:
        trips.append(1)
        return loop.run_until_complete(coro)

    started = IndexScanStarted(scan_id=1, index_id="ix", desc=[False])
    return ScanResult(run, stream, started, True, 5.0), trips  # type: ignore[arg-type]


def test_each_block_past_the_reply_takes_one_trip_to_the_loop() -> None:
    """One block per trip: the caller takes (and credits) a block only when it reads it, so
    the sender stays within its credit of the reader (``test_back_pressure...``)."""
    blocks = [[_entry(f"d{b}{i}") for i in range(3)] for b in range(4)]
    result, trips = _result(_ScriptedStream(blocks))
    rows = list(result)
    assert [r["docid"] for r in rows] == [f"d{b}{i}" for b in range(4) for i in range(3)]
    assert rows[0]["key"] == ["k"]
    assert len(trips) == 4 + 1  # four blocks, then the end


def test_an_error_after_some_blocks_comes_after_their_rows_in_the_callers_thread() -> None:
    error = ShardexError("node went away", code=ErrorCode.CONNECTION_CLOSED)
    blocks = [[_entry("a")], [_entry("b")]]
    result, _ = _result(_ScriptedStream(blocks, error))
    seen: list[str] = []
    with pytest.raises(ShardexError) as err:
        for row in result:
            seen.append(row["docid"])
    assert seen == ["a", "b"]
    assert err.value.code is ErrorCode.CONNECTION_CLOSED


def test_an_error_before_any_block_is_raised_at_once() -> None:
    error = ShardexError("too old", code=ErrorCode.SNAPSHOT_TOO_OLD)
    result, _ = _result(_ScriptedStream([], error))
    with pytest.raises(ShardexError) as err:
        list(result)
    assert err.value.code is ErrorCode.SNAPSHOT_TOO_OLD


# -- a real scan left half-read -------------------------------------------------------------------


async def test_a_scan_abandoned_half_read_releases_its_stream(env: Env) -> None:
    ts = await env.many_in_paris()
    assert env.client is not None
    client = env.client

    def read_some() -> int:
        with client.scan(KS, "#primary", None, "at_plus", ts) as res:
            n = 0
            for _ in res:
                n += 1
                if n == 3000:  # past the reply's entries: blocks are streaming
                    break
            return n

    assert await asyncio.to_thread(read_some) == 3000
    out = env.nodes["n1"].streams
    await _until(lambda: out.open_streams == 0)
    # The client's inbox for it is gone too (on the loop path: a direct scan has none,
    # ``test_direct_scan.py``), and the client still scans.
    session = client._scans.session
    assert session is None or len(session.inboxes) == 0
    rows = await env.scan("#primary", None, "at_plus", ts, limit=10)
    assert len(rows) == 10


# -- Timestamp.from_wire ------------------------------------------------------------------


def test_from_wire_still_checks_and_coerces_its_input() -> None:
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode({2: (5, 9), 0: (1, 3)}))
    assert Timestamp.from_wire(wire).to_wire() == {0: (1, 3), 2: (5, 9)}
    assert Timestamp.from_wire({1: [4, 2]}) == Timestamp({1: (4, 2)})
    with pytest.raises(ShardexError) as err:
        Timestamp.from_wire({0: (1, 1), 7: (-1, 1)})
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.details["partition"] == 7
    with pytest.raises((ValueError, TypeError)):
        Timestamp.from_wire({0: ("x", 1)})
    with pytest.raises((ValueError, TypeError, IndexError)):
        Timestamp.from_wire({0: (1,)})


# -- span bounds' wire text -------------------------------------------------------------------


_parts = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=2),
)


@given(st.lists(_parts, max_size=4))
def test_a_bounds_wire_text_is_what_json_dumps_writes(bound: list[Any]) -> None:
    """The text binds continuations (``request_identity``): the fast path must not change
    it, whatever the parts (non-ASCII or control characters, floats, big ints, lists)."""
    want = json.dumps(bound, allow_nan=False, separators=(",", ":"))
    assert _bound_text(0, "low", bound) == want
    assert _bound_text(0, "high", tuple(bound)) == want


def test_a_bound_that_is_not_json_is_still_a_bad_request() -> None:
    for bad in ([float("nan")], ["a", {1, 2}]):
        with pytest.raises(ShardexError) as err:
            _bound_text(0, "low", bad)
        assert err.value.code is ErrorCode.BAD_REQUEST

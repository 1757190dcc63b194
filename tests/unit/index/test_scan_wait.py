"""Waiting for stability: the watch's wake-ups, the lag report, the phase-one TS choice."""

from __future__ import annotations

import asyncio

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode
from shardex.index.scan_wait import StabilityWatch, behind_details, scan_timeout
from shardex.scan.coordinator import oldest_common


def test_a_waiter_wakes_on_notify_and_a_notify_before_the_wait_is_not_lost() -> None:
    async def go() -> tuple[int, int | None, int]:
        watch = StabilityWatch()
        value: list[int | None] = [None]
        checks = [0]

        async def check() -> int | None:
            checks[0] += 1
            if checks[0] == 1:
                # Published between this check and the wait: the event taken before the
                # check is already set, so the waiter re-checks at once.
                value[0] = 42
                watch.notify("ix")
            return None if checks[0] == 1 else value[0]

        got = await watch.wait("ix", check, timeout=30)
        other: list[int | None] = [None]

        async def later() -> int | None:
            return other[0]

        waiter = asyncio.ensure_future(watch.wait("iy", later, timeout=30))
        await asyncio.sleep(0)
        other[0] = 7
        watch.notify("ix")  # another index: no wake-up for iy
        await asyncio.sleep(0)
        assert not waiter.done()
        watch.notify("iy")
        return got, await waiter, checks[0]

    got, other, checks = asyncio.run(go())
    assert (got, other, checks) == (42, 7, 2)


def test_a_wait_ends_with_none_at_its_timeout() -> None:
    async def never() -> None:
        return None

    assert asyncio.run(StabilityWatch().wait("ix", never, timeout=0.05)) is None


def test_the_lag_is_named_per_partition_wanted_vs_held() -> None:
    have = Timestamp({0: (10, 1), 1: (5, 1), 2: (9, 2)})
    wanted = Timestamp({0: (10, 1), 1: (8, 1), 2: (3, 1), 3: (4, 1), 4: (0, 1)})
    # p2 is on another branch: nothing held counts; p4 wants nothing
    assert behind_details(have, wanted) == {"1": [8, 5], "2": [3, 0], "3": [4, 0]}
    err = scan_timeout("ix", "n1", have, wanted, 2.0)
    assert err.code is ErrorCode.SCAN_TIMEOUT
    assert err.details["mutations_behind"] == 3 + 3 + 4
    assert "p1 wants 8 has 5" in err.message


def test_phase_one_pins_the_ts_every_node_covers() -> None:
    a = Timestamp({0: (5, 1), 1: (7, 1)})
    b = Timestamp({0: (6, 1), 1: (7, 1)})
    c = Timestamp({0: (9, 1), 1: (8, 1)})
    assert oldest_common([c, b, a]) == a
    assert oldest_common([b]) == b
    other_branch = Timestamp({0: (2, 9), 1: (1, 9)})
    assert oldest_common([a, other_branch]) == other_branch  # fewest seqnos; errors tell


def test_a_check_that_never_answers_cannot_outlive_the_wait() -> None:
    """A check stuck behind a slice lock (a stabilise's fsync, a slice drop) used to keep the
    scan waiting past its own timeout: the check is bounded by the deadline (with a floor)."""
    import shardex.index.scan_wait as scan_wait

    async def main() -> object:
        never = asyncio.Event()

        async def stuck() -> object:
            await never.wait()
            return "late"

        return await StabilityWatch().wait("ix", stuck, 0.05)

    old = scan_wait.CHECK_FLOOR
    scan_wait.CHECK_FLOOR = 0.05  # keep the test short; the rule is the same
    try:
        assert asyncio.run(asyncio.wait_for(main(), 30)) is None
    finally:
        scan_wait.CHECK_FLOOR = old


def test_a_scan_whose_coordinator_goes_quiet_ends_with_scan_timeout() -> None:
    """The client waits for the next block at most ``block_timeout``: a stream that never
    sends its next block ends the iterator with SCAN_TIMEOUT, not a hang."""
    import pytest

    from shardex.api.scan import IndexScanStarted
    from shardex.client.scan import ScanResult
    from shardex.errors import ShardexError

    class QuietStream:
        done = False
        complete = False

        def poll(self) -> tuple[bool, None]:
            return False, None

        async def next_block(self) -> None:
            await asyncio.Event().wait()

        async def cancel(self) -> None:
            self.done = True

    loop = asyncio.new_event_loop()
    try:
        started = IndexScanStarted(scan_id=1, index_id="ix", desc=[False])
        result = ScanResult(
            lambda coro: loop.run_until_complete(coro), QuietStream(), started, True, 0.05
        )
        with pytest.raises(ShardexError) as err:
            list(result)
        assert err.value.code == ErrorCode.SCAN_TIMEOUT
        assert err.value.details["index"] == "ix"
    finally:
        loop.close()

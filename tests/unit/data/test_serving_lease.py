"""``data/lease.py``: a lapsed lease serves again only after a reconcile whose state was
fetched after the lease came back."""

from __future__ import annotations

import asyncio

import pytest

import shardex.data.lease as lease_mod
from shardex.data.lease import ServingLease


async def test_a_lapse_needs_a_reconcile_fetched_after_the_lease_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lease_mod, "HELD_FOR", 0.0)  # every check looks
    held = [True]
    asked: list[bool] = []
    lease = ServingLease(lambda: held[0], lambda: asked.append(True))
    assert lease.check()
    held[0] = False
    assert not lease.check() and lease.lapsed
    held[0] = True
    loop = asyncio.get_running_loop()
    before = loop.time() - 1.0  # a reconcile whose state predates the return
    assert not lease.check()  # heard again, but the node may have been failed over since
    assert asked == [True]
    lease.reconciled(before)
    assert not lease.check()
    lease.reconciled(loop.time())
    assert lease.check() and not lease.lapsed
    assert asked == [True]  # one reconcile asked for per return


async def test_no_lease_source_always_serves() -> None:
    lease = ServingLease(None, lambda: None)
    assert lease.check()
    await lease.watch()  # returns at once: nothing to watch


async def test_one_look_answers_for_a_moment_then_a_lapse_is_seen() -> None:
    looks: list[bool] = []
    held = [True]

    def look() -> bool:
        looks.append(held[0])
        return held[0]

    lease = ServingLease(look, lambda: None)
    assert lease.check() and lease.check()
    assert looks == [True]  # the second check reused the first look
    held[0] = False
    await asyncio.sleep(lease_mod.HELD_FOR * 2)  # past the look's validity (loop time)
    assert not lease.check() and lease.lapsed
    assert looks == [True, False]

"""The timekeeper answers ``AdvanceStability`` once the TS is held, and tells the indexers
after the reply: one queue per indexer node, each publish sent after the previous one's
answer, so a late publish never lands after a newer one."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shardex.api.delivery import PublishStability
from shardex.core.timestamp import Timestamp
from shardex.errors import NodeUnavailable
from shardex.manager import timekeeper as timekeeper_module
from tests.integration.manager.test_timekeeper import World, ts, world  # noqa: F401

OTHER_BRANCH = 91  # partition 0's uuid after a rollback


async def _until(condition: object, what: str, timeout: float = 5.0) -> None:
    """Poll ``condition()`` on the loop until it holds, failing after ``timeout`` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_the_reply_does_not_wait_for_the_publishes(world: World) -> None:  # noqa: F811
    release = asyncio.Event()

    async def hold(_: PublishStability) -> None:
        await release.wait()

    world.indexers["n1"].publish_gate = hold
    # The publish to n1 hangs (up to the 5 s publish timeout): the reply must not.
    async with asyncio.timeout(2):
        reply = await world.advance(["a"], ts(5, 7))
    assert reply.published == ["a"]
    assert await world.held() == {"a": ts(5, 7)}
    await _until(lambda: world.indexers["n1"].publish, "the publish to reach n1")
    assert "a" not in world.indexers["n1"].held
    release.set()
    assert await world.published_to() == {n: [{"a": ts(5, 7)}] for n in ("n1", "n2", "n3")}
    assert all(
        ix.held == {"a": Timestamp.from_wire(ts(5, 7))}
        for n, ix in world.indexers.items()
        if n != "n4"
    )


async def test_a_late_publish_never_moves_an_indexer_back(world: World) -> None:  # noqa: F811
    """Batch 1 publishes b at ts(1); after a rollback batch 2 publishes it on a new branch,
    which does not cover ts(1): were batch 2's publish to arrive first, batch 1's would
    replace it. The second waits in n2's queue until the first is answered."""
    release = asyncio.Event()
    n2 = world.indexers["n2"]

    async def hold_first(msg: PublishStability) -> None:
        if Timestamp.from_wire(msg.stability["b"]) == Timestamp.from_wire(ts(1)):
            await release.wait()

    n2.publish_gate = hold_first
    newer = {0: (1, OTHER_BRANCH)}
    assert (await world.advance(["b"], ts(1))).published == ["b"]
    await _until(lambda: len(n2.publish) == 1, "batch 1's publish to reach n2")
    assert (await world.advance(["b"], newer)).published == ["b"]
    assert await world.held() == {"b": newer}
    # Give a wrongly concurrent sender every chance to send batch 2's publish now.
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert len(n2.publish) == 1
    release.set()
    assert await world.published_to() == {"n2": [{"b": ts(1)}, {"b": newer}]}
    assert n2.held == {"b": Timestamp.from_wire(newer)}


async def test_a_failed_publish_does_not_stop_the_next(world: World) -> None:  # noqa: F811
    n2 = world.indexers["n2"]

    async def refuse_first(msg: PublishStability) -> None:
        if len(n2.publish) == 1:
            raise NodeUnavailable("publish refused")

    n2.publish_gate = refuse_first
    assert (await world.advance(["b"], ts(1))).published == ["b"]
    assert (await world.advance(["b"], ts(2))).published == ["b"]
    assert await world.published_to() == {"n2": [{"b": ts(1)}, {"b": ts(2)}]}
    assert n2.held == {"b": Timestamp.from_wire(ts(2))}


async def test_a_full_queue_drops_its_oldest(
    world: World,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(timekeeper_module, "MAX_QUEUED_PUBLISHES", 2)
    caplog.set_level(logging.INFO, logger=timekeeper_module.__name__)
    release = asyncio.Event()
    n2 = world.indexers["n2"]

    async def hold(_: PublishStability) -> None:
        await release.wait()

    n2.publish_gate = hold
    for seqno in range(1, 6):  # 1 in flight, 2..5 queued behind it, two places
        assert (await world.advance(["b"], ts(seqno))).published == ["b"]
    release.set()
    assert await world.published_to() == {"n2": [{"b": ts(1)}, {"b": ts(4)}, {"b": ts(5)}]}
    assert n2.held == {"b": Timestamp.from_wire(ts(5))}
    # Two dropped (for rounds 2 and 3), one log line: a node far behind drops one publish per
    # round, and the log says so once per interval with the count.
    lines = [r.getMessage() for r in caplog.records if "publishes behind" in r.getMessage()]
    assert len(lines) == 1 and "1 dropped since the last report" in lines[0], lines

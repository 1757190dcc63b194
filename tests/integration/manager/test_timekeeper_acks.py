"""The timekeeper's check-and-publish path: the pipeline stabilised the indexers itself
(``DeliverAndStabilise``) and brings their replies in ``AdvanceStability.stabilised``. The
timekeeper sends no round of its own, publishes only indexes every slice of whose topology
acknowledged the TS, and holds the TS monotonically, as for its own rounds."""

from __future__ import annotations

from shardex.api.delivery import SliceAck, Stabilised
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from tests.integration.manager.test_timekeeper import World, ts, world  # noqa: F401


def _reply(node: str, acks: list[tuple[str, int, dict]], state: str = "active") -> Stabilised:
    return Stabilised(
        node=node,
        incarnation=f"inc-{node}",
        acks=[
            SliceAck(index_id=i, partition=p, applied=a, items_count=5, state=state)
            for i, p, a in acks
        ],
    )


async def _advance(w: World, at: dict, replies: dict[str, Stabilised]) -> StabilityAdvanced:
    msg = AdvanceStability(keyspace="ks", ts=at, index_ids=["a", "c"], stabilised=replies)
    assert w.server.address is not None
    return await w.client.request(w.server.address, msg, 10, expect=StabilityAdvanced)


async def test_brought_acks_are_checked_and_published_without_a_round(world: World) -> None:  # noqa: F811
    at = ts(4, 6)
    replies = {
        "n1": _reply("n1", [("a", 0, at), ("c", 0, at)]),
        "n2": _reply("n2", [("a", 1, at)]),
        "n3": _reply("n3", [("a", 2, at), ("c", 1, at)]),
    }
    reply = await _advance(world, at, replies)
    assert reply.published == ["a", "c"] and reply.items_count == {"a": 15, "c": 10}
    assert world.sent() == {}  # no StabiliseSlices: the pipeline did steps 13-15
    assert await world.held() == {"a": at, "c": at}
    assert await world.published_to() == {
        "n1": [{"a": at, "c": at}],
        "n2": [{"a": at}],
        "n3": [{"a": at, "c": at}],
    }
    # An older TS brought later never moves the held one back.
    old = ts(3, 6)
    older = {
        n: _reply(n, [(a.index_id, a.partition, old) for a in r.acks]) for n, r in replies.items()
    }
    await _advance(world, old, older)
    assert await world.held() == {"a": at, "c": at}


async def test_a_missing_or_short_ack_keeps_its_index_unpublished(world: World) -> None:  # noqa: F811
    at = ts(4, 6)
    behind = ts(4, 5)
    replies = {
        "n1": _reply("n1", [("a", 0, at), ("c", 0, at)]),
        "n3": _reply("n3", [("a", 2, at), ("c", 1, behind)]),  # c/1 has not applied the TS
    }  # n2 (a/1) did not answer
    reply = await _advance(world, at, replies)
    assert reply.published == [] and sorted(reply.skipped) == ["a", "c"]
    assert world.sent() == {} and await world.held() == {}
    replies["n2"] = _reply("n2", [("a", 1, at)])
    reply = await _advance(world, at, replies)
    assert reply.published == ["a"] and await world.held() == {"a": at}

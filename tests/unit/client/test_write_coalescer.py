"""The client's ``WriteCoalescer``: one request in flight per node, later calls merged whole
and in order, every op answered whatever happens to the request."""

from __future__ import annotations

import asyncio

import pytest

from shardex.api.data import OpItem
from shardex.api.records import MutationResult
from shardex.client import coalesce
from shardex.client.coalesce import Result, WriteCoalescer
from shardex.errors import ShardexError


class FakeNode:
    """Records each request's docids; holds a request until released when ``hold`` is set."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[str]]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail: Exception | None = None
        self.seqno = 0
        self.timeouts: list[float | None] = []

    async def send(
        self, node: str, keyspace: str, durability: str, timeout: float | None, ops: list[OpItem]
    ) -> list[Result]:
        self.requests.append((node, [op.docid for op in ops]))
        self.timeouts.append(timeout)
        await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        out: list[Result] = []
        for _ in ops:
            self.seqno += 1
            out.append(MutationResult(0, self.seqno, 1, self.seqno))
        return out


def ops(*docids: str) -> list[OpItem]:
    return [OpItem("upsert", d, b"{}") for d in docids]


async def test_calls_waiting_behind_a_request_go_together_in_order() -> None:
    node = FakeNode()
    co = WriteCoalescer(node.send)
    node.hold.clear()
    first = asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("a")))
    await asyncio.sleep(0)  # the first request is out and held
    rest = [
        asyncio.ensure_future(co.submit("n1", "ks", "persist", ops(*ds)))
        for ds in (("b", "c"), ("d",), ("e", "f"))
    ]
    other = asyncio.ensure_future(co.submit("n2", "ks", "persist", ops("x")))  # own lane
    await asyncio.sleep(0)
    node.hold.set()
    results = await asyncio.gather(first, *rest, other)
    assert [r for r in node.requests if r[0] == "n1"] == [
        ("n1", ["a"]),
        ("n1", ["b", "c", "d", "e", "f"]),  # merged whole, in arrival order
    ]
    assert ("n2", ["x"]) in node.requests
    # Each caller gets its own ops' outcomes, in its order.
    seq = {tuple(r.seqno for r in res) for res in results}  # type: ignore[union-attr]
    assert len(results[1]) == 2 and len(results[2]) == 1 and len(results[3]) == 2
    assert results[1][1].seqno == results[1][0].seqno + 1  # type: ignore[union-attr]
    assert results[2][0].seqno == results[1][1].seqno + 1  # type: ignore[union-attr]
    assert len(seq) == 5
    assert co.calls == 5 and co.requests == 3


async def test_merged_requests_respect_the_op_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coalesce, "MAX_MERGED_OPS", 5)
    node = FakeNode()
    co = WriteCoalescer(node.send)
    node.hold.clear()
    calls = [asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("a")))]
    await asyncio.sleep(0)
    for ds in (("b", "c", "d"), ("e", "f", "g"), ("h", "i"), tuple("jklmnopq")):
        calls.append(asyncio.ensure_future(co.submit("n1", "ks", "persist", ops(*ds))))
    await asyncio.sleep(0)
    node.hold.set()
    await asyncio.gather(*calls)
    assert [len(d) for _, d in node.requests] == [1, 3, 5, 8]  # a larger call goes alone


async def test_a_failed_request_answers_every_merged_op() -> None:
    node = FakeNode()
    co = WriteCoalescer(node.send)
    node.fail = RuntimeError("boom")
    a, b = await asyncio.gather(
        co.submit("n1", "ks", "persist", ops("a", "b")), co.submit("n1", "ks", "persist", ops("c"))
    )
    assert all(isinstance(r, ShardexError) and "boom" in r.message for r in [*a, *b])


async def test_a_cancelled_caller_does_not_strand_the_others() -> None:
    node = FakeNode()
    co = WriteCoalescer(node.send)
    node.hold.clear()
    first = asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("a")))
    await asyncio.sleep(0)
    quitter = asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("b")))
    stayer = asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("c")))
    await asyncio.sleep(0)
    first.cancel()
    quitter.cancel()
    node.hold.set()
    res = await stayer
    assert not isinstance(res[0], ShardexError)
    assert node.requests == [("n1", ["a"]), ("n1", ["b", "c"])]  # sent: outcome unknown to b


async def test_close_answers_the_request_out_and_the_waiting_calls() -> None:
    node = FakeNode()
    co = WriteCoalescer(node.send)
    node.hold.clear()
    out = asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("a")))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(co.submit("n1", "ks", "persist", ops("b")))
    await asyncio.sleep(0)
    await co.close()
    (ra,), (rb,) = await out, await waiting
    assert isinstance(ra, ShardexError) and ra.details.get("outcome", "").startswith("unknown")
    assert isinstance(rb, ShardexError) and rb.details.get("unsent") is True


async def test_calls_with_other_durability_timeouts_are_never_merged() -> None:
    node = FakeNode()
    co = WriteCoalescer(node.send)
    node.hold.clear()
    first = asyncio.ensure_future(co.submit("n1", "ks", "majority", ops("a"), 1.0))
    await asyncio.sleep(0)
    same = asyncio.ensure_future(co.submit("n1", "ks", "majority", ops("b"), 1.0))
    other = asyncio.ensure_future(co.submit("n1", "ks", "majority", ops("c"), 3.0))
    default = asyncio.ensure_future(co.submit("n1", "ks", "majority", ops("d")))
    await asyncio.sleep(0)
    node.hold.set()
    await asyncio.gather(first, same, other, default)
    sent = {tuple(docids): t for (_, docids), t in zip(node.requests, node.timeouts, strict=True)}
    assert sent == {("a",): 1.0, ("b",): 1.0, ("c",): 3.0, ("d",): None}

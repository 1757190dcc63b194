"""The data node's write path: ``MutateMany`` batches through group commit, and the JSON
check every write runs (on the client and again on the node)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shardex.api.data import MutateMany, MutateManyReply, OpItem
from shardex.api.validation import encode_document
from shardex.data import groupcommit
from shardex.data.engine_io import WouldBlock
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from tests.unit.data.test_data_service import running_service, state_with


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[DataService]:
    async with running_service(tmp_path) as (ds, coord):
        coord.state = state_with(5, ("ks", "u1", 1, 5, ["n1"]))  # one partition: global seqnos
        await ds.reconcile()
        yield ds


def batch(prefix: str, n: int, bad: int | None = None) -> MutateMany:
    ops = [OpItem("upsert", f"{prefix}{i}", b'{"i": %d}' % i) for i in range(n)]
    if bad is not None:
        ops[bad] = OpItem("upsert", f"{prefix}{bad}", b"[1]")  # not an object
    return MutateMany(keyspace="ks", ops=ops)


async def test_concurrent_batches_share_commits_in_arrival_order(service: DataService) -> None:
    committer = service.committer
    assert committer is not None
    msgs = [batch(f"b{k}-", 10, bad=3 if k == 5 else None) for k in range(30)]
    single = committer.submit("ks", "persist", ("upsert", "lone", b"{}", None))
    replies = await asyncio.gather(
        *(service.writes.on_mutate_many(m, None) for m in msgs),  # type: ignore[arg-type]
        single,
    )
    # Fewer commits than batches: they waited for one flush and went together.
    assert committer.ops == 30 * 10 + 1 and committer.flushes < 30
    seqnos: list[int] = []
    for k, reply in enumerate(replies[:-1]):
        assert isinstance(reply, MutateManyReply)
        if k == 5:  # the bad item fails alone, with its index, and takes no seqno
            assert [(e.index, e.error.code) for e in reply.errors] == [(3, "BAD_REQUEST")]
            assert reply.results[3] is None
        else:
            assert reply.errors == []
        seqnos += [r.seqno for r in reply.results if r is not None]
    # Batches apply whole and in arrival order (gather starts them in argument order), the
    # single write after them.
    assert seqnos == list(range(1, 300))
    assert replies[-1].seqno == 300


async def test_a_batch_over_the_group_limit_goes_alone(
    service: DataService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(groupcommit, "MAX_GROUP_OPS", 5)
    committer = service.committer
    assert committer is not None
    calls: list[int] = []
    real = committer._mutate_many

    def counting(keyspace: str, ops: list[Any], **kw: Any) -> list[Any]:
        calls.append(len(ops))
        return real(keyspace, ops, **kw)

    committer._mutate_many = counting  # type: ignore[method-assign]
    big, small = batch("big", 12), batch("small", 2)
    a, b, c = await asyncio.gather(
        service.writes.on_mutate_many(big, None),  # type: ignore[arg-type]
        service.writes.on_mutate_many(small, None),  # type: ignore[arg-type]
        service.writes.on_mutate_many(batch("more", 3), None),  # type: ignore[arg-type]
    )
    # The 12-op batch is never split; the next two fit one group of at most 5 ops.
    assert calls == [12, 5]
    assert [r.seqno for r in a.results] == list(range(1, 13))
    assert [r.seqno for r in b.results + c.results] == list(range(13, 18))


async def test_batch_to_an_unknown_keyspace_fails_whole(service: DataService) -> None:
    for ops in ([OpItem("upsert", "x", b"{}")], []):
        with pytest.raises(ShardexError) as info:
            await service.writes.on_mutate_many(MutateMany(keyspace="nope", ops=ops), None)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND


async def test_small_unsynced_groups_are_written_on_the_loop_once_the_mark_is_down(
    service: DataService,
) -> None:
    committer = service.committer
    assert committer is not None
    pooled: list[int] = []
    real_run = committer._run

    async def counting_run(fn: Any, keyspace: str, ops: list[Any], **kw: Any) -> Any:
        pooled.append(len(ops))
        return await real_run(fn, keyspace, ops, **kw)

    committer._run = counting_run  # type: ignore[method-assign]
    # the partition's first unsynced write fsyncs its dirty mark: in the pool
    first = await committer.submit("ks", "none", ("upsert", "a", b'{"i": 1}', None))
    assert pooled == [1]
    # the next ones need no fsync: on the loop, same results
    second = await committer.submit("ks", "majority", ("upsert", "b", b'{"i": 2}', None))
    third = await committer.submit("ks", "none", ("delete", "a", b"", None))
    assert pooled == [1]
    assert (first.seqno, second.seqno, third.seqno) == (1, 2, 3)
    # a synced level always goes to the pool
    await committer.submit("ks", "persist", ("upsert", "c", b"{}", None))
    assert pooled == [1, 1]
    assert service.engine.get("ks", "b").doc == {"i": 2}


def test_an_inline_write_that_would_wait_writes_nothing(service: DataService) -> None:
    engine = service.engine
    ops = [("upsert", "x", b'{"i": 1}', None)]
    with pytest.raises(WouldBlock):  # an fsync: the level's, or the first dirty mark's
        engine.mutate_many("ks", ops, durability="persist", inline=True)
    with pytest.raises(WouldBlock):
        engine.mutate_many("ks", ops, durability="none", inline=True)
    engine.mutate_many("ks", ops, durability="none")  # the mark is down now
    part = engine._local.parts[("ks", 0)]
    high = part.meta.high_seqno
    with part.lock, pytest.raises(WouldBlock):  # another thread's lock: never waited for
        engine.mutate_many("ks", ops, durability="none", inline=True)
    assert part.meta.high_seqno == high
    engine.mutate_many("ks", ops, durability="none", inline=True)
    assert part.meta.high_seqno == high + 1


def test_json_check_keeps_bytes_and_rejects_what_it_did() -> None:
    body = b'{"a": [1, {"b": null}]}'
    assert encode_document(body, 1 << 20) is body  # stored as given: no copy
    assert encode_document(bytearray(body), 1 << 20) == body
    assert encode_document({"a": 1}, 1 << 20) == b'{"a":1}'
    for bad, code in (
        (b"[1]", ErrorCode.BAD_REQUEST),
        (b'"text"', ErrorCode.BAD_REQUEST),
        (b'{"a": tru}', ErrorCode.BAD_REQUEST),
        (b'{"a": "\xff"}', ErrorCode.BAD_REQUEST),  # not UTF-8
        (b'{"a": 1e999}', ErrorCode.BAD_REQUEST),  # not a finite number
        (b"{}" + b" " * 100, ErrorCode.DOC_TOO_LARGE),
    ):
        with pytest.raises(ShardexError) as info:
            encode_document(bad, 50, "d")
        assert info.value.code is code, bad

"""Group commit: concurrent mutations share one atomic batch and one fsync.

Why: a durable write costs one WAL fsync (0.4 to 3.5 ms measured here, see
``docs/decisions/0012-group-commit.md``) and, measured in CPU, a commit costs the node about
200 us on top of its
writes whether it carries 1 or 1,000 of them. Clients writing concurrently would each pay it,
serialised behind the partition and store locks. Instead every single mutation and every
``MutateMany`` batch joins a queue per (keyspace, durability); one flusher at a time hands
everything queued to ``DataEngine.mutate_many`` in the I/O executor, which writes it as one
batch, one fsync. A lone client sees no added latency (its ops are flushed at once); under load
the group grows by itself while the previous fsync runs.
Ordering: entries are applied in arrival order and a batch's ops stay together and in order,
which for two concurrent clients is as good as any serial order; one client waits for its ack
before its next write to the node (the bulk writer sends one batch per node at a time).

A small group at a level without an fsync on this node (``none``, ``majority``) is written
on the event loop: the hop to an I/O thread and back costs more CPU (about 90 us measured,
``engine_io.py``) than the unsynced RocksDB write of a few documents. The engine refuses
(``WouldBlock``, nothing written) what would make the loop wait, which then goes to the
pool as before: a partition's first unsynced write since its last fsync (its dirty mark is
fsynced), a lock held by another thread, a RocksDB write stall (refused at once: the write
goes with ``no_slowdown``). A replica's small unsynced apply follows the same rules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shardex.api.records import MutationResult
from shardex.api.validation import SYNCED_LEVELS
from shardex.data.engine_io import WouldBlock
from shardex.errors import ErrorCode, ShardexError

log = logging.getLogger(__name__)

MAX_GROUP_OPS = 1000  # ops per flush (a larger batch goes alone): bounds lock hold time
INLINE_OPS = 32  # a group up to this size at an unsynced level is written on the loop

# (kind, docid, doc, cas) or (kind, docid, doc, cas, expiry): ``DocumentOps.mutate_many``'s
OpTuple = tuple[str, str, object, int | None] | tuple[str, str, object, int | None, int]
RunInExecutor = Callable[..., Awaitable[Any]]
Outcome = MutationResult | ShardexError


Then = Callable[[Outcome | BaseException], None]


class _Entry:
    """One submitter's ops and where its outcome goes: a future (a single op's result, or
    its error raised; a batch's list of per-op outcomes), or for a single op ``then``,
    called once with its result or error (``submit_then``)."""

    __slots__ = ("future", "ops", "single", "then")

    def __init__(
        self,
        ops: list[OpTuple],
        future: asyncio.Future[Any] | None,
        single: bool,
        then: Then | None = None,
    ) -> None:
        self.ops = ops
        self.future = future
        self.single = single
        self.then = then


class GroupCommitter:
    """Queues of pending mutations, one flusher task per queue."""

    def __init__(self, mutate_many: Callable[..., list[Any]], run: RunInExecutor) -> None:
        self._mutate_many = mutate_many
        self._run = run
        self._queues: dict[tuple[str, str], list[_Entry]] = {}
        # One flusher per queue with entries: a task, or at an unsynced level first a loop
        # callback (``_flush_now``), which writes small groups on the loop without a task
        # and hands the queue to a task only when something must wait.
        self._flushers: dict[tuple[str, str], asyncio.Task[None] | asyncio.Handle] = {}
        self.flushes = 0  # counters for tests and stats
        self.ops = 0

    async def submit(self, keyspace: str, durability: str, op: OpTuple) -> MutationResult:
        """Apply ``op`` (with whatever else is queued) and return its result or raise its
        error. Validation errors of one op never affect the others in its group."""
        result: MutationResult = await self._enqueue(keyspace, durability, [op], single=True)
        return result

    def submit_then(self, keyspace: str, durability: str, op: OpTuple, then: Then) -> None:
        """``submit`` for a caller settling by callbacks: ``then`` is called with the op's
        result or error as its group is settled (no future, no loop hop: a single durable
        write goes on to its durability wait in the same callback)."""
        key = (keyspace, durability)
        self._queues.setdefault(key, []).append(_Entry([op], None, True, then))
        if key not in self._flushers:
            self._start_flusher(key, asyncio.get_running_loop())

    async def submit_many(
        self, keyspace: str, durability: str, ops: list[OpTuple]
    ) -> list[Outcome]:
        """Apply ``ops`` in order, in one group (with whatever else is queued); returns each
        op's result or error. Raises only what fails the whole group (unknown keyspace, bad
        durability, a failed write): an empty batch still checks the keyspace."""
        outcomes: list[Outcome] = await self._enqueue(keyspace, durability, ops, single=False)
        return outcomes

    def _enqueue(
        self, keyspace: str, durability: str, ops: list[OpTuple], *, single: bool
    ) -> asyncio.Future[Any]:
        key = (keyspace, durability)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queues.setdefault(key, []).append(_Entry(ops, fut, single))
        if key not in self._flushers:
            self._start_flusher(key, loop)
        return fut

    def _start_flusher(self, key: tuple[str, str], loop: asyncio.AbstractEventLoop) -> None:
        keyspace, durability = key
        # A task costs more than the small unsynced write it would wait for.
        self._flushers[key] = (
            loop.call_soon(self._flush_now, key)
            if durability not in SYNCED_LEVELS
            else loop.create_task(self._flush(key), name=f"data-groupcommit {keyspace}")
        )

    def _take(self, key: tuple[str, str]) -> tuple[list[_Entry], int] | None:
        """The next group of ``key``'s queue (None: the queue is empty, and gone): whole
        entries, in arrival order, up to MAX_GROUP_OPS ops (at least one)."""
        queue = self._queues.get(key)
        if not queue:
            self._queues.pop(key, None)
            return None
        n = total = 0
        while n < len(queue) and (n == 0 or total + len(queue[n].ops) <= MAX_GROUP_OPS):
            total += len(queue[n].ops)
            n += 1
        group, rest = queue[:n], queue[n:]
        if rest:
            self._queues[key] = rest
        else:
            del self._queues[key]
        return group, total

    def _flush_now(self, key: tuple[str, str]) -> None:
        """The flusher of an unsynced queue, as a loop callback: each small group written on
        the loop (``_write``'s judgement); the first that must wait for the pool, or that
        failed whole for another reason than its own (``_apply``'s retry), goes to a task
        with the rest of the queue."""
        keyspace, durability = key
        loop = asyncio.get_running_loop()
        while (taken := self._take(key)) is not None:
            group, total = taken
            if total <= INLINE_OPS:
                ops = group[0].ops if len(group) == 1 else [op for e in group for op in e.ops]
                try:
                    results = self._mutate_many(keyspace, ops, durability=durability, inline=True)
                except ShardexError as exc:  # the whole group: unknown keyspace, ...
                    self._count(total)
                    for entry in group:
                        _settle_entry(entry, exc)
                    continue
                except Exception:  # WouldBlock, or the retry one by one: in a task
                    pass
                else:
                    self._count(total)
                    self._settle_group(group, results)
                    continue
            self._flushers[key] = loop.create_task(
                self._flush(key, (group, total)), name=f"data-groupcommit {keyspace}"
            )
            return
        # Nothing can be queued meanwhile: this runs on the loop, with no await.
        self._flushers.pop(key, None)

    def _count(self, total: int) -> None:
        self.flushes += 1
        self.ops += total

    async def _flush(
        self, key: tuple[str, str], first: tuple[list[_Entry], int] | None = None
    ) -> None:
        keyspace, durability = key
        try:
            if first is not None:
                await self._apply(keyspace, durability, *first)
            while (taken := self._take(key)) is not None:
                await self._apply(keyspace, durability, *taken)
        finally:
            # No await between the emptiness check in ``_take`` and this pop, so nothing can
            # be queued without a flusher; a cancelled flusher (close) leaves its queue to
            # close.
            self._flushers.pop(key, None)

    async def close(self) -> None:
        """Stop flushing; ops still queued fail (their requesters are being disconnected)."""
        flushers = list(self._flushers.values())
        for t in flushers:
            t.cancel()
        tasks = [t for t in flushers if isinstance(t, asyncio.Task)]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flushers.clear()
        closed = ShardexError("data service stopping", code=ErrorCode.NODE_UNAVAILABLE)
        for queue in self._queues.values():
            for entry in queue:
                _settle_entry(entry, closed)
        self._queues.clear()

    async def _apply(self, keyspace: str, durability: str, group: list[_Entry], total: int) -> None:
        self._count(total)
        ops = group[0].ops if len(group) == 1 else [op for e in group for op in e.ops]
        try:
            results = await self._write(keyspace, durability, ops, total)
        except ShardexError as exc:  # the whole group: unknown keyspace, bad durability, ...
            for entry in group:
                _settle_entry(entry, exc)
            return
        except Exception as exc:
            # Not a reason that fails the whole group: most likely one entry's op (a poison
            # document the checks missed). Retry the entries one by one, so only the guilty
            # one fails and its neighbours commit. Safe: ``mutate_many`` raises only before
            # it has written anything (a failure after a written chunk is per op).
            if len(group) == 1:
                _settle_entry(group[0], _storage_error(keyspace, exc))
                return
            for entry in group:
                await self._apply_one(keyspace, durability, entry)
            return
        self._settle_group(group, results)

    async def _write(
        self, keyspace: str, durability: str, ops: list[OpTuple], total: int
    ) -> list[Any]:
        """The group's outcomes: on the loop when it is small and needs no fsync (module
        docstring), else in the I/O pool."""
        if total <= INLINE_OPS and durability not in SYNCED_LEVELS:
            try:
                return self._mutate_many(keyspace, ops, durability=durability, inline=True)
            except WouldBlock:
                pass
        return await self._run(self._mutate_many, keyspace, ops, durability=durability)

    async def _apply_one(self, keyspace: str, durability: str, entry: _Entry) -> None:
        """One entry of a group that failed whole, alone: its results, or its failure."""
        try:
            results = await self._run(self._mutate_many, keyspace, entry.ops, durability=durability)
        except ShardexError as exc:
            _settle_entry(entry, exc)
        except Exception as exc:
            _settle_entry(entry, _storage_error(keyspace, exc))
        else:
            self._settle_group([entry], results)

    @staticmethod
    def _settle_group(group: list[_Entry], results: list[Outcome]) -> None:
        start = 0
        for entry in group:
            end = start + len(entry.ops)
            if entry.single:
                _settle_entry(entry, results[start])
            elif entry.future is not None and not entry.future.done():
                entry.future.set_result(results[start:end])
            start = end


def _storage_error(keyspace: str, exc: Exception) -> ShardexError:
    return ShardexError(
        f"mutation failed: {type(exc).__name__}: {exc}",
        code=ErrorCode.STORAGE_ERROR,
        details={"keyspace": keyspace},
    )


def _settle_entry(entry: _Entry, value: Any) -> None:
    then = entry.then
    if then is None:
        if entry.future is not None:
            _settle(entry.future, value)
        return
    entry.then = None  # once
    try:
        then(value)
    except Exception:  # the submitter's bug: the rest of the group is still settled
        log.exception("a group commit callback failed")


def _settle(fut: asyncio.Future[Any], value: Any) -> None:
    if fut.done():  # the requester went away (connection closed): nobody to tell
        return
    if isinstance(value, BaseException):
        fut.set_exception(value)
    else:
        fut.set_result(value)

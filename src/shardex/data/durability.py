"""Durable writes on the active copy: waiting until a majority of the copies hold a write.

A write at a majority level is committed on the active like any other, then waits here until
enough copies acknowledge its seqno (``docs/decisions/0082-replicas-and-durability.md``): a
majority is ``copies // 2 + 1`` of the configured chain (active + ``num_replicas``), the
active counting as one (it holds the write, fsynced when the level says so), each replica
counting once its ``ReplicaAck`` for the partition is at or past the seqno on the same
branch (``persisted`` rather than ``high`` for ``persist_majority``).

While such a write waits, its document is *pending*: a read of it on the active waits too,
so nobody sees a value that a failover could still lose (Couchbase hides pending SyncWrites
the same way).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable

from shardex.api.records import STATE_REPLICA
from shardex.api.replication import ReplicaAck
from shardex.api.validation import majority_of
from shardex.errors import ErrorCode, ShardexError

DEFAULT_DURABILITY_TIMEOUT = 5.0  # seconds a durable write waits for its copies

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (keyspace, partition)
Then = Callable[[BaseException | None], None]


@dataclasses.dataclass(slots=True)
class _Waiter:
    seqno: int
    uuid: int
    persist: bool  # persist_majority: count fsynced copies
    docid: str
    future: asyncio.Future[None]
    timeout: float  # seconds it may wait: the writer's ``durability_timeout`` or the default
    timer: asyncio.TimerHandle | None = None
    # A caller settling by callbacks (``start_wait(then=...)``): called once, with None or
    # the wait's error, by whatever ends the wait; ``future`` still wakes waiting readers.
    then: Then | None = None


@dataclasses.dataclass(slots=True)
class _Chain:
    copies: int  # configured: 1 + num_replicas
    replicas: tuple[str, ...]  # the replica nodes the current topology names
    majority: int = 0  # majority_of(copies), kept: every durable write and ack needs it

    def __post_init__(self) -> None:
        self.majority = majority_of(self.copies)


class DurabilityWaits:
    """The durable writes waiting on this node's active copies, and their replicas' acks."""

    def __init__(self, timeout: float = DEFAULT_DURABILITY_TIMEOUT) -> None:
        self.timeout = timeout
        self._chains: dict[Key, _Chain] = {}
        self._acks: dict[Key, dict[str, ReplicaAck]] = {}
        self._waiters: dict[Key, list[_Waiter]] = {}
        self._pending: dict[Key, dict[str, int]] = {}  # docid -> newest waiting seqno

    # --- configuration (from the topology) ---------------------------------------------------

    def set_chain(self, key: Key, copies: int, replicas: Iterable[str]) -> None:
        chain = _Chain(copies, tuple(replicas))
        if self._chains.get(key) != chain:
            self._chains[key] = chain
            acks = self._acks.get(key)
            if acks:  # a node that left the chain counts no more
                for node in [n for n in acks if n not in chain.replicas]:
                    del acks[node]
            self._settle(key)

    def forget(self, key: Key, error: ShardexError) -> None:
        """This node no longer holds the active copy: every wait on it is ambiguous."""
        self._chains.pop(key, None)
        self._acks.pop(key, None)
        self._pending.pop(key, None)
        for w in self._waiters.pop(key, []):
            if w.future.done():
                continue
            if w.then is None:
                w.future.set_exception(error)
            else:  # the writer hears it; readers wake (their document is no longer pending)
                _cancel_timer(w)
                w.future.cancel()
                _call(w.then, error)

    def copies(self, key: Key) -> int:
        chain = self._chains.get(key)
        return 1 if chain is None else chain.copies

    def replicas(self, key: Key) -> tuple[str, ...]:
        chain = self._chains.get(key)
        return () if chain is None else chain.replicas

    # --- acks ----------------------------------------------------------------------------------

    def record(self, key: Key, node: str, ack: ReplicaAck) -> None:
        chain = self._chains.get(key)
        if chain is None or node not in chain.replicas:
            return
        self._acks.setdefault(key, {})[node] = ack
        if self._waiters.get(key):
            self._settle(key)

    def ack(self, key: Key, node: str) -> ReplicaAck | None:
        acks = self._acks.get(key)
        return None if acks is None else acks.get(node)

    def needs_persist(self, key: Key, node: str) -> bool:
        """A persist_majority write waits for ``node`` to fsync past what it has."""
        waiters = self._waiters.get(key)
        if not waiters:
            return False
        # The ack only when a persist_majority write waits (asked per run and per ack of
        # every round, where the waiting writes are mostly of the other levels).
        persisted: int | None = None
        for w in waiters:
            if w.persist:
                if persisted is None:
                    ack = self.ack(key, node)
                    persisted = -1 if ack is None else ack.persisted
                if w.seqno > persisted:
                    return True
        return False

    def _holds(self, key: Key, seqno: int, uuid: int, persist: bool) -> bool:
        chain = self._chains.get(key)
        need = 1 if chain is None else chain.majority
        have = 1  # the active
        if have >= need:
            return True
        acks = self._acks.get(key)
        if acks:
            for ack in acks.values():
                held = ack.persisted if persist else ack.high
                if ack.uuid == uuid and ack.state == STATE_REPLICA and held >= seqno:
                    have += 1
                    if have >= need:
                        return True
        return False

    def _settle(self, key: Key) -> None:
        waiters = self._waiters.get(key)
        if not waiters:
            return
        left = []
        called: list[_Waiter] = []
        for w in waiters:
            if w.future.done():
                continue
            if self._holds(key, w.seqno, w.uuid, w.persist):
                w.future.set_result(None)
                self._unpend(key, w)
                if w.then is not None:
                    called.append(w)
            else:
                left.append(w)
        self._waiters[key] = left
        # After the list is consistent: a writer's callback may start another wait.
        for w in called:
            _cancel_timer(w)
            _call(w.then, None)

    def _unpend(self, key: Key, w: _Waiter) -> None:
        docs = self._pending.get(key)
        if docs is not None and docs.get(w.docid) == w.seqno:
            self._drop_pending(key, docs, w.docid)

    def _drop_pending(self, key: Key, docs: dict[str, int], docid: str) -> None:
        """Forget ``docid``'s pending write, and the partition's entry once it is empty:
        ``has_pending`` runs on every read and must stay ``bool(dict)``."""
        docs.pop(docid, None)
        if not docs:
            del self._pending[key]

    # --- writes and reads ---------------------------------------------------------------------

    def check_possible(self, key: Key, reachable: int) -> None:
        """DURABILITY_IMPOSSIBLE unless ``reachable`` copies (the active included) can make a
        majority of the configured chain; nothing has been written yet."""
        chain = self._chains.get(key)
        copies, need = (1, 1) if chain is None else (chain.copies, chain.majority)
        if reachable < need:
            raise ShardexError(
                f"durable write impossible on partition {key[1]} of {key[0]!r}: a majority is "
                f"{need} of {copies} copies, {reachable} reachable",
                code=ErrorCode.DURABILITY_IMPOSSIBLE,
                details={
                    "keyspace": key[0],
                    "partition": key[1],
                    "copies": copies,
                    "majority": need,
                    "reachable": reachable,
                    "hint": "wait for the replicas to come back, fail the down node over and "
                    "rebalance, or write with durability none / persist_active",
                },
            )

    async def wait(
        self,
        key: Key,
        seqno: int,
        uuid: int,
        *,
        persist: bool,
        docid: str,
        timeout: float | None = None,
    ) -> None:
        """Until a majority holds ``seqno``; DURABILITY_AMBIGUOUS after ``timeout`` (None:
        this node's default, ``self.timeout``)."""
        w = self.start_wait(key, seqno, uuid, persist=persist, docid=docid, timeout=timeout)
        if w is None:
            return
        try:
            await w.future
        except _Expired:
            raise self.ambiguous(key, w) from None
        finally:
            self.end_wait(key, w)

    def start_wait(
        self,
        key: Key,
        seqno: int,
        uuid: int,
        *,
        persist: bool,
        docid: str,
        timeout: float | None = None,
        then: Then | None = None,
    ) -> _Waiter | None:
        """``wait``'s first half: None when a majority holds ``seqno`` already, else the
        waiter whose ``future`` ends the wait (``_Expired`` after ``timeout``); ``end_wait``
        must follow once it is done, or to give up.

        With ``then`` (a caller settling by callbacks, once per durable write): the wait
        ends by calling ``then`` with None, DURABILITY_AMBIGUOUS after ``timeout``, or the
        error that made the copy forgotten, and needs no ``end_wait``; no done callback and
        no loop hop between the ack that settles the write and its writer."""
        if self._holds(key, seqno, uuid, persist):
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        w = _Waiter(seqno, uuid, persist, docid, fut, self.timeout if timeout is None else timeout)
        self._waiters.setdefault(key, []).append(w)
        docs = self._pending.setdefault(key, {})
        if docs.get(docid, -1) < seqno:
            docs[docid] = seqno
        # One timer instead of ``wait_for(shield(fut))``: this runs once per durable write,
        # and wait_for's task, shield and callbacks cost more than the write's bookkeeping.
        if then is None:
            w.timer = loop.call_later(w.timeout, _expire, fut)
        else:
            w.then = then
            w.timer = loop.call_later(w.timeout, self._expire_then, key, w)
        return w

    def _expire_then(self, key: Key, w: _Waiter) -> None:
        """A callback waiter's timer: no majority in time, DURABILITY_AMBIGUOUS."""
        if w.future.done() or w.then is None:
            return
        w.future.cancel()  # readers waiting on the document wake and look again
        self.end_wait(key, w)
        _call(w.then, self.ambiguous(key, w))

    def end_wait(self, key: Key, w: _Waiter) -> None:
        """The wait on ``w`` is over: its timer goes, and unless a majority holds its write
        (timed out, or its writer gave up) it is no longer waiting."""
        if w.timer is not None:
            w.timer.cancel()
        fut = w.future
        if not _held(fut):
            if not fut.done():
                fut.cancel()
            waiters = self._waiters.get(key)
            if waiters is not None and w in waiters:
                waiters.remove(w)
            self._unpend(key, w)

    def ambiguous(self, key: Key, w: _Waiter) -> ShardexError:
        """DURABILITY_AMBIGUOUS for ``w``'s write, which timed out."""
        return ShardexError(
            f"durable write of {w.docid!r} (partition {key[1]} of {key[0]!r}, seqno "
            f"{w.seqno}) was not acknowledged by a majority within {w.timeout:g} s (its "
            "durability timeout): it is written on the active and may or may not survive a "
            "failover",
            code=ErrorCode.DURABILITY_AMBIGUOUS,
            details={
                "keyspace": key[0],
                "partition": key[1],
                "docid": w.docid,
                "seqno": w.seqno,
                "durability_timeout": w.timeout,
                "hint": "read the document back to see whether it took effect; a longer "
                "durability_timeout waits longer for slow replicas",
            },
        )

    def has_pending(self) -> bool:
        """Any durable write waiting on this node (reads check documents only then)."""
        return bool(self._pending)  # no empty entries: see ``_drop_pending``

    def pending(self, key: Key, docid: str) -> bool:
        docs = self._pending.get(key)
        return bool(docs) and docid in docs  # type: ignore[operator]

    async def wait_readable(self, key: Key, docid: str) -> None:
        """Until no durable write of ``docid`` is pending (SYNC_WRITE_IN_PROGRESS after the
        timeout: the caller retries)."""
        deadline = asyncio.get_running_loop().time() + self.timeout
        while self.pending(key, docid):
            futs = [w.future for w in self._waiters.get(key, []) if w.docid == docid]
            left = deadline - asyncio.get_running_loop().time()
            if not futs or left <= 0:
                if not futs:
                    docs = self._pending.get(key)
                    if docs is not None:
                        self._drop_pending(key, docs, docid)
                    return
                raise ShardexError(
                    f"document {docid!r} has a durable write in progress",
                    code=ErrorCode.SYNC_WRITE_IN_PROGRESS,
                    details={"keyspace": key[0], "partition": key[1], "docid": docid},
                )
            # the futures themselves: ``wait`` cancels nothing, and their writers retrieve
            # their outcomes (a shield here would leave its own exception unretrieved)
            await asyncio.wait(futs, timeout=left)


class _Expired(Exception):
    """A durable write's timer fired before a majority held it."""


def _cancel_timer(w: _Waiter) -> None:
    if w.timer is not None:
        w.timer.cancel()
        w.timer = None


def _call(then: Then, error: BaseException | None) -> None:
    """A writer's callback, which answers its request: a bug there must not stop the
    settling of the other writes."""
    try:
        then(error)
    except Exception:
        log.exception("a durable write's callback failed")


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


def _held(fut: asyncio.Future[None]) -> bool:
    """The wait ended because a majority holds the write."""
    return fut.done() and not fut.cancelled() and fut.exception() is None

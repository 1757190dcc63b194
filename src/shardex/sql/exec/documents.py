"""Documents for SQL on a node: fetches for non-covering scans and key lookups, and the
mutations of DML, sent to the owning data nodes (by the keyspace's latest data topology).

Fetches are grouped by owner node and sent as one ``GetMany`` per node (chunks of
``GET_MANY_CHUNK``), all nodes in parallel: the owner reads them from its engine in one call.
A document deleted since the index was read comes back absent and is skipped: the query reads
it as absent, which is what it is now. NOT_MY_PARTITION (a partition moved), for a single
item or a whole request, refreshes the state and re-routes just those docids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import msgspec

from shardex.api.data import (
    Delete,
    Get,
    GetMany,
    GetManyReply,
    GetReply,
    Insert,
    MutationReply,
    Replace,
    Upsert,
)
from shardex.api.records import MutationResult
from shardex.api.validation import write_reply_timeout
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of
from shardex.net import ConnectionPool
from shardex.net.messages import Message
from shardex.scan.cluster_view import ClusterView

__all__ = ["DocumentAccess"]

M = TypeVar("M", bound=Message)

GET_MANY_CHUNK: Final = 1000  # docids per GetMany request
GET_EACH_PARALLEL: Final = 64
REQUEST_TIMEOUT: Final = 10.0
ROUTE_ATTEMPTS: Final = 6

_json_decode = msgspec.json.Decoder()


# This node's own data service answering a ``GetMany`` in-process (``Node`` sets it), and
# the same without waiting (None: it would have to wait).
LocalGetMany = Callable[[GetMany], Awaitable[GetManyReply]]
LocalGetManyNow = Callable[[GetMany], GetManyReply | None]


class DocumentAccess:
    def __init__(self, view: ClusterView, pool: ConnectionPool) -> None:
        self.view = view
        self.pool = pool
        # Documents this node owns are read without the loopback connection: a leaf run
        # where its slices are (``local_leaf``) often fetches from its own node.
        self.local_get_many: LocalGetMany | None = None
        self.local_get_many_now: LocalGetManyNow | None = None
        self._own_address: str | None = None

    def _is_own(self, address: str) -> bool:
        if self._own_address is None:
            try:
                self._own_address = self.view.address(self.view.name)
            except ShardexError:
                return False  # not a member yet: ask over the network
        return address == self._own_address

    async def _owner(self, keyspace: str, docid: str, fresh: bool) -> str:
        return self._owner_in(await self.view.state(fresh=fresh), keyspace, docid)

    def _owner_in(self, state: Any, keyspace: str, docid: str) -> str:
        meta = state.keyspaces.get(keyspace)
        history = state.data_topologies.get(keyspace)
        if meta is None or not history:
            raise ShardexError(
                f"keyspace {keyspace!r} not found",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={"keyspace": keyspace, "hint": "shardex keyspace list"},
            )
        partition = partition_of(docid, meta.num_partitions)
        node = history[-1].assignment.get(partition)
        if node is None:
            raise ShardexError(
                f"partition {partition} of {keyspace!r} has no owner",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"keyspace": keyspace, "partition": partition},
            )
        return self.view.address(node)

    def _by_owner(self, state: Any, keyspace: str, docids: list[str]) -> dict[str, list[str]]:
        """``docids`` grouped by their owners' addresses in ``state``: one owner lookup per
        partition, not per document (a batch of a few hundred reads a few dozen)."""
        groups: dict[str, list[str]] = {}
        meta = state.keyspaces.get(keyspace)
        # No such keyspace: one partition, whose lookup raises the error naming it.
        n = 1 if meta is None else meta.num_partitions
        owners: dict[int, list[str]] = {}
        for d in docids:
            partition = partition_of(d, n)
            group = owners.get(partition)
            if group is None:
                group = owners[partition] = groups.setdefault(
                    self._owner_in(state, keyspace, d), []
                )
            group.append(d)
        return groups

    async def _to_owner(
        self,
        keyspace: str,
        docid: str,
        msg: Message,
        expect: type[M],
        durability_timeout: float | None = None,
    ) -> M:
        """``msg`` to the document's owner, re-routed after NOT_MY_PARTITION. A write whose
        ``durability_timeout`` is longer than the request timeout is waited for that long
        (and a slack), so the statement fails with the owner's DURABILITY_AMBIGUOUS."""
        timeout = write_reply_timeout(durability_timeout, REQUEST_TIMEOUT)
        last: ShardexError | None = None
        for attempt in range(ROUTE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            address = await self._owner(keyspace, docid, fresh=attempt > 0)
            try:
                return await self.pool.request(address, msg, timeout, expect=expect)
            except ShardexError as exc:
                if exc.code is not ErrorCode.NOT_MY_PARTITION:
                    raise
                last = exc
        assert last is not None
        raise last

    async def get(self, keyspace: str, docid: str) -> Any | None:
        """The document, or None when it does not exist (or was deleted)."""
        found = await self.get_cas(keyspace, docid)
        return None if found is None else found[0]

    async def get_many(self, keyspace: str, docids: Sequence[str]) -> list[tuple[str, Any]]:
        """``(docid, document)`` for the docids that exist, in the given order."""
        return _decoded(await self._fetch(keyspace, docids, with_cas=False), docids)

    def owns_now(self, keyspace: str, docids: Sequence[str]) -> bool:
        """Every docid is this node's own by the cluster state at hand (no wait); False
        when one is not, or when the state or the keyspace is not known here."""
        state = self.view.state_now()
        if state is None:
            return False
        try:
            return all(self._is_own(self._owner_in(state, keyspace, d)) for d in docids)
        except ShardexError:
            return False

    def get_many_now(self, keyspace: str, docids: Sequence[str]) -> list[tuple[str, Any]] | None:
        """``get_many`` within this loop turn when every docid is this node's own and its
        data service answers without waiting: a point query's fetch with no task and no
        message. None when not (or on any error): ``get_many`` then does it, re-routing
        and raising as it always does."""
        now = self.local_get_many_now
        if now is None:
            return None
        unique = list(dict.fromkeys(docids))
        if not self.owns_now(keyspace, unique):
            return None
        try:
            reply = now(GetMany(keyspace=keyspace, docids=unique, with_cas=False))
        except ShardexError:
            return None
        if reply is None or reply.errors:
            return None
        return _decoded(_found(unique, reply, False, False), docids)

    async def get_many_cas(
        self, keyspace: str, docids: Sequence[str]
    ) -> dict[str, tuple[Any, int]]:
        """docid -> (document, CAS) for the docids that exist (DML's optimistic writes)."""
        found = await self._fetch(keyspace, docids, with_cas=True)
        return {d: (_json_decode.decode(body), cas) for d, (body, cas, _) in found.items()}

    async def get_many_meta(
        self, keyspace: str, docids: Sequence[str]
    ) -> list[tuple[str, Any, dict[str, Any]]]:
        """``(docid, document, META())`` for the docids that exist, in the given order, the
        META() with ``id``, ``cas`` (the version read) and ``expiration`` (absolute epoch
        seconds, 0 for none)."""
        found = await self._fetch(keyspace, docids, with_cas=True, with_expiry=True)
        return [
            (d, _json_decode.decode(body), {"id": d, "cas": cas, "expiration": expiry})
            for d in docids
            if d in found
            for body, cas, expiry in (found[d],)
        ]

    async def get_cas(self, keyspace: str, docid: str) -> tuple[Any, int] | None:
        """(document, CAS), or None when it does not exist."""
        try:
            reply = await self._to_owner(
                keyspace, docid, Get(keyspace=keyspace, docid=docid), GetReply
            )
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return None
            raise
        return _json_decode.decode(reply.body), reply.cas

    async def _fetch(
        self, keyspace: str, docids: Sequence[str], *, with_cas: bool, with_expiry: bool = False
    ) -> dict[str, tuple[bytes, int, int]]:
        """docid -> (stored body, CAS or 0, expiry or 0) of the docids that exist, from
        their owners."""
        found: dict[str, tuple[bytes, int, int]] = {}
        todo = list(dict.fromkeys(docids))
        last: ShardexError | None = None
        for attempt in range(ROUTE_ATTEMPTS):
            if not todo:
                break
            if attempt:
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
            groups = self._by_owner(await self.view.state(fresh=attempt > 0), keyspace, todo)
            requests = [
                (address, chunk[i : i + GET_MANY_CHUNK])
                for address, chunk in groups.items()
                for i in range(0, len(chunk), GET_MANY_CHUNK)
            ]
            if len(requests) == 1:  # a point query's one owner: awaited here, no task
                address, ids = requests[0]
                replies = [await self._get_many_at(address, keyspace, ids, with_cas, with_expiry)]
            else:
                replies = await asyncio.gather(
                    *(
                        self._get_many_at(address, keyspace, ids, with_cas, with_expiry)
                        for address, ids in requests
                    )
                )
            todo = []
            for got, moved, error in replies:
                found.update(got)
                todo += moved
                last = error or last
        if todo:
            assert last is not None
            raise last
        return found

    async def _get_many_at(
        self, address: str, keyspace: str, docids: list[str], with_cas: bool, with_expiry: bool
    ) -> tuple[dict[str, tuple[bytes, int, int]], list[str], ShardexError | None]:
        """One GetMany: the bodies found (with their CAS when asked), the docids to re-route
        (their partition moved) and the NOT_MY_PARTITION error that says so; any other error
        is raised."""
        msg = GetMany(keyspace=keyspace, docids=docids, with_cas=with_cas, with_expiry=with_expiry)
        try:
            local = self.local_get_many
            if local is not None and self._is_own(address):
                reply = await local(msg)
            else:
                reply = await self.pool.request(address, msg, REQUEST_TIMEOUT, expect=GetManyReply)
        except ShardexError as exc:
            if exc.code is not ErrorCode.NOT_MY_PARTITION:
                raise
            return {}, docids, exc
        got = _found(docids, reply, with_cas, with_expiry)
        moved: list[str] = []
        error: ShardexError | None = None
        for item in reply.errors:
            err = ShardexError.from_wire(item.error.code, item.error.message, item.error.details)
            if err.code is not ErrorCode.NOT_MY_PARTITION:
                raise err
            moved.append(docids[item.index])
            error = err
        return got, moved, error

    async def get_each(self, keyspace: str, docids: Sequence[str]) -> list[tuple[str, Any]]:
        """As ``get_many``, one ``Get`` per document (``GET_EACH_PARALLEL`` at a time): the
        path before ``GetMany``, kept for the ``get_many`` tuning switch's comparisons."""
        sem = asyncio.Semaphore(GET_EACH_PARALLEL)

        async def one(docid: str) -> Any | None:
            async with sem:
                return await self.get(keyspace, docid)

        docs = await asyncio.gather(*(one(d) for d in docids))
        return [(d, doc) for d, doc in zip(docids, docs, strict=True) if doc is not None]

    async def upsert(
        self,
        keyspace: str,
        docid: str,
        doc: Any,
        *,
        insert: bool = False,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> MutationResult:
        """``durability_timeout`` (checked by the caller): of a majority level's wait for the
        copies, as ``Keyspace.upsert``'s; None: the owner's default. So for every write."""
        body = msgspec.json.encode(doc)
        kind = Insert if insert else Upsert
        msg = kind(
            keyspace=keyspace,
            docid=docid,
            doc=body,
            durability=durability,
            durability_timeout=durability_timeout,
        )
        return (
            await self._to_owner(keyspace, docid, msg, MutationReply, durability_timeout)
        ).result

    async def replace(
        self,
        keyspace: str,
        docid: str,
        doc: Any,
        cas: int,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> MutationResult:
        """Overwrite the version with this CAS: CAS_MISMATCH after a concurrent write,
        DOC_NOT_FOUND after a concurrent delete."""
        body = msgspec.json.encode(doc)
        msg = Replace(
            keyspace=keyspace,
            docid=docid,
            doc=body,
            cas=cas,
            durability=durability,
            durability_timeout=durability_timeout,
        )
        return (
            await self._to_owner(keyspace, docid, msg, MutationReply, durability_timeout)
        ).result

    async def delete(
        self,
        keyspace: str,
        docid: str,
        cas: int | None = None,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> MutationResult | None:
        """None when the document is already gone (a concurrent delete); with ``cas``,
        CAS_MISMATCH when it changed since."""
        msg = Delete(
            keyspace=keyspace,
            docid=docid,
            cas=cas,
            durability=durability,
            durability_timeout=durability_timeout,
        )
        try:
            reply = await self._to_owner(keyspace, docid, msg, MutationReply, durability_timeout)
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return None
            raise
        return reply.result


def _found(
    docids: list[str], reply: GetManyReply, with_cas: bool, with_expiry: bool
) -> dict[str, tuple[bytes, int, int]]:
    """docid -> (stored body, CAS or 0, expiry or 0) of a ``GetMany``'s documents that
    exist."""
    zeros = [0] * len(docids)
    cas = reply.cas if with_cas else zeros
    expiries = reply.expiries if with_expiry else zeros
    return {
        d: (b, c, e)
        for d, b, c, e in zip(docids, reply.bodies, cas, expiries, strict=True)
        if b is not None
    }


def _decoded(
    found: dict[str, tuple[bytes, int, int]], docids: Sequence[str]
) -> list[tuple[str, Any]]:
    """``(docid, document)`` for the docids found, in ``docids``' order (repeats kept)."""
    return [(d, _json_decode.decode(found[d][0])) for d in docids if d in found]

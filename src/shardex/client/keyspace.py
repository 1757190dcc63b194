"""``Keyspace``: the synchronous document API of one keyspace (``client.keyspace(name)``).

Inputs are checked here first with the very functions the data node uses (docid, document,
CAS, durability), so a bad call fails at once with a precise ``BAD_REQUEST`` or
``DOC_TOO_LARGE`` and nothing is sent; the node checks again, since not every client is this
one.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime
import itertools
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import msgspec

from shardex.api.data import (
    Delete,
    Get,
    GetAndTouch,
    GetReply,
    Insert,
    MutationReply,
    OpItem,
    Replace,
    Touch,
    Upsert,
)
from shardex.api.errors import BadRequest
from shardex.api.expiry import wire_expiry
from shardex.api.records import MutationResult
from shardex.api.validation import (
    DEFAULT_MAX_DOC_BYTES,
    check_cas,
    check_docid,
    check_durability,
    check_durability_timeout,
    encode_document,
)
from shardex.client.bulk import BulkWriteError, BulkWriter, Result
from shardex.client.streams import DEFAULT_CREDIT, ChangeStream, RemoteStream
from shardex.errors import ShardexError
from shardex.meta.partitioning import partition_of

if TYPE_CHECKING:
    from shardex.client.direct_kv import DirectKV
    from shardex.client.rpc_session import RpcSession

# A write's ``expiry=``: seconds (relative up to 30 days, else absolute epoch seconds), a
# duration, an absolute time, or None (``api/expiry.py``).
Expiry = int | float | datetime.timedelta | datetime.datetime | None

R = TypeVar("R", MutationReply, GetReply)

DEFAULT_CHUNK = 1000
DEFAULT_WINDOW = 4  # chunks in flight per upsert_many


class VersionedDocument(NamedTuple):
    doc: dict[str, Any]
    cas: int  # pass to replace/delete for optimistic concurrency
    seqno: int  # the seqno of the mutation that wrote this version


class Keyspace:
    """Documents of one keyspace. Thread-safe; cheap to create (no network until used)."""

    def __init__(self, rpc: RpcSession, name: str, direct: DirectKV | None = None) -> None:
        self._rpc = rpc  # the client's: every call here is one ``rpc.run``...
        # ...but single-document requests, sent from the calling thread where it can
        # (``client/direct_kv.py``; None: on the loop, as everything else).
        self._direct = direct
        self.name = name
        self.max_doc_bytes = DEFAULT_MAX_DOC_BYTES

    def __repr__(self) -> str:
        return f"<Keyspace {self.name}>"

    # --- single documents ----------------------------------------------------------------------

    def _encode(self, docid: object, doc: object) -> tuple[str, bytes]:
        docid = check_docid(docid)
        return docid, encode_document(doc, self.max_doc_bytes, docid)

    def _mutate(self, docid: str, msg: Any) -> MutationResult:
        return self._write(docid, msg, MutationReply).result

    def _write(self, docid: str, msg: Any, expect: type[R]) -> R:
        """A write to the document's owner (never resent once its outcome is unknown),
        waited for as long as its durability timeout needs."""
        timeout = self._rpc.router.write_timeout(msg.durability_timeout)
        direct = self._direct
        if direct is not None:
            return direct.to_owner(self.name, docid, msg, expect, idempotent=False, timeout=timeout)
        router = self._rpc.router
        return self._rpc.run(
            router.to_owner(self.name, docid, msg, expect, idempotent=False, timeout=timeout)
        )

    def insert(
        self,
        docid: str,
        doc: object,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
        expiry: Expiry = None,
    ) -> MutationResult:
        """Create ``docid``; DOC_EXISTS if it exists. Returns (partition, seqno, uuid, cas).
        ``durability_timeout``: seconds a majority level waits for the copies before
        DURABILITY_AMBIGUOUS (None: the node's default, 5 s; at most 65.535).
        ``expiry``: when the document expires: seconds from now (up to 30 days; a larger
        int is absolute epoch seconds, as Couchbase's), a ``timedelta``, or a ``datetime``;
        None: never, or the keyspace's ``max_ttl`` (which also caps a longer one). A write
        without ``expiry`` clears the document's earlier one, as every write below."""
        docid, body = self._encode(docid, doc)
        check_durability(durability)
        msg = Insert(
            keyspace=self.name,
            docid=docid,
            doc=body,
            durability=durability,
            durability_timeout=check_durability_timeout(durability_timeout),
            expiry=wire_expiry(expiry, time.time()),
        )
        return self._mutate(docid, msg)

    def upsert(
        self,
        docid: str,
        doc: object,
        cas: int | None = None,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
        expiry: Expiry = None,
    ) -> MutationResult:
        """Create or overwrite; with ``cas`` the document must exist with that CAS.
        ``durability_timeout``, ``expiry``: as ``insert``'s."""
        docid, body = self._encode(docid, doc)
        check_durability(durability)
        msg = Upsert(
            keyspace=self.name,
            docid=docid,
            doc=body,
            cas=check_cas(cas),
            durability=durability,
            durability_timeout=check_durability_timeout(durability_timeout),
            expiry=wire_expiry(expiry, time.time()),
        )
        return self._mutate(docid, msg)

    def replace(
        self,
        docid: str,
        doc: object,
        cas: int | None = None,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
        expiry: Expiry = None,
    ) -> MutationResult:
        """Overwrite an existing document: DOC_NOT_FOUND if absent, CAS_MISMATCH if ``cas``
        is given and the document has changed since. ``durability_timeout``, ``expiry``:
        as ``insert``'s."""
        docid, body = self._encode(docid, doc)
        check_durability(durability)
        msg = Replace(
            keyspace=self.name,
            docid=docid,
            doc=body,
            cas=check_cas(cas),
            durability=durability,
            durability_timeout=check_durability_timeout(durability_timeout),
            expiry=wire_expiry(expiry, time.time()),
        )
        return self._mutate(docid, msg)

    def delete(
        self,
        docid: str,
        cas: int | None = None,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> MutationResult:
        """Delete (a tombstone with its own seqno); DOC_NOT_FOUND if absent.
        ``durability_timeout``: as ``insert``'s."""
        docid = check_docid(docid)
        check_durability(durability)
        msg = Delete(
            keyspace=self.name,
            docid=docid,
            cas=check_cas(cas),
            durability=durability,
            durability_timeout=check_durability_timeout(durability_timeout),
        )
        return self._mutate(docid, msg)

    def touch(
        self,
        docid: str,
        expiry: Expiry,
        cas: int | None = None,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> MutationResult:
        """Set the document's expiry (as ``insert``'s; None: never, or the keyspace's
        ``max_ttl``), its body unchanged: a new version with its own seqno and CAS.
        DOC_NOT_FOUND if absent or already expired; CAS_MISMATCH as ``replace``."""
        docid = check_docid(docid)
        check_durability(durability)
        msg = Touch(
            keyspace=self.name,
            docid=docid,
            expiry=wire_expiry(expiry, time.time()),
            cas=check_cas(cas),
            durability=durability,
            durability_timeout=check_durability_timeout(durability_timeout),
        )
        return self._mutate(docid, msg)

    def get_and_touch(
        self,
        docid: str,
        expiry: Expiry,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> VersionedDocument:
        """``touch``, then the document as it is after it, with its CAS and seqno."""
        docid = check_docid(docid)
        check_durability(durability)
        msg = GetAndTouch(
            keyspace=self.name,
            docid=docid,
            expiry=wire_expiry(expiry, time.time()),
            durability=durability,
            durability_timeout=check_durability_timeout(durability_timeout),
        )
        reply = self._write(docid, msg, GetReply)
        return VersionedDocument(msgspec.json.decode(reply.body), reply.cas, reply.seqno)

    def expiry_of(self, docid: str) -> int:
        """The document's expiry as stored: absolute epoch seconds, 0 for never;
        DOC_NOT_FOUND if absent, deleted or expired."""
        return self._get_reply(check_docid(docid), None).expiry

    def get_versioned(self, docid: str, *, replica: str | None = None) -> VersionedDocument:
        """The document with its CAS and seqno; DOC_NOT_FOUND if absent or deleted.
        ``replica="any"``: the first answer from any copy (see ``get``)."""
        docid = check_docid(docid)
        reply = self._get_reply(docid, replica)
        return VersionedDocument(msgspec.json.decode(reply.body), reply.cas, reply.seqno)

    def _get_reply(self, docid: str, replica: str | None) -> GetReply:
        router = self._rpc.router
        direct = self._direct
        if replica is None:
            msg = Get(keyspace=self.name, docid=docid)
            if direct is not None:
                reply = direct.to_owner(self.name, docid, msg, GetReply, idempotent=True)
            else:
                reply = self._rpc.run(
                    router.to_owner(self.name, docid, msg, GetReply, idempotent=True)
                )
        elif replica == "any":  # several copies at once: the loop's fan-out
            msg = Get(keyspace=self.name, docid=docid, replica=True)
            reply = self._rpc.run(router.to_any_copy(self.name, docid, msg, GetReply))
        else:
            raise BadRequest(
                f"replica must be None or 'any', got {replica!r}",
                details={"replica": repr(replica)},
            )
        return reply

    def get(self, docid: str, *, replica: str | None = None) -> dict[str, Any]:
        """The document (a dict); raises ShardexError DOC_NOT_FOUND if absent or deleted.

        ``replica="any"`` asks every copy of the document's partition at once and returns
        the first answer: available while the active copy's node is down, but possibly
        stale (a replica lags its active, and may miss writes made at durability none)."""
        return self.get_versioned(docid, replica=replica).doc

    def partition_of(self, docid: str) -> int:
        meta, _ = self._rpc.run(self._rpc.router.keyspace(self.name))
        return partition_of(check_docid(docid), meta.num_partitions)

    # --- batches ---------------------------------------------------------------------------

    def upsert_many(
        self,
        items: Iterable[tuple[str, object]],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        durability: str = "persist",
        durability_timeout: float | None = None,
        raise_errors: bool = True,
        on_chunk: Callable[[int, list[Result]], None] | None = None,
        window: int = DEFAULT_WINDOW,
        expiry: Expiry = None,
    ) -> list[Result]:
        """Upsert ``(docid, doc)`` pairs (``doc`` a dict, or JSON text/bytes of an object)
        in chunks, grouped by owner node and sent in parallel. Returns results aligned with
        the input. Items fail individually; if any failed and ``raise_errors``, raises
        ``BulkWriteError`` (code PARTIAL_FAILURE) after writing all the others.
        ``on_chunk(first_index, results)`` reports progress as chunks complete, in order.
        ``durability_timeout``, ``expiry``: each item's, as ``insert``'s; an item given as a
        ``(docid, doc, expiry)`` triple has its own expiry instead."""
        check_durability(durability)
        timeout = check_durability_timeout(durability_timeout)
        wire = wire_expiry(expiry, time.time())
        if chunk_size < 1 or window < 1:
            raise ValueError("chunk_size and window must be positive")
        rpc = self._rpc
        writer = BulkWriter(rpc.router, self.name, durability, timeout)
        if isinstance(items, list | tuple) and len(items) <= chunk_size:
            return self._upsert_one_chunk(writer, items, raise_errors, on_chunk, wire)
        rpc.run(writer.start())
        results: list[Result | None] = []
        docids: list[str] = []
        inflight: collections.deque[
            tuple[int, int, dict[int, Result], concurrent.futures.Future[dict[int, Result]]]
        ] = collections.deque()

        def drain_one() -> None:
            start, n, local, fut = inflight.popleft()
            remote = fut.result()
            chunk = [local[i] if i in local else remote[i] for i in range(start, start + n)]
            results[start : start + n] = chunk
            if on_chunk is not None:
                on_chunk(start, chunk)

        try:
            it = iter(items)
            while chunk := list(itertools.islice(it, chunk_size)):
                start = len(results)
                local, ops = self._encode_chunk(chunk, start, docids, wire)
                results.extend([None] * len(chunk))
                fut = asyncio.run_coroutine_threadsafe(writer.write_chunk(ops), rpc.loop)
                inflight.append((start, len(chunk), local, fut))
                while len(inflight) >= window:
                    drain_one()
            while inflight:
                drain_one()
        finally:
            for *_, fut in inflight:
                fut.cancel()
            rpc.run(writer.close())
        out: list[Result] = results  # type: ignore[assignment]  # every slot is filled
        if raise_errors and any(isinstance(r, ShardexError) for r in out):
            raise BulkWriteError(out, docids)
        return out

    def _encode_chunk(
        self, chunk: list[Any] | tuple[Any, ...], start: int, docids: list[str], expiry: int
    ) -> tuple[dict[int, Result], list[tuple[int, OpItem]]]:
        """Validate and encode ``chunk`` (items ``start``...): the items that failed with
        their errors, and the ``(index, OpItem)`` pairs to send."""
        local: dict[int, Result] = {}
        ops: list[tuple[int, OpItem]] = []
        for i, item in enumerate(chunk, start):
            docid: object = None
            try:
                docid, doc, own = _pair(item)
                d, body = self._encode(docid, doc)
                wire = expiry if own is _NO_EXPIRY else wire_expiry(own, time.time())
                ops.append((i, OpItem("upsert", d, body, None, wire)))
            except ShardexError as exc:
                local[i] = exc
            docids.append(docid if isinstance(docid, str) else repr(docid)[:60])
        return local, ops

    def _upsert_one_chunk(
        self,
        writer: BulkWriter,
        items: list[Any] | tuple[Any, ...],
        raise_errors: bool,
        on_chunk: Callable[[int, list[Result]], None] | None,
        expiry: int,
    ) -> list[Result]:
        """``upsert_many`` of an input that fits one chunk: one hop to the client's loop
        (``BulkWriter.write_only_chunk``) instead of start + write + close."""
        docids: list[str] = []
        local, ops = self._encode_chunk(items, 0, docids, expiry)
        # Even with nothing valid to send: an unknown keyspace raises, as with many chunks.
        remote = self._rpc.run(writer.write_only_chunk(ops))
        out = [local[i] if i in local else remote[i] for i in range(len(items))]
        if on_chunk is not None and out:
            on_chunk(0, out)
        if raise_errors and any(isinstance(r, ShardexError) for r in out):
            raise BulkWriteError(out, docids)
        return out

    # --- change streams --------------------------------------------------------------------

    def stream(
        self,
        partition: int,
        from_seqno: int = 0,
        uuid: int | None = None,
        end_seqno: int | None = None,
        *,
        follow: bool = False,
        credit: int = DEFAULT_CREDIT,
    ) -> ChangeStream:
        """Changes of ``partition`` after ``from_seqno`` in seqno order (SnapshotMarker and
        Change items), up to ``end_seqno`` / the current high seqno, or live with ``follow``.
        ``uuid`` is the branch the consumer's ``from_seqno`` belongs to (ROLLBACK if the
        partition's history does not contain it); None means "the current branch"."""
        rpc = self._rpc
        remote = RemoteStream(rpc.router, self.name, partition)
        opened = rpc.run(remote.open(from_seqno, uuid, end_seqno, follow, credit))
        return ChangeStream(remote, rpc.run, opened, from_seqno)


_NO_EXPIRY: Any = object()  # an item without its own expiry: the call's applies


def _pair(item: object) -> tuple[Any, Any, Any]:
    """(docid, doc, the item's own expiry or ``_NO_EXPIRY``)."""
    if isinstance(item, tuple | list) and len(item) == 2:
        return item[0], item[1], _NO_EXPIRY
    if isinstance(item, tuple | list) and len(item) == 3:
        return item[0], item[1], item[2]
    raise BadRequest(
        f"upsert_many wants (docid, doc) pairs or (docid, doc, expiry) triples, "
        f"got {type(item).__name__}",
        details={"item": repr(item)[:100]},
    )

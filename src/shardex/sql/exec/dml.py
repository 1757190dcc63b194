"""The writes of DELETE and UPDATE under optimistic concurrency.

The statement's derived SELECT (``statements.dml_select``, at request_plus) chooses the documents.
Between that read and the write another client may change one of them; writing back the
copy the SELECT read would silently undo that client's write (a lost update). So every
chosen document is read again with its CAS (one ``GetMany`` per owner node), the statement's
WHERE is evaluated on that version, and the write carries the CAS. A CAS_MISMATCH means a
concurrent write landed in between: the document is read again and the WHERE re-evaluated
on the newest version, the rule PostgreSQL applies in READ COMMITTED to a row updated
concurrently. A document deleted meanwhile, or no longer matching, is skipped and not
counted. A document that keeps changing for ``CAS_ATTEMPTS`` rounds ends the statement with
CAS_MISMATCH naming it (the writes already made stay: statements are not transactions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Final

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.documents import DocumentAccess

__all__ = ["CAS_ATTEMPTS", "DELETE", "SKIP", "write_checked"]

CAS_ATTEMPTS: Final = 16
DELETE: Final = object()  # ``decide`` answers this to delete the document
SKIP: Final = object()  # ``decide`` answers this when the version no longer matches

# decide(docid, current document) -> the new document, DELETE or SKIP
Decide = Callable[[str, Any], Any]


async def write_checked(
    documents: DocumentAccess,
    keyspace: str,
    docids: Sequence[str],
    decide: Decide,
    *,
    parallel: int,
    durability: str = "persist",
    durability_timeout: float | None = None,
) -> list[tuple[str, Any]]:
    """Apply ``decide`` to each document's current version under its CAS; ``(docid, doc)``
    of the documents written, in ``docids`` order (for UPDATE the new document, for DELETE
    the deleted one: what RETURNING shows)."""
    current = await documents.get_many_cas(keyspace, docids)
    sem = asyncio.Semaphore(parallel)

    async def one(docid: str) -> tuple[str, Any] | None:
        async with sem:
            version = current.get(docid)
            return await _write_one(
                documents, keyspace, docid, version, decide, durability, durability_timeout
            )

    tasks = [asyncio.ensure_future(one(d)) for d in docids]
    try:
        done = await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return [r for r in done if r is not None]


async def _write_one(
    documents: DocumentAccess,
    keyspace: str,
    docid: str,
    version: tuple[Any, int] | None,
    decide: Decide,
    durability: str,
    durability_timeout: float | None,
) -> tuple[str, Any] | None:
    for _ in range(CAS_ATTEMPTS):
        if version is None:
            return None  # deleted since the SELECT read it
        doc, cas = version
        new = decide(docid, doc)
        if new is SKIP:
            return None
        try:
            if new is DELETE:
                gone = await documents.delete(
                    keyspace,
                    docid,
                    cas=cas,
                    durability=durability,
                    durability_timeout=durability_timeout,
                )
                if gone is None:
                    return None
                return docid, doc
            await documents.replace(
                keyspace,
                docid,
                new,
                cas,
                durability=durability,
                durability_timeout=durability_timeout,
            )
            return docid, new
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return None
            if exc.code is not ErrorCode.CAS_MISMATCH:
                raise
        version = await documents.get_cas(keyspace, docid)
    raise ShardexError(
        f"document {docid!r} of {keyspace!r} changed {CAS_ATTEMPTS} times while the "
        "statement tried to write it",
        code=ErrorCode.CAS_MISMATCH,
        details={
            "keyspace": keyspace,
            "docid": docid,
            "attempts": CAS_ATTEMPTS,
            "hint": "retry the statement; another client is writing this document constantly",
        },
    )

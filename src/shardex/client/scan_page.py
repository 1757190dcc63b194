"""Paginated, elasticity-safe scans from the client: ``client.scan_page(...)``.

Each call is one request to the node the client is connected to, which acts as the elastic-scan
algorithm's proxy (``shardex.scan.paging_store_proxy``) and answers one page plus an opaque
continuation. The next page passes that continuation back, to the same node or any other
(the proxy keeps no state): no row is lost or returned twice while partitions migrate.

Rows are dicts ``{"docid": ..., "key": [...]}``: the index key parts decoded with the index's
DESC flags, or ``[docid]`` for a primary scan (``index="#primary"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from shardex.api.spans import to_user_spans
from shardex.client.rows import EntryRows, Row
from shardex.client.scan import to_wire_ts
from shardex.core.timestamp import Timestamp
from shardex.errors import ConnectionClosed, ErrorCode, NodeUnavailable, ShardexError
from shardex.scan.paging_store_spec import PageScan, PageScanReply

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession

__all__ = ["ScanPage", "scan_page"]

REPLY_MARGIN: Final = 120.0  # the proxy's own waits: shard batches, arrivals, state
_FAILOVER = (NodeUnavailable, ConnectionClosed)


@dataclass
class ScanPage:
    """One page: ``rows`` and the ``continuation`` to pass for the next one (None: the scan
    is complete). ``ts``: the stability TS every page of the scan reads (None: the tips)."""

    rows: list[Row]
    continuation: str | None
    ts: Timestamp | None = None
    entries: list[bytes] = field(default_factory=list, repr=False)  # raw, for tests and tools

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _rows(reply: PageScanReply) -> list[Row]:
    if reply.primary:
        return [{"docid": d, "key": [d]} for d in (e.decode("utf-8") for e in reply.entries)]
    # The scan client's block decoder (``client/rows.py``): a page's entries are one block
    # (unordered pages concatenate shards; it checks each run it takes).
    return EntryRows(reply.desc, covering=True).of(reply.entries)


def build_page_request(
    keyspace: str,
    index: str,
    spans: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None,
    consistency: str,
    page_size: int,
    continuation: str | None,
    *,
    at: Any,
    stability: str | None,
    ordered: bool,
    timeout: float,
) -> PageScan:
    for name, value in (("keyspace", keyspace), ("index", index)):
        if not isinstance(value, str) or not value:
            raise ShardexError(
                f"{name} must be a non-empty string, got {value!r:.80}",
                code=ErrorCode.BAD_REQUEST,
                details={name: repr(value)[:200]},
            )
    if continuation is not None and not isinstance(continuation, str):
        raise ShardexError(
            f"continuation must be the string a previous page returned, got {continuation!r:.80}",
            code=ErrorCode.BAD_REQUEST,
            details={"continuation": repr(continuation)[:200], "hint": "or None to start"},
        )
    return PageScan(
        keyspace=keyspace,
        index=index,
        page_size=page_size,
        spans=to_user_spans(spans),
        consistency=consistency,
        stability=stability,
        at=None if at is None else to_wire_ts(at),
        continuation=continuation,
        ordered=bool(ordered),
        timeout=timeout,
    )


async def _request(rpc: RpcSession, msg: PageScan) -> PageScanReply:
    """The page from the connected node; once more from the next node if that one is gone
    (a page is stateless on the node side, so asking again is harmless)."""
    wait = msg.timeout + REPLY_MARGIN
    conn = await rpc.connection()
    try:
        return await conn.request(msg, wait, expect=PageScanReply)
    except _FAILOVER:
        conn = await rpc.connection(failed=conn)
    return await conn.request(msg, wait, expect=PageScanReply)


def scan_page(rpc: RpcSession, msg: PageScan) -> ScanPage:
    reply = rpc.run(_request(rpc, msg))
    return ScanPage(
        rows=_rows(reply),
        continuation=reply.continuation,
        ts=None if reply.ts is None else Timestamp.from_wire(reply.ts),
        entries=list(reply.entries),
    )

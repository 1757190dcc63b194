"""A blocking socket from one calling thread to one node: the direct scans' connection.

The sync client's loop path hands every scan to its event-loop thread and back: two
wake-ups, the send from another thread, context switches and cold caches per scan, most of
the client's CPU outside the rows (docs/decisions/0059-client-cpu-outside-rows.md).
A ``DirectConn`` lets the calling thread talk to the node itself. Its wire protocol - frames,
envelopes, the HMAC handshake - is ``shardex.net.blocking.BlockingConn``'s, the loop's own
code in blocking form; this adds what a scan socket needs: scan ids, the stream it carries,
and the cancels another thread left for it.

A node's one-way frames for a scan this socket no longer reads (one the caller abandoned, or
cancelled) are skipped by scan id, late replies by request id (``client/direct_scan.py``).
"""

from __future__ import annotations

import socket
from collections import deque

from shardex.net.blocking import BlockingConn

__all__ = ["DirectConn"]


class DirectConn(BlockingConn):
    """One node's socket in one thread, carrying one scan's stream at a time."""

    __slots__ = ("_next_scan", "busy", "pending_cancels")

    def __init__(self, sock: socket.socket, address: str, peer: str, max_frame: int) -> None:
        super().__init__(sock, address, peer, max_frame)  # address: the scan targets' key
        self._next_scan = 1  # scan ids: one per scan on this socket, never reused
        # The scan whose stream this socket carries (its blocks not all read), if any: a
        # scan started meanwhile on this thread goes elsewhere (nested scans).
        self.busy: object | None = None
        # Scans abandoned by another thread (a result dropped there): cancelled by the
        # owner before its next request, so only the owner ever writes.
        self.pending_cancels: deque[int] = deque()

    def new_scan_id(self) -> int:
        sid = self._next_scan
        self._next_scan = sid + 1
        return sid

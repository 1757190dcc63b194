"""Blocking sockets from each calling thread to the nodes: direct scans' and direct
document requests' connections (``DirectConn``, and ``DirectConns``: one per thread and node).

The sync client's loop path hands every scan to its event-loop thread and back: two
wake-ups, the send from another thread, context switches and cold caches per scan, most of
the client's CPU outside the rows (docs/decisions/0059-client-cpu-outside-rows.md).
A ``DirectConn`` lets the calling thread talk to the node itself. Its wire protocol - frames,
envelopes, the HMAC handshake - is ``shardex.net.blocking.BlockingConn``'s, the loop's own
code in blocking form; this adds what a scan socket needs: scan ids, the stream it carries,
and the cancels another thread left for it.

A node's one-way frames for a scan this socket no longer reads (one the caller abandoned, or
cancelled) are skipped by scan id, late replies by request id (``client/direct_scan.py``).
A thread's socket to a node serves its scans and its single-document requests
(``client/direct_kv.py``) in turn; one that carries a scan's stream is left alone.
"""

from __future__ import annotations

import socket
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING

from shardex.api.scan import CancelScan
from shardex.client.rpc_session import client_closed
from shardex.net.blocking import BlockingConn
from shardex.net.tcp import TcpTransport

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession

__all__ = ["DirectConn", "DirectConns"]


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

    def send_pending_cancels(self) -> None:
        """Cancel the scans another thread abandoned on this socket (before its next
        request, from the owner: only the owner ever writes)."""
        cancels = self.pending_cancels
        while cancels:
            self.send(CancelScan(scan_id=cancels.popleft()), 0)

    def new_scan_id(self) -> int:
        sid = self._next_scan
        self._next_scan = sid + 1
        return sid


class DirectConns:
    """A client's calling-thread sockets: per thread, per node address, opened on first use;
    every one also in a set that ``close`` (from any thread) shuts down."""

    def __init__(self, rpc: RpcSession) -> None:
        self._rpc = rpc
        self._local = threading.local()
        self._lock = threading.Lock()
        # Weak: a thread that ends drops its sockets (its thread-local dict goes with it).
        self._all: weakref.WeakSet[DirectConn] = weakref.WeakSet()
        self._closed = False
        # What the nodes call these connections: the loop path's scan-pool name, which they
        # had when they carried only scans (tests and logs look for it).
        self.name = f"{rpc.name}/scan"

    def mine(self) -> dict[str, DirectConn]:
        """The calling thread's sockets by address."""
        try:
            conns: dict[str, DirectConn] = self._local.conns
        except AttributeError:
            conns = self._local.conns = {}
        return conns

    def connect(self, conns: dict[str, DirectConn], address: str) -> DirectConn:
        """A new socket to ``address`` in ``conns`` (the calling thread's), replacing the one
        there; the errors of ``BlockingConn.open``, "client is closed" once it is."""
        rpc = self._rpc
        transport = rpc.transport
        conn = DirectConn.open(
            address,
            rpc.secret,
            name=self.name,
            timeout=rpc.connect_timeout,
            max_frame=transport.max_frame,
            nonce=transport.nonce,
            # the loop's TLS settings: the same CA (and certificate, in a node's process)
            tls=transport.tls if isinstance(transport, TcpTransport) else None,
        )
        with self._lock:
            if self._closed:
                conn.close()
                raise client_closed()
            self._all.add(conn)
        old = conns.get(address)
        if old is not None:
            old.close()
        conns[address] = conn
        return conn

    def close(self) -> None:
        """Close every socket of every thread (from any thread): readers blocked on one
        wake up with an error. Idempotent."""
        with self._lock:
            self._closed = True
            conns = list(self._all)
            self._all.clear()
        for conn in conns:
            conn.close()

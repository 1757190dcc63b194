"""Single-document requests over a blocking socket in the calling thread: the sync client's
default path for ``get`` (of the active copy), ``insert``, ``upsert``, ``replace``, ``delete``.

The loop path hands each request to the client's event-loop thread and back: two wake-ups,
a send from another thread and context switches, ~0.15 ms of client CPU per request, more
than the request itself (docs/decisions/0088-documents-in-the-calling-thread.md). Here the
calling thread sends the very message the loop path sends to the owner its router's cached
topology names, on its own socket to that node (``DirectConns``, shared with direct scans),
and reads the reply itself.

Routing and retries stay the loop path's (``DataRouter.to_owner``); this path makes only a
first attempt, and hands the request to the loop for everything that needs more:
* no cached topology for the keyspace (or no address for its owner): the loop fetches it;
* the owner's refusals the loop retries (NOT_MY_PARTITION, NODE_FAILED_OVER,
  KEYSPACE_NOT_FOUND) and, for a read, any failure it retries (``routing.rerouted``): the
  loop carries on from its second attempt (``to_owner(after=...)``), refreshing first;
* no connection to the owner (the connect fails, or the socket is found closed before the
  request goes out): nothing was sent, so the loop may send it;
* this thread's socket to the owner carries a scan's stream the caller still reads.

A write whose socket ends after it was sent raises CONNECTION_CLOSED and one that gets no
reply in time ``RequestTimeout``, as on the loop path (which never resends a write: it may
have been applied). Errors keep the loop path's words (``BlockingConn.reply``).
Clients on any other transport than TCP, and those built with ``direct_kv=False``, use the
loop path for every request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from shardex.client.routing import rerouted
from shardex.client.rpc_session import client_closed
from shardex.errors import ConnectionClosed, ErrorCode, ShardexError
from shardex.net.messages import Kind, Message

if TYPE_CHECKING:
    from shardex.client.direct_conn import DirectConn, DirectConns
    from shardex.client.rpc_session import RpcSession

__all__ = ["DirectKV"]

M = TypeVar("M", bound=Message)


class DirectKV:
    """A client's single-document requests from the calling thread (thread-safe: each
    thread uses its own sockets)."""

    def __init__(self, rpc: RpcSession, conns: DirectConns) -> None:
        self._rpc = rpc
        self._sockets = conns
        self.sent = 0  # requests answered over a calling thread's socket (tests watch it)

    def to_owner(
        self,
        keyspace: str,
        docid: str,
        msg: Message,
        expect: type[M],
        *,
        idempotent: bool,
        timeout: float | None = None,
    ) -> M:
        """``DataRouter.to_owner``'s answer to ``msg``, from the calling thread when the
        cached topology allows, else (or to retry) through the loop. ``timeout``: seconds
        for each reply (None: the router's ``request_timeout``)."""
        rpc = self._rpc
        if rpc.closed:
            raise client_closed()
        router = rpc.router
        address = router.owner_address(keyspace, docid)
        if address is None:
            return rpc.run(
                router.to_owner(
                    keyspace, docid, msg, expect, idempotent=idempotent, timeout=timeout
                )
            )
        try:
            reply = self._request(address, msg, expect, timeout)
        except _Unsent as unsent:  # the loop's turn, from its first attempt
            after = unsent.error
            coro = router.to_owner(
                keyspace, docid, msg, expect, idempotent=idempotent, after=after, timeout=timeout
            )
            return rpc.run(coro)
        except ShardexError as exc:
            if rpc.closed:
                raise client_closed() from None
            if not rerouted(exc.code, idempotent=idempotent):
                router.suspect(exc)
                raise
            # Refused (nothing applied), or a read: the loop's next attempt, refreshed.
            coro = router.to_owner(
                keyspace, docid, msg, expect, idempotent=idempotent, after=exc, timeout=timeout
            )
            return rpc.run(coro)
        self.sent += 1
        return reply

    def _request(self, address: str, msg: Message, expect: type[M], timeout: float | None) -> M:
        """Send ``msg`` on this thread's socket to ``address`` and read its reply. Raises
        ``_Unsent`` when it was not sent (no connection, a socket busy with a scan)."""
        sockets = self._sockets
        conns = sockets.mine()
        conn: DirectConn | None = conns.get(address)
        if conn is not None and conn.busy is not None:
            raise _Unsent(None)  # it carries a scan the caller still reads
        if conn is None or conn.peer_gone():
            try:
                conn = sockets.connect(conns, address)
            except ShardexError as exc:
                # NodeUnavailable: the loop's own first failure, it retries from there. An
                # AuthFailed and the like the loop meets again and raises as it does.
                unsent = exc.code is ErrorCode.NODE_UNAVAILABLE
                raise _Unsent(exc if unsent else None) from exc
        try:
            conn.send_pending_cancels()
            rid = conn.new_request_id()
            conn.send(msg, rid, Kind.REQUEST)
        except ConnectionClosed as exc:
            # ``sendall`` failed: the node has no whole frame, so nothing was applied.
            raise _Unsent(None) from exc
        if timeout is None:
            timeout = self._rpc.router.request_timeout
        return conn.reply(rid, msg, timeout, expect)


class _Unsent(Exception):
    """The request never left: the loop path sends it (``error``: the failure to count as
    its first attempt, None to start afresh)."""

    def __init__(self, error: ShardexError | None) -> None:
        super().__init__()
        self.error = error

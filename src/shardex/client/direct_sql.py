"""SQL statements over a blocking socket in the calling thread: the sync client's default.

``client.query`` sends a statement here first, as ``client.scan`` does a scan
(``direct_scan.py``): the calling thread's socket to the node the statement goes to (its
routing hint, else the client's node, then the next ones) carries the ``SqlQuery``, its
``SqlStarted`` reply with the first block of rows, and any later rows as the scan streams'
``ScanBlock``s with their credits, which ``QueryRows`` reads from the iterating thread. No
hand-off to the client's event-loop thread: for a point query that hand-off was most of the
client's CPU per statement.

What stays on the loop path (``start`` returns None): a statement started while a stream of
this thread still runs on the socket it would use (nested reads), clients on other
transports, and clients built with ``direct_scans=False``. Failover is the loop path's:
NodeUnavailable or ConnectionClosed before the reply tries the next address; the node
answers nothing for a statement it never received, and one it received is not sent again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.client.direct_scan import DirectStream, open_on, open_stream
from shardex.client.rpc_session import client_closed
from shardex.client.scan import FAILOVER
from shardex.errors import ShardexError

if TYPE_CHECKING:
    from shardex.client.direct_conn import DirectConn, DirectConns
    from shardex.client.rpc_session import RpcSession

__all__ = ["DirectSql"]


class DirectSql:
    def __init__(self, rpc: RpcSession, conns: DirectConns) -> None:
        self._rpc = rpc
        self._sockets = conns

    def preconnect(self, address: str) -> None:
        """Open the calling thread's socket to ``address`` unless it has one."""
        conns = self._sockets.mine()
        conn = conns.get(address)
        if conn is None or conn.closed:
            self._sockets.connect(conns, address)

    def start(
        self, msg: SqlQuery, order: list[str], timeout: float
    ) -> tuple[SqlStarted, DirectStream, str] | None:
        """Send ``msg`` to the first address of ``order`` that answers: its reply, the
        stream of its rows and the address; None when it must take the loop path."""
        rpc = self._rpc
        if rpc.closed:
            raise client_closed()
        conns = self._sockets.mine()
        last: ShardexError | None = None
        for address in order:
            conn = conns.get(address)
            if conn is not None and conn.busy is not None:
                return None  # this socket streams rows the caller still reads
            try:
                started, stream = open_on(
                    self._sockets, conns, address, conn, lambda c: self._send(c, msg, timeout)
                )
            except FAILOVER as exc:
                if rpc.closed:
                    raise client_closed() from None
                last = exc
                continue
            return started, stream, address
        assert last is not None
        raise last

    def _send(
        self, conn: DirectConn, msg: SqlQuery, timeout: float
    ) -> tuple[SqlStarted, DirectStream]:
        return open_stream(
            self._rpc,
            conn,
            lambda sid: msgspec.structs.replace(msg, stream_id=sid),
            SqlStarted,
            _head,
            timeout,
        )


def _head(reply: SqlStarted) -> tuple[list[bytes] | None, bool]:
    return reply.rows, reply.done

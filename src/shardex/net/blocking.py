"""A blocking, authenticated connection: one socket, owned by one thread, no event loop.

For a caller that talks to a node from its own thread (the sync client's scans,
``shardex.client.direct_conn``): handing every exchange to an event-loop thread costs two
wake-ups, a send from another thread and context switches per exchange, more than the
exchange itself (docs/decisions/0068-scans-in-the-calling-thread.md). It speaks the loop's protocol
with the loop's code: frames as ``framing.py`` cuts them, ``Envelope``s as ``messages.py``
encodes them, the handshake's steps as ``auth.ClientHandshake`` takes them.

What it never does: run handlers. A ``Ping`` request is answered, an ERROR notice before a
hang-up kept for the error that follows, a one-way frame of a type this side does not know
dropped; everything else is the caller's, one envelope at a time (``read``). ``close`` may
come from any thread: it shuts the socket down, which wakes a reader blocked in ``recv``.

With a ``TlsConfig`` the connection is TLS, verified as the loop's transport verifies
(``shardex.net.tls``); failures read the same. TLS runs in memory (an ``ssl.SSLObject``
between two ``MemoryBIO``s) over the same plain socket, not as an ``ssl.SSLSocket``: an
SSLSocket cannot be bounded by ``SO_RCVTIMEO`` (its read retries the blocking socket's
EAGAIN for good), and a socket timeout makes each exchange a switch to non-blocking mode
and back, a failed read and a poll before the read and a poll before the send, and OpenSSL
reads each record's header and body in two calls: eight system calls per request and reply
where plaintext makes two. In memory, TLS makes the same two (one ``send`` of the encrypted
request, one ``recv`` of whatever records arrived) with the same kernel deadlines.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Final, Self, TypeVar

from shardex.errors import (
    AuthFailed,
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    RequestTimeout,
    ShardexError,
)
from shardex.net.auth import ClientHandshake
from shardex.net.credentials import Credentials
from shardex.net.framing import HEADER, announced_too_large, header
from shardex.net.messages import (
    Envelope,
    ErrorReply,
    Kind,
    Message,
    Ping,
    Pong,
    UndecodableBody,
    decode_frame,
    encode_frame,
    message_type_name,
)
from shardex.net.tls import TlsConfig, cert_refused, records, tls_failure
from shardex.net.transport import connect_failed, split_address

__all__ = ["BlockingConn"]

M = TypeVar("M", bound=Message)

# One recv takes a whole 100-row reply (~5-10 KB), or several blocks. Into a buffer kept per
# socket: ``recv(n)`` would allocate n bytes per call and then shrink them.
_RECV: Final = 64 * 1024
_PEEK: Final = socket.MSG_PEEK | socket.MSG_DONTWAIT
# The most a TLS record's payload holds (TLS 1.3: 2^14 bytes).
_TLS_RECORD: Final = 16 * 1024


def _timeval(seconds: float) -> bytes:
    usec = max(int(seconds * 1e6), 1000)
    return struct.pack("@ll", usec // 1_000_000, usec % 1_000_000)


class BlockingConn:
    """One node's socket in one thread: frames in and out, blocking, with deadlines."""

    __slots__ = (
        "__weakref__",  # a client may keep every thread's sockets in a weak set
        "_buf",
        "_closed_by",
        "_fresh",
        "_max_frame",
        "_next_id",
        "_notice",
        "_rbuf",
        "_rcvtimeo",
        "_sock",
        "_tls",
        "_tls_in",
        "_tls_out",
        "address",
        "peer",
        "peer_label",
    )

    def __init__(self, sock: socket.socket, address: str, peer: str, max_frame: int) -> None:
        self._sock = sock
        self.address = address  # as configured
        self.peer = peer  # host:port as the loop path's comm names it
        self.peer_label = peer  # name@peer once the handshake named the node
        self._max_frame = max_frame
        self._buf = bytearray()
        self._rbuf = memoryview(bytearray(_RECV))
        self._rcvtimeo = 0.0  # SO_RCVTIMEO's setting (0: none yet)
        self._next_id = 1  # request ids, as a ``Connection`` numbers them
        self._closed_by: str | None = None  # why it closed ("locally", "by peer", ...)
        self._notice: ErrorReply | None = None  # what the node said before hanging up
        # TLS in memory (``open`` sets them): records received go in ``_tls_in``, records to
        # send come out of ``_tls_out``; None in clear.
        self._tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None
        self._tls_out: ssl.MemoryBIO | None = None
        # Nothing received yet over a TLS socket that presented our certificate: a close now
        # is the server refusing the certificate (``tls.cert_refused``).
        self._fresh = False  # set by ``open``

    @classmethod
    def open(
        cls,
        address: str,
        secret: str | Credentials,
        *,
        name: str,
        timeout: float,
        max_frame: int,
        nonce: Callable[[int], bytes],
        tls: TlsConfig | None = None,
    ) -> Self:
        """Connect (over TLS with ``tls``) and authenticate (both ways) within ``timeout``;
        the errors of ``shardex.net.connect``: ``NodeUnavailable``, ``AuthFailed``,
        ``ProtocolError``."""
        hs = ClientHandshake(secret, name=name, peer=address, nonce_source=nonce)
        host, port = split_address(address)
        deadline = time.monotonic() + timeout
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:  # refused, unreachable, or timed out (TimeoutError)
            raise connect_failed(address, timeout, e) from e
        session = _tls_handshake(sock, tls, address, host, timeout) if tls is not None else None
        # Request/response on small frames: never wait for Nagle.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking from here on: deadlines are the kernel's (``_set_rcvtimeo``); a send
        # that cannot complete (a node that stopped reading) gives up after ``timeout``.
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))
        peername = sock.getpeername()
        conn = cls(sock, address, f"{peername[0]}:{peername[1]}", max_frame)
        if session is not None:
            obj, conn._tls_in, conn._tls_out = session
            conn._tls = records(obj)
        conn._fresh = tls is not None and tls.is_node
        hs.peer = conn.peer
        try:
            out: Message | None = hs.answer(conn._message(deadline))
            while out is not None:
                conn.send(out, 0)
                out = hs.next(conn._message(deadline))
            server_name = hs.server_name
        except (TimeoutError, ShardexError) as e:
            conn.close()
            failure = hs.failed(e, timeout)
            if failure is e:
                raise
            raise failure from (None if isinstance(e, TimeoutError) else e)
        except BaseException:
            conn.close()
            raise
        conn.peer_label = f"{server_name}@{conn.peer}"
        return conn

    def _message(self, deadline: float) -> Message:
        """One handshake frame's body (kind ONEWAY, or ERROR for a refusal; id 0), as
        ``net/auth.py`` reads it: a refusal is the answer, not a notice to keep."""
        return decode_frame(self._frame(deadline)).body

    def new_request_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1
        return rid

    # -- frames --

    @property
    def closed(self) -> bool:
        return self._closed_by is not None

    def send(self, msg: Message, rid: int, kind: Kind = Kind.ONEWAY) -> None:
        """Send one envelope (``rid`` 0 for one-way)."""
        self.send_frame(encode_frame(Envelope(kind, rid, msg)), msg)

    def send_frame(self, frame: bytes, msg: Message | None = None) -> None:
        """Send one encoded envelope; ``ConnectionClosed`` if the socket is gone."""
        if len(frame) > self._max_frame:
            name = message_type_name(msg) if msg is not None else "frame"
            raise FrameTooLarge(
                f"{name} encodes to {len(frame)} bytes, over max_frame {self._max_frame}",
                details={"type": name, "size": len(frame), "max_frame": self._max_frame},
            )
        if self._closed_by is not None:
            raise self.closed_error()
        # Header and payload in one call: NODELAY would send them as two segments.
        data = header(len(frame)) + frame
        try:
            if self._tls is not None:
                assert self._tls_out is not None
                self._tls.write(data)  # into the outgoing BIO: all of it, as records
                data = self._tls_out.read()
            self._sock.sendall(data)
        except OSError as e:  # ssl.SSLError is one
            self._lost(f"lost: {e}")
            raise self.closed_error() from None

    def read(self, deadline: float) -> Envelope:
        """The next envelope, waiting until ``deadline`` (``time.monotonic``): raises
        ``TimeoutError`` past it (a partial frame stays buffered: the socket stays usable),
        ``ConnectionClosed`` when the socket ends, ``ProtocolError`` (and closes) for a frame
        that breaks the protocol. A ``Ping`` request is answered here."""
        while True:
            frame = self._frame(deadline)
            try:
                env = decode_frame(frame)
            except UndecodableBody as e:
                if e.kind in (Kind.RESPONSE, Kind.ERROR):
                    raise  # the answer to this socket's one request: its waiter's error
                continue  # a one-way frame of a type this side does not know: dropped
            except ProtocolError as e:
                self.close()
                self._closed_by = f"closed: {e.message}"
                raise
            if env.kind is Kind.REQUEST and type(env.body) is Ping:
                self.send(Pong(payload=env.body.payload), env.id, Kind.RESPONSE)
                continue
            if env.kind is Kind.ERROR and env.id == 0 and isinstance(env.body, ErrorReply):
                self._notice = env.body  # the node says why it is about to hang up
                continue
            return env

    def reply(self, rid: int, msg: Message, timeout: float, expect: type[M]) -> M:
        """The response to request ``rid`` (``msg``, sent on this socket), waiting up to
        ``timeout`` seconds; the outcomes and words of the loop's ``Connection.request``:
        the node's error, ``RequestTimeout`` (a late reply is skipped by the next call),
        ``ConnectionClosed`` if the socket ends first, ``ProtocolError`` for a reply that is
        not an ``expect``. One-way frames and other requests' replies are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                env = self.read(deadline)
            except TimeoutError:
                name = message_type_name(msg)
                raise RequestTimeout(
                    f"{name} to {self.peer_label} timed out after {timeout}s",
                    details={"type": name, "peer": self.peer_label, "timeout": timeout},
                ) from None
            except ConnectionClosed as e:
                raise self._lost_request(message_type_name(msg), e) from None
            if env.id != rid or env.kind is Kind.REQUEST:
                continue  # one-way (id 0), or the late reply of a request given up on
            body = env.body
            if env.kind is Kind.ERROR:
                if isinstance(body, ErrorReply):
                    raise ShardexError.from_wire(body.code, body.message, body.details)
                raise ProtocolError(
                    f"{self.peer_label} sent an error of type {message_type_name(body)}",
                    details={"type": message_type_name(msg)},
                )
            if not isinstance(body, expect):
                name = message_type_name(msg)
                raise ProtocolError(
                    f"{self.peer_label} answered {name} with {message_type_name(body)}, "
                    f"expected {expect.__name__}",
                    details={"type": name, "got": message_type_name(body)},
                )
            return body

    def _lost_request(self, type_name: str, reason: ConnectionClosed) -> ConnectionClosed:
        """What the loop's ``Connection`` raises for a request whose connection ended before
        its reply (``Connection._closed_error``)."""
        details = {"type": type_name, "peer": self.peer_label}
        if "notice" in reason.details:
            details["notice"] = reason.details["notice"]
        return ConnectionClosed(
            f"{type_name}: connection to {self.peer_label} is closed ({reason.message})",
            details=details,
        )

    def peer_gone(self) -> bool:
        """Whether this idle socket has ended (the node hung up: it restarted, or dropped
        the connection), found without waiting: one non-blocking peek. A request about to
        be sent on it could not have been applied, so the caller may open another; bytes
        waiting (a late reply, a ping) are not an end and stay for ``read``."""
        if self._closed_by is not None:
            return True
        try:
            n = self._sock.recv_into(self._rbuf, 1, _PEEK)
        except BlockingIOError:
            return False  # nothing waiting: the usual case
        except OSError as e:
            self._lost(f"lost: {e}")
            return True
        if not n:
            self._lost("closed by peer")
            return True
        if self._tls is not None:
            return self._tls_peer_gone()
        return False

    def _tls_peer_gone(self) -> bool:
        """``peer_gone`` over TLS with bytes waiting: they are records - data, session
        tickets, or the peer's close_notify - so they are read (they are there: no wait)
        and decrypted: data is kept for ``read``, a close_notify is an end."""
        try:
            n = self._sock.recv_into(self._rbuf, 0, socket.MSG_DONTWAIT)
            if not n:
                self._lost("closed by peer")
                return True
            return not self._decrypt(n)
        except BlockingIOError:
            return False
        except OSError as e:
            self._lost(f"lost: {e}")
            return True

    def _frame(self, deadline: float) -> bytes:
        buf = self._buf
        while True:
            if len(buf) >= HEADER:
                size = int.from_bytes(buf[:HEADER], "big")
                if size > self._max_frame:
                    self.close()
                    self._closed_by = "closed: frame too large"
                    raise announced_too_large(self.peer, size, self._max_frame)
                end = HEADER + size
                if len(buf) >= end:
                    frame = bytes(buf[HEADER:end])
                    del buf[:end]  # a bytearray drops its head without moving the rest
                    return frame
            self._recv(deadline)

    def _set_rcvtimeo(self, seconds: float) -> None:
        """Bound the next ``recv`` calls by the kernel (``SO_RCVTIMEO``), not by Python's
        socket timeout: that one makes every ``recv`` and ``send`` a ``poll`` first, two
        system calls each. A scan's waits are mostly of one length, so this is set about
        once per socket."""
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
        self._rcvtimeo = seconds

    def _recv(self, deadline: float) -> None:
        """Receive what has arrived (waiting for at least one byte) into ``_buf``: over
        TLS, what it decrypts to, possibly nothing (a session ticket, half a record)."""
        if self._closed_by is not None:
            raise self.closed_error()
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        cur = self._rcvtimeo
        if abs(left - cur) > 0.02 * cur + 0.01:  # else the last setting is close enough
            self._set_rcvtimeo(left)
        try:
            n = self._sock.recv_into(self._rbuf)
            if n and self._tls is not None and not self._decrypt(n):
                n = 0  # the peer's close_notify: the end of the stream, as below
        except BlockingIOError:
            raise TimeoutError from None  # SO_RCVTIMEO ran out (EAGAIN, blocking socket)
        except OSError as e:
            refused = tls_failure(self.peer, e) if self._tls is not None else None
            if self._closed_by is None:
                self._lost(f"lost: {e}")
            if self._fresh:
                refused = cert_refused(self.peer)
            if isinstance(refused, AuthFailed):
                raise refused from None  # the node refused our certificate: say why
            raise self.closed_error() from None
        if not n:
            if self._closed_by is None:
                self._lost("closed by peer")
            if self._fresh:
                raise cert_refused(self.peer)
            raise self.closed_error()
        self._fresh = False
        if self._tls is None:
            self._buf += self._rbuf[:n]

    def _decrypt(self, n: int) -> bool:
        """Feed the ``n`` bytes received into ``_rbuf`` to TLS and append what they
        decrypt to ``_buf``; False if the peer closed TLS (close_notify: marked lost).
        ``ssl.SSLError`` for a record that does not decrypt, or an alert."""
        tls, tls_in = self._tls, self._tls_in
        assert tls is not None and tls_in is not None
        tls_in.write(self._rbuf[:n])
        buf = self._buf
        # A read returns one record's bytes (``bytes`` of their size: cheaper than a view
        # of a buffer of ours). Nothing decrypted is left in the TLS object after a read
        # of a whole record's size, so a read is due only while bytes wait in ``tls_in``
        # (checked first: a read that finds no whole record raises, which costs more).
        while tls_in.pending:
            try:
                plain = tls.read(_TLS_RECORD)
            except ssl.SSLWantReadError:
                break  # the rest of a record is still on its way
            if not plain:
                self._lost("closed by peer")
                return False
            buf += plain
        return True

    # -- ending --

    def closed_error(self) -> ConnectionClosed:
        """What a read or write on the closed socket raises: the loop path's words for a
        connection that ended (``connection to <peer> closed by peer`` ...)."""
        how = self._closed_by or "closed"
        details = {"peer": self.peer}
        message = f"connection to {self.peer} {how}"
        n = self._notice
        if n is not None:
            message = f"{message} after notice {n.code}: {n.message}"
            details["notice"] = n.code
        return ConnectionClosed(message, details=details)

    def _lost(self, how: str) -> None:
        self._closed_by = how
        with contextlib.suppress(OSError):
            self._sock.close()

    def close(self) -> None:
        """Close at once; from any thread. A reader blocked in ``recv`` wakes up (the
        shutdown) and raises ``ConnectionClosed``. Idempotent."""
        if self._closed_by is None:
            self._closed_by = "closed locally"
        with contextlib.suppress(OSError):
            # The plain socket's shutdown, also for an SSLSocket: its own drops its TLS
            # state, which a reader in another thread may still be using.
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __del__(self) -> None:
        # A thread that ended drops its sockets with its thread-local dict: close quietly
        # (no ResourceWarning for a socket that simply outlived its use).
        with contextlib.suppress(Exception):
            self._sock.close()


# A TLS session in memory: the SSLObject, and its incoming and outgoing BIOs.
_Tls = tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]


def _tls_handshake(
    sock: socket.socket, tls: TlsConfig, address: str, host: str, timeout: float
) -> _Tls:
    """A TLS handshake with the server at ``address`` over ``sock`` (its timeout bounds each
    wait; certificate verified against the cluster CA, its SANs against ``host``); the
    socket is closed on failure."""
    tls_in, tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    try:
        obj = tls.client_context().wrap_bio(tls_in, tls_out, server_hostname=host)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if tls_out.pending:
                    sock.sendall(tls_out.read())
                data = sock.recv(_RECV)
                if not data:
                    raise ssl.SSLEOFError(
                        ssl.SSL_ERROR_EOF, "EOF occurred in violation of protocol"
                    ) from None
                tls_in.write(data)
        if tls_out.pending:
            sock.sendall(tls_out.read())  # our Finished (and certificate, if any)
    except OSError as e:  # ssl.SSLError, a reset, or the handshake's timeout
        sock.close()
        failure = tls_failure(address, e)
        if failure is not None:
            raise failure from e
        raise connect_failed(address, timeout, e) from e
    return obj, tls_in, tls_out

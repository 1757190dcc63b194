"""The symmetric connection: request/response and one-way messages over any ``Comm``.

A ``Connection`` is symmetric: once authenticated, either side may send requests and one-way
messages, and either side may route incoming ones to handlers. That lets a node stream
batches or notifications back over the connection a peer opened, instead of dialling back.

Handlers: ``async def handler(msg, conn) -> Message | None``.
- For a request, the return value is the response (``None`` sends ``Ack``); a raised
  ``ShardexError`` becomes an ``ErrorReply`` with its code/message/details; any other exception
  is logged with its traceback and answered with INTERNAL. Each request runs in its own task,
  so a slow handler never blocks other requests on the connection.
- One-way messages on one connection are handled one at a time, in arrival order, by a
  worker task (not the reader, so a one-way handler may itself make requests on the same
  connection without deadlocking).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any, TypeVar, overload

from shardex.errors import (
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    RequestTimeout,
    ShardexError,
)
from shardex.net.credentials import Authorizer, Principal, UserDirectory
from shardex.net.deadlines import DeadlineSweep, Pending
from shardex.net.gate import UserGate
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
from shardex.net.responder import Responder
from shardex.net.router import Handler, Router, as_router
from shardex.net.transport import Comm

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "CloseCallback",
    "Connection",
    "Handler",
    "Router",
    "as_router",
]

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 30.0
# How long a best-effort notice (the reason we are hanging up) may delay a close.
_NOTICE_TIMEOUT = 1.0

M = TypeVar("M", bound=Message)
CloseCallback = Callable[["Connection"], None]


class Connection:
    """One authenticated, symmetric connection. Build with ``connect`` or get it from
    ``RpcServer`` handlers; never construct directly outside this package."""

    def __init__(
        self,
        comm: Comm,
        *,
        name: str,
        peer_name: str,
        router: Router | None = None,
        max_frame: int,
        principal: Principal | None = None,
        authorizer: Authorizer | None = None,
        users: UserDirectory | None = None,
    ) -> None:
        self._comm = comm
        self.name = name
        self.peer_name = peer_name
        # Who the peer authenticated as (None: we dialled it, and it proved the node secret).
        self.principal = principal
        # Checked before any handler runs on what a user sends; a node may send anything.
        self._gate = (
            UserGate(authorizer, users)
            if authorizer is not None and principal is not None and not principal.is_node
            else None
        )
        self._router = router if router is not None else Router()
        self._max_frame = max_frame
        self._loop = asyncio.get_running_loop()
        self._next_id = 1
        self._pending: dict[int, Pending] = {}
        # One timer for every pending request's deadline (``deadlines.py``).
        self._deadlines = DeadlineSweep(self._loop, lambda: self._pending, self._timed_out)
        self._write_lock = asyncio.Lock()
        # Handler tasks by a key of ours, insertion-ordered (cancelling in a stable order keeps
        # simulation runs replayable); a request handler removes its own entry when it ends,
        # so a request costs no done-callback round.
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._task_seq = 0
        # One-way messages waiting for the worker, and the worker's wait when there are none
        # (a deque and one future: asyncio.Queue costs more per message).
        self._oneway: collections.deque[Message] = collections.deque()
        self._oneway_wakeup: asyncio.Future[None] | None = None
        self._oneway_task: asyncio.Task[None] | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._started = False
        # Sends the notice and closes the comm after a push-mode receive ended the connection.
        self._closer_task: asyncio.Task[None] | None = None
        self._closed = False
        self._close_reason: ShardexError | None = None
        self._peer_notice: ErrorReply | None = None
        self._closed_event = asyncio.Event()
        self._close_callbacks: list[CloseCallback] = []
        self._responder = Responder(
            self,
            router=self._router,
            comm=comm,
            max_frame=max_frame,
            write_lock=self._write_lock,
            tasks=self._tasks,
            write=self._write,
            encode=self._encode,
            spawn=self._spawn,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Connection {self.name} -> {self.peer_label} {state}>"

    # --- properties -------------------------------------------------------------------

    @property
    def peer_address(self) -> str:
        return self._comm.peer_address

    @property
    def local_address(self) -> str:
        return self._comm.local_address

    @property
    def peer_label(self) -> str:
        return f"{self.peer_name}@{self.peer_address}"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> ShardexError | None:
        """Why the connection ended (``None`` while open)."""
        return self._close_reason

    @property
    def pending_requests(self) -> int:
        return len(self._pending)

    # --- public API -------------------------------------------------------------------

    @overload
    async def request(self, msg: Message, timeout: float | None = ..., *, expect: type[M]) -> M: ...
    @overload
    async def request(
        self, msg: Message, timeout: float | None = ..., *, expect: None = None
    ) -> Message: ...

    async def request(
        self,
        msg: Message,
        timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        *,
        expect: type[Message] | None = None,
    ) -> Message:
        """Send ``msg`` and wait for its response.

        Raises the peer's error (rebuilt by ``ShardexError.from_wire``), ``RequestTimeout``
        after ``timeout`` seconds (``None`` waits forever; the connection stays usable and a
        late response is dropped), ``ConnectionClosed`` if the connection ends first,
        ``FrameTooLarge`` if ``msg`` encodes over the frame limit (nothing is sent), and
        ``ProtocolError`` if the response is not an instance of ``expect``.
        """
        if self._closed:
            raise self._closed_error(message_type_name(msg))
        rid = self._next_id
        self._next_id += 1
        fut: asyncio.Future[Message] = self._loop.create_future()
        type_name = message_type_name(msg)
        pending = Pending(fut, type_name, timeout)
        self._pending[rid] = pending
        try:
            frame = self._encode(Envelope(Kind.REQUEST, rid, msg))
            if not self._write_lock.locked() and self._comm.write_nowait(frame):
                # Sent without waiting: only the reply is awaited, bounded by the sweep.
                if timeout is not None:
                    self._deadlines.arm(pending, timeout)
                reply = await fut
            else:
                # The peer is not keeping up: the timeout bounds the wait to send as well.
                async with asyncio.timeout(timeout):
                    await self._write_frame(frame, type_name)
                    reply = await fut
        except TimeoutError:
            raise RequestTimeout(
                f"{type_name} to {self.peer_label} timed out after {timeout}s",
                details={"type": type_name, "peer": self.peer_label, "timeout": timeout},
            ) from None
        finally:
            self._pending.pop(rid, None)
        if expect is not None and not isinstance(reply, expect):
            raise ProtocolError(
                f"{self.peer_label} answered {type_name} with {message_type_name(reply)}, "
                f"expected {expect.__name__}",
                details={"type": type_name, "got": message_type_name(reply)},
            )
        return reply

    def request_future(
        self, msg: Message, timeout: float | None = DEFAULT_REQUEST_TIMEOUT
    ) -> asyncio.Future[Message]:
        """``request`` without a coroutine: ``msg`` is sent now (when the transport takes it
        without waiting) and the future of its response returned, failing as ``request``
        raises; the response is not checked against a type. For a caller that fans a request
        out to several peers from plain code: no task per request. Cancelling the future
        drops a late response. A send that must wait for back-pressure runs ``request`` in a
        task instead. Raises at once if the connection is closed or ``msg`` cannot be sent."""
        if self._closed:
            raise self._closed_error(message_type_name(msg))
        if self._write_lock.locked():
            return self._loop.create_task(self.request(msg, timeout))
        rid = self._next_id
        frame = self._encode(Envelope(Kind.REQUEST, rid, msg))
        fut: asyncio.Future[Message] = self._loop.create_future()
        pending = Pending(fut, message_type_name(msg), timeout)
        self._pending[rid] = pending
        try:
            sent = self._comm.write_nowait(frame)
        except BaseException:
            del self._pending[rid]
            raise
        if not sent:
            del self._pending[rid]
            return self._loop.create_task(self.request(msg, timeout))
        self._next_id = rid + 1
        if timeout is not None:
            self._deadlines.arm(pending, timeout)
        # A response pops its entry; a timeout or a cancel leaves it: dropped here.
        fut.add_done_callback(lambda _: self._pending.pop(rid, None))
        return fut

    async def send(self, msg: Message) -> None:
        """Send a one-way message. Returns once it is handed to the transport (not when the
        peer has handled it); a slow peer makes this wait (backpressure)."""
        if self._closed:
            raise self._closed_error(message_type_name(msg))
        await self._write(Envelope(Kind.ONEWAY, 0, msg))

    async def ping(self, timeout: float | None = DEFAULT_REQUEST_TIMEOUT) -> float:
        """Round-trip time in seconds (loop clock)."""
        start = self._loop.time()
        await self.request(Ping(), timeout, expect=Pong)
        return self._loop.time() - start

    def add_close_callback(self, callback: CloseCallback) -> None:
        """Call ``callback(conn)`` once when the connection ends (at once if it has)."""
        if self._closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def close(self) -> None:
        """Close gracefully: pending requests fail with ConnectionClosed, running handlers
        are cancelled, queued outgoing bytes are flushed. Idempotent."""
        if not self._closed:
            self._finish(ConnectionClosed(f"connection to {self.peer_label} closed locally"))
        await self._comm.close()
        await self._closed_event.wait()

    def abort(self) -> None:
        """Close at once without flushing."""
        if not self._closed:
            self._finish(ConnectionClosed(f"connection to {self.peer_label} aborted locally"))
        self._comm.abort()

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    # --- internals --------------------------------------------------------------------

    def start(self) -> None:
        """Start receiving (done by ``connect`` and ``RpcServer``): frames pushed by the comm
        straight into ``_on_frame`` where it can (TCP), else a reader task (the simulator)."""
        if self._started:
            return
        self._started = True
        if not self._comm.set_receiver(self._on_frame, self._on_end):
            self._reader_task = self._loop.create_task(
                self._read_loop(), name=f"shardex-rpc-reader {self.name}<-{self.peer_name}"
            )

    def _closed_error(self, type_name: str) -> ConnectionClosed:
        reason = self._close_reason
        details: dict[str, Any] = {"type": type_name, "peer": self.peer_label}
        if reason is not None and "notice" in reason.details:
            details["notice"] = reason.details["notice"]
        return ConnectionClosed(
            f"{type_name}: connection to {self.peer_label} is closed"
            + (f" ({reason.message})" if reason else ""),
            details=details,
        )

    def _encode(self, env: Envelope) -> bytes:
        frame = encode_frame(env)
        if len(frame) > self._max_frame:
            type_name = message_type_name(env.body)
            raise FrameTooLarge(
                f"{type_name} encodes to {len(frame)} bytes, over max_frame {self._max_frame}",
                details={"type": type_name, "size": len(frame), "max_frame": self._max_frame},
            )
        return frame

    async def _write(self, env: Envelope) -> None:
        frame = self._encode(env)
        # Fast path: nobody is queued behind a draining write and the peer keeps up, so the
        # frame goes out now, with no lock round (most writes on a request's path).
        if not self._closed and not self._write_lock.locked() and self._comm.write_nowait(frame):
            return
        await self._write_frame(frame, message_type_name(env.body))

    async def _write_frame(self, frame: bytes, type_name: str) -> None:
        # The lock keeps frames whole whatever the backend does while a write is suspended,
        # and bounds buffering: writers queue behind one draining write.
        async with self._write_lock:
            if self._closed:
                raise self._closed_error(type_name)
            await self._comm.write(frame)

    def _timed_out(self, p: Pending) -> RequestTimeout:
        return RequestTimeout(
            f"{p.type_name} to {self.peer_label} timed out after {p.timeout}s",
            details={"type": p.type_name, "peer": self.peer_label, "timeout": p.timeout},
        )

    def _on_frame(self, frame: bytes) -> None:
        """Push mode: one frame, in the comm's data callback."""
        if self._closed:
            return
        try:
            self._handle_frame(frame)
        except ProtocolError as e:
            self._on_end(e)
        except Exception as e:
            log.exception("receiving from %s failed; closing the connection", self.peer_label)
            self._end_with(ConnectionClosed(f"connection to {self.peer_label} failed: {e!r}"))

    def _on_end(self, err: ShardexError) -> None:
        """Push mode: the stream ended (``err`` as ``read`` would raise it), or a frame broke
        the protocol. Same outcomes as the reader task's."""
        if self._closed:
            return
        if isinstance(err, ProtocolError):  # includes FrameTooLarge
            log.error("protocol error on connection with %s: %s; closing it", self.peer_label, err)
            code, message, _ = err.to_wire()
            self._end_with(
                ConnectionClosed(
                    f"connection to {self.peer_label} closed: {err.message}",
                    details={"peer": self.peer_label, "cause": err.code.value},
                ),
                ErrorReply(code=code, message=message, details={}),
            )
        else:
            self._end_with(self._with_notice(err))

    def _end_with(self, reason: ShardexError, notice: ErrorReply | None = None) -> None:
        self._finish(reason)
        self._closer_task = self._loop.create_task(self._notify_and_close(notice))

    async def _notify_and_close(self, notice: ErrorReply | None) -> None:
        if notice is not None and not self._comm.closed:
            # Tell the peer why before hanging up; it may be a buggy but honest node.
            try:
                async with asyncio.timeout(_NOTICE_TIMEOUT), self._write_lock:
                    await self._comm.write(encode_frame(Envelope(Kind.ERROR, 0, notice)))
            except (TimeoutError, ShardexError, OSError):
                pass
        await self._comm.close()

    def _with_notice(self, e: ShardexError) -> ShardexError:
        if self._peer_notice is None:
            return e
        # The peer said why it hung up; pass that on to whoever was waiting.
        n = self._peer_notice
        return ConnectionClosed(
            f"{e.message} after notice {n.code}: {n.message}",
            details={**e.details, "notice": n.code},
        )

    def _handle_frame(self, frame: bytes) -> None:
        """One received frame, in either mode: decoded and dispatched; a body that does not
        decode is answered or dropped by ``_on_bad_body`` (the connection stays)."""
        try:
            env = decode_frame(frame)
        except UndecodableBody as e:
            self._on_bad_body(e)
            return
        self._dispatch(env)

    async def _read_loop(self) -> None:
        reason: ShardexError
        notice: ErrorReply | None = None
        try:
            while True:
                self._handle_frame(await self._comm.read())
        except ConnectionClosed as e:
            reason = self._with_notice(e)
        except ProtocolError as e:  # includes FrameTooLarge
            log.error("protocol error on connection with %s: %s; closing it", self.peer_label, e)
            reason = ConnectionClosed(
                f"connection to {self.peer_label} closed: {e.message}",
                details={"peer": self.peer_label, "cause": e.code.value},
            )
            code, message, _ = e.to_wire()
            notice = ErrorReply(code=code, message=message, details={})
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("reader of connection with %s failed; closing it", self.peer_label)
            reason = ConnectionClosed(f"connection to {self.peer_label} failed: {e!r}")
        self._finish(reason)
        await self._notify_and_close(notice)

    def _refused(self, env: Envelope) -> bool:
        """A user's request or one-way message its principal may not send: logged with the
        peer, a request answered with the refusal, nothing else done (the connection stays)."""
        assert self._gate is not None and self.principal is not None
        try:
            self.principal = self._gate.check(self.principal, env.body)
        except ShardexError as e:
            log.warning(
                "refused %s %s from %s (%s): %s",
                env.kind.name.lower(),
                message_type_name(env.body),
                self.peer_label,
                self.principal,
                e.message,
            )
            if env.kind is Kind.REQUEST:
                self._spawn(self._responder.reply_error(env.id, e))
            return True
        return False

    def _dispatch(self, env: Envelope) -> None:
        kind = env.kind
        if (
            self._gate is not None
            and (kind is Kind.REQUEST or kind is Kind.ONEWAY)
            and self._refused(env)
        ):
            return
        if kind is Kind.REQUEST:
            body = env.body
            responder = self._responder
            if type(body) is Ping and responder.answer_ping_now(env.id, body):
                return
            inline = self._router.lookup_inline(type(body))
            if inline is not None:
                responder.answer_inline(env.id, body, inline)
                return
            key = self._task_seq = self._task_seq + 1
            self._tasks[key] = self._loop.create_task(responder.handle_request(env.id, body, key))
        elif kind is Kind.ONEWAY:
            self._oneway.append(env.body)
            wakeup = self._oneway_wakeup
            if wakeup is not None:
                self._oneway_wakeup = None
                if not wakeup.done():
                    wakeup.set_result(None)
            elif self._oneway_task is None:
                self._oneway_task = self._loop.create_task(self._oneway_loop())
        elif env.id == 0:
            body = env.body
            if isinstance(body, ErrorReply):
                log.warning("%s sent notice %s: %s", self.peer_label, body.code, body.message)
                self._peer_notice = body
        else:
            entry = self._pending.pop(env.id, None)
            if entry is None:
                # Its request timed out or was cancelled; nobody is waiting any more.
                log.debug("late reply %d from %s dropped", env.id, self.peer_label)
                return
            fut, type_name = entry.fut, entry.type_name
            if fut.done():
                return
            body = env.body
            if kind is Kind.RESPONSE:
                fut.set_result(body)
            elif isinstance(body, ErrorReply):
                fut.set_exception(ShardexError.from_wire(body.code, body.message, body.details))
            else:
                fut.set_exception(
                    ProtocolError(
                        f"{self.peer_label} sent an error of type {message_type_name(body)}",
                        details={"type": type_name},
                    )
                )

    def _on_bad_body(self, e: UndecodableBody) -> None:
        log.warning("%s from %s: %s", e.kind.name.lower(), self.peer_label, e.message)
        if e.kind is Kind.REQUEST:
            self._spawn(self._responder.reply_error(e.request_id, e))
        elif e.kind in (Kind.RESPONSE, Kind.ERROR) and e.request_id:
            entry = self._pending.pop(e.request_id, None)
            if entry is not None and not entry.fut.done():
                entry.fut.set_exception(e)

    def _spawn(self, coro: Any) -> None:
        key = self._task_seq = self._task_seq + 1
        self._tasks[key] = task = self._loop.create_task(coro)
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _oneway_loop(self) -> None:
        queue = self._oneway
        while True:
            while not queue:
                self._oneway_wakeup = self._loop.create_future()
                await self._oneway_wakeup
            msg = queue.popleft()
            handler = self._router.lookup(type(msg))
            if handler is None:
                log.warning(
                    "no handler for one-way %s from %s; dropped",
                    message_type_name(msg),
                    self.peer_label,
                )
                continue
            try:
                await handler(msg, self)
            except ShardexError as e:
                log.warning("one-way %s from %s failed: %s", type(msg).__name__, self.peer_label, e)
            except Exception:
                log.exception(
                    "handler for one-way %s from %s raised", type(msg).__name__, self.peer_label
                )

    def _finish(self, reason: ShardexError) -> None:
        """End the connection once: fail every pending request together, stop handlers."""
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.fut.done():
                p.fut.set_exception(self._closed_error(p.type_name))
        self._deadlines.cancel()
        current = asyncio.current_task()
        for task in (self._reader_task, self._oneway_task, *self._tasks.values()):
            if task is not None and task is not current:
                task.cancel()
        for cb in self._close_callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("close callback of %r failed", self)
        self._close_callbacks.clear()
        self._closed_event.set()

"""How a ``Connection`` answers the requests it receives: its ``Responder``.

A routed handler (``Router.route``) runs in a task per request; an inline one
(``Router.route_inline``) is called in the receive callback and its response written at
once, a task only finishing what cannot be done there (an awaitable result, an error, a
write that must wait for back-pressure). An unrouted ``Ping`` is answered in the callback.
Either way a ``ShardexError`` goes back with its code, message and details, any other
exception as INTERNAL (logged with its traceback), and a response that cannot be sent as
the error saying why.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from shardex.errors import ConnectionClosed, ErrorCode, ProtocolError, ShardexError
from shardex.net.messages import (
    Ack,
    Envelope,
    ErrorReply,
    Kind,
    Message,
    Ping,
    Pong,
    encode_frame,
    message_type_name,
)
from shardex.net.router import InlineHandler, Router
from shardex.net.transport import Comm

log = logging.getLogger("shardex.net.connection")


class Answered(Protocol):
    """What a ``Responder`` reads of its connection (a ``Connection``; declared here because
    this module sits below ``connection.py``)."""

    name: str

    @property
    def peer_label(self) -> str: ...

    @property
    def closed(self) -> bool: ...


class Responder:
    """Answers the requests one connection receives. The connection hands each request over
    (``answer_ping_now``, ``answer_inline``, ``handle_request``) and lends what a reply
    needs: its comm, its write lock and frame limit, its writer and encoder, its task table
    (a request's task removes its own entry) and ``spawn``."""

    __slots__ = (
        "_comm",
        "_conn",
        "_encode",
        "_max_frame",
        "_router",
        "_spawn",
        "_tasks",
        "_write",
        "_write_lock",
    )

    def __init__(
        self,
        conn: Answered,
        *,
        router: Router,
        comm: Comm,
        max_frame: int,
        write_lock: asyncio.Lock,
        tasks: dict[int, asyncio.Task[None]],
        write: Callable[[Envelope], Awaitable[None]],
        encode: Callable[[Envelope], bytes],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        # The connection itself, passed to every handler as its second argument.
        self._conn: Any = conn
        self._router = router
        self._comm = comm
        self._max_frame = max_frame
        self._write_lock = write_lock
        self._tasks = tasks
        self._write = write
        self._encode = encode
        self._spawn = spawn

    def answer_ping_now(self, rid: int, ping: Ping) -> bool:
        """An unrouted ``Ping`` answered in the receive callback: no task, no extra loop
        iteration (liveness probes stay cheap). False: leave it to a handler task."""
        if Ping in self._router or self._conn.closed:
            return False
        frame = encode_frame(Envelope(Kind.RESPONSE, rid, Pong(payload=ping.payload)))
        if len(frame) > self._max_frame or self._write_lock.locked():
            return False
        try:
            return self._comm.write_nowait(frame)
        except ConnectionClosed:
            return True  # the reply is lost with the connection, as a task's would be

    async def handle_request(self, rid: int, msg: Message, key: int) -> None:
        try:
            await self._answer(rid, msg)
        finally:
            self._tasks.pop(key, None)

    async def _answer(self, rid: int, msg: Message) -> None:
        handler = self._router.lookup(type(msg))
        if handler is None:
            if isinstance(msg, Ping):
                await self._reply(rid, Pong(payload=msg.payload))
                return
            type_name = message_type_name(msg)
            await self.reply_error(
                rid,
                ShardexError(
                    f"{self._conn.name} has no handler for {type_name}",
                    code=ErrorCode.UNKNOWN_MESSAGE,
                    details={"type": type_name},
                ),
            )
            return
        try:
            pending = handler(msg, self._conn)
        except Exception as e:  # not a coroutine function, and it raised at once
            await self.reply_error(rid, self._handler_error(msg, e))
            return
        await self._answer_awaited(rid, msg, pending)

    async def _answer_awaited(
        self, rid: int, msg: Message, pending: Awaitable[Message | None]
    ) -> None:
        try:
            result = _response(await pending)
        except Exception as e:
            await self.reply_error(rid, self._handler_error(msg, e))
            return
        await self._reply(rid, result)

    def answer_inline(self, rid: int, msg: Message, handler: InlineHandler) -> None:
        """A request whose handler was routed inline (``Router.route_inline``): called here,
        in the receive callback, and its response written at once when the transport takes
        it without waiting. Anything else - a handler that returned an awaitable, an error,
        a write that must wait - is finished in a task, as a routed request is."""
        try:
            result = handler(msg, self._conn)
            if isinstance(result, asyncio.Future):
                # A future settled by callbacks (a durable write): answered from its own
                # callback, no task.
                result.add_done_callback(functools.partial(self._answer_future, rid, msg))
                return
            if inspect.isawaitable(result):
                self._spawn(self._answer_awaited(rid, msg, result))
                return
            response = _response(result)
        except Exception as e:
            self._spawn(self.reply_error(rid, self._handler_error(msg, e)))
            return
        self._answer_now(rid, response)

    def _answer_future(self, rid: int, msg: Message, fut: asyncio.Future[Any]) -> None:
        """An inline handler's future is done: its response (or error) goes out as
        ``answer_inline``'s would."""
        try:
            response = _response(fut.result())
        except asyncio.CancelledError:  # said as an error: nothing here to cancel
            err = ShardexError(f"{message_type_name(msg)} was cancelled", code=ErrorCode.INTERNAL)
            self._spawn(self.reply_error(rid, err))
            return
        except Exception as e:
            self._spawn(self.reply_error(rid, self._handler_error(msg, e)))
            return
        self._answer_now(rid, response)

    def _answer_now(self, rid: int, response: Message) -> None:
        """``response`` written at once when the transport takes it without waiting, else
        by a task."""
        try:
            frame = self._encode(Envelope(Kind.RESPONSE, rid, response))
            if (
                not self._conn.closed
                and not self._write_lock.locked()
                and self._comm.write_nowait(frame)
            ):
                return
        except ShardexError:
            pass  # unencodable, too large, closed: ``_reply`` says so, as for a task's reply
        self._spawn(self._reply(rid, response))

    def _handler_error(self, msg: Message, e: Exception) -> ShardexError:
        """What a handler's exception is answered with: its own ``ShardexError``, anything
        else INTERNAL (logged with its traceback)."""
        type_name = message_type_name(msg)
        if isinstance(e, ShardexError):
            log.debug("%s from %s failed: %s", type_name, self._conn.peer_label, e)
            return e
        log.error("handler for %s from %s raised", type_name, self._conn.peer_label, exc_info=e)
        return ShardexError(
            f"{type(e).__name__}: {e}",
            code=ErrorCode.INTERNAL,
            details={"type": type_name, "exception": type(e).__name__},
        )

    async def _reply(self, rid: int, result: Message) -> None:
        try:
            await self._write(Envelope(Kind.RESPONSE, rid, result))
        except ConnectionClosed:
            log.debug("reply %d to %s lost: connection closed", rid, self._conn.peer_label)
        except ProtocolError as e:  # unencodable or oversized response: say so instead
            log.error("cannot send reply %d to %s: %s", rid, self._conn.peer_label, e)
            await self.reply_error(rid, e)

    async def reply_error(self, rid: int, err: ShardexError) -> None:
        code, message, details = err.to_wire()
        try:
            try:
                await self._write(
                    Envelope(
                        Kind.ERROR, rid, ErrorReply(code=code, message=message, details=details)
                    )
                )
            except ProtocolError:
                # Details that cannot be encoded must not turn an error into a hang.
                safe = ErrorReply(code=code, message=message, details={"repr": repr(details)})
                await self._write(Envelope(Kind.ERROR, rid, safe))
        except ConnectionClosed:
            log.debug("error reply %d to %s lost: connection closed", rid, self._conn.peer_label)
        except ShardexError as e:
            log.error("cannot send error reply %d to %s: %s", rid, self._conn.peer_label, e)


def _response(result: Message | None) -> Message:
    """A handler's return value as the response: ``None`` is an ``Ack``."""
    if result is None:
        return Ack()
    if not isinstance(result, Message):
        raise TypeError(f"handler returned {type(result).__name__}, not a Message")
    return result

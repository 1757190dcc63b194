"""An HTTP connection's protocol that takes a whole request in its receive callback: answers
it there when it can, as the RPC connection answers a key lookup in its frame's (decision
0138), else hands it, parsed, to the connection's task (decision 0146).

The connection's task serves requests one at a time. Between two, it waits here
(``next_request``) with nothing of the next one read. While it waits and the connection
has nothing left to send, received bytes are first offered to ``answer``, which parses
them when they are one whole request and then returns its whole response (written here;
the task keeps waiting), or the parsed request (handed to the waiting task: the request is
read once, and the task skips its stream reader, read deadlines and the parse), or None.
On None (a part of a request, two pipelined, anything not parsed whole) the bytes go to the
task's stream reader as before, and from then on every byte does until the task has served
that request: responses leave in request order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Generic, TypeVar, cast

__all__ = ["IDLE", "QuickProtocol"]

log = logging.getLogger(__name__)

H = TypeVar("H")  # a request parsed in the receive callback, handed to the task
# a whole request's bytes -> its whole response, or the request parsed, or None
Answer = Callable[[bytes], "bytes | H | None"]


class _Idle:
    def __repr__(self) -> str:
        return "IDLE"


IDLE: Final = _Idle()  # ``next_request``: no request came for the idle time


class QuickProtocol(asyncio.StreamReaderProtocol, Generic[H]):
    def __init__(
        self,
        reader: asyncio.StreamReader,
        connected: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        answer: Answer[H],
    ) -> None:
        super().__init__(reader, connected)
        self._reader = reader
        self._answer = answer
        self._quick_transport: asyncio.WriteTransport | None = None
        # The task's wait for its next request (``next_request``): set while it waits with
        # nothing of that request read; resolved by the first bytes received, the end of
        # the connection or the idle deadline.
        self._waiter: asyncio.Future[H | _Idle | None] | None = None
        self._since = 0.0  # loop time the current wait began
        self._answered = 0.0  # loop time of the last request answered here
        # One timer per connection for the idle deadline, re-armed only when it fires early
        # (arming a deadline per request costs about as much as parsing a small request).
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle = 0.0

    @property
    def between(self) -> bool:
        """The task waits for a request with nothing of it read."""
        return self._waiter is not None

    def last_answered(self) -> float:
        """The loop time of the last request answered in the receive callback (the task's
        idle deadline counts from it)."""
        return self._answered

    def next_request(self, idle: float) -> Awaitable[H | _Idle | None]:
        """The next request when it arrives whole and parsed (``answer``'s), None when it is
        to be read from the stream reader (it holds bytes, reached its end, or bytes went to
        it), ``IDLE`` when none came for ``idle`` seconds (counting from the last request
        answered in the receive callback too)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[H | _Idle | None] = loop.create_future()
        r = self._reader
        if r._buffer or r.at_eof() or r.exception() is not None or self._quick_transport is None:
            waiter.set_result(None)
            return waiter
        self._waiter = waiter
        self._since = loop.time()
        self._idle = idle
        if self._idle_timer is None:
            self._idle_timer = loop.call_at(self._since + idle, self._idle_check)
        return waiter

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self._waiter is None:
            return  # the task is serving a request; its next wait arms the timer again
        loop = asyncio.get_running_loop()
        deadline = max(self._since, self._answered) + self._idle
        if loop.time() >= deadline:
            self._resolve(IDLE)
        else:
            self._idle_timer = loop.call_at(deadline, self._idle_check)

    def _resolve(self, value: H | _Idle | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's transports are not asyncio.Transport subclasses; both have its methods
        self._quick_transport = cast(asyncio.WriteTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._quick_transport = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)
        self._resolve(None)  # the reader tells the task how it ended

    def eof_received(self) -> bool:
        keep_open = super().eof_received()
        self._resolve(None)
        return bool(keep_open)

    def data_received(self, data: bytes) -> None:
        t = self._quick_transport
        # A reader holding bytes is mid-request (or has the next one): not between requests.
        # A backlog to send: the task's writes wait for the client; so does this answer.
        if (
            self._waiter is not None
            and t is not None
            and not self._reader._buffer
            and not t.get_write_buffer_size()
            and not t.is_closing()
        ):
            try:
                out = self._answer(data)
            except Exception:  # the task reads it and meets the same failure
                log.exception("taking an HTTP request in the receive callback failed")
                out = None
            if isinstance(out, bytes):
                t.write(out)
                self._answered = asyncio.get_running_loop().time()
                return
            if out is not None:
                self._resolve(out)
                return
        super().data_received(data)
        self._resolve(None)

"""An HTTP connection's protocol that answers a small request in its receive callback, as the
RPC connection answers a key lookup in its frame's (decision 0138).

The connection's task reads requests with a stream reader, under an idle deadline and a
request deadline, and writes each answer. For a key lookup whose document is on this node
that machinery costs more than the answer. So while the task waits for the next request
with nothing of it read (``between``) and the connection has nothing left to send, received
bytes are first offered to ``answer``: when they are one whole request it answers now, its
response is written here and the reader never sees it. Anything else (a part of a request,
two pipelined, one ``answer`` declines) goes to the reader as before, and from then on every
byte does until the task has served that request: responses leave in request order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import cast

__all__ = ["QuickProtocol"]

log = logging.getLogger(__name__)

Answer = Callable[[bytes], bytes | None]  # a whole request's bytes -> its whole response


class QuickProtocol(asyncio.StreamReaderProtocol):
    def __init__(
        self,
        reader: asyncio.StreamReader,
        connected: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        answer: Answer,
    ) -> None:
        super().__init__(reader, connected)
        self._reader = reader
        self._answer = answer
        self._quick_transport: asyncio.WriteTransport | None = None
        # Set by the connection's task when it waits for a request with nothing of it read;
        # cleared by the first byte handed to its reader.
        self.between = False
        self._answered = 0.0  # loop time of the last request answered here

    def last_answered(self) -> float:
        """The loop time of the last request answered in the receive callback (the task's
        idle deadline counts from it)."""
        return self._answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's transports are not asyncio.Transport subclasses; both have its methods
        self._quick_transport = cast(asyncio.WriteTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._quick_transport = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        t = self._quick_transport
        # A reader holding bytes is mid-request (or has the next one): not between requests.
        # A backlog to send: the task's writes wait for the client; so does this answer.
        if (
            self.between
            and t is not None
            and not self._reader._buffer
            and not t.get_write_buffer_size()
            and not t.is_closing()
        ):
            try:
                out = self._answer(data)
            except Exception:  # the task serves it and meets the same failure
                log.exception("answering an HTTP request in the receive callback failed")
                out = None
            if out is not None:
                t.write(out)
                self._answered = asyncio.get_running_loop().time()
                return
        self.between = False
        super().data_received(data)

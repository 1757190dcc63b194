"""Dispatch tables: which handler a connection runs for each message class it receives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, overload

from shardex.net.messages import Message

if TYPE_CHECKING:
    from shardex.net.connection import Connection

# ``async def handler(msg, conn) -> Message | None``
Handler = Callable[[Any, "Connection"], Awaitable[Message | None]]
# ``def handler(msg, conn) -> Message | None | Awaitable[Message | None]``: run in the receive
# callback (``Router.route_inline``); an awaitable result is finished in a task.
InlineHandler = Callable[[Any, "Connection"], Message | Awaitable[Message | None] | None]


class Router:
    """Dispatch table: message class -> handler. Shared by every connection it is given to."""

    def __init__(self, routes: Mapping[type[Message], Handler] | None = None) -> None:
        self._routes: dict[type[Message], Handler] = {}
        self._inline: dict[type[Message], InlineHandler] = {}
        for msg_type, handler in (routes or {}).items():
            self.route(msg_type, handler)

    @overload
    def route(self, msg_type: type[Message], handler: Handler) -> Handler: ...
    @overload
    def route(
        self, msg_type: type[Message], handler: None = None
    ) -> Callable[[Handler], Handler]: ...

    def route(self, msg_type: type[Message], handler: Handler | None = None) -> Any:
        """Register ``handler`` for ``msg_type``; without a handler, acts as a decorator."""
        if not (isinstance(msg_type, type) and issubclass(msg_type, Message)):
            raise TypeError(f"route() needs a Message subclass, got {msg_type!r}")

        def register(h: Handler) -> Handler:
            if msg_type in self._routes or msg_type in self._inline:
                raise ValueError(f"{msg_type.__name__} is already routed")
            self._routes[msg_type] = h
            return h

        return register(handler) if handler is not None else register

    def route_inline(self, msg_type: type[Message], handler: InlineHandler) -> None:
        """Register a plain function for ``msg_type``, called in the connection's receive
        callback: no task per request (a task costs ~20k instructions, more than a short
        handler; Python 3.11 has no eager tasks). Only for handlers that answer from memory
        without blocking: the loop runs nothing else meanwhile. One that must wait returns an
        awaitable (e.g. a coroutine), which the connection then finishes in a task."""
        if not (isinstance(msg_type, type) and issubclass(msg_type, Message)):
            raise TypeError(f"route_inline() needs a Message subclass, got {msg_type!r}")
        if msg_type in self._routes or msg_type in self._inline:
            raise ValueError(f"{msg_type.__name__} is already routed")
        self._inline[msg_type] = handler

    def lookup(self, msg_type: type[Message]) -> Handler | None:
        return self._routes.get(msg_type)

    def lookup_inline(self, msg_type: type[Message]) -> InlineHandler | None:
        return self._inline.get(msg_type)

    def __contains__(self, msg_type: object) -> bool:
        return msg_type in self._routes or msg_type in self._inline


def as_router(handlers: Router | Mapping[type[Message], Handler] | None) -> Router:
    if isinstance(handlers, Router):
        return handlers
    return Router(handlers)

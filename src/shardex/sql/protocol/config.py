"""Settings of the SQL execution protocol and the seams it needs from the node."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from shardex.errors import ConfigError
from shardex.net.messages import Message
from shardex.sql.protocol.flow import MIN_WINDOW

__all__ = ["BeforeSend", "MemberDirectory", "ProtocolConfig"]


@dataclass(frozen=True)
class ProtocolConfig:
    window: int = 1 << 20  # default credit window per stream, bytes
    timeout: float = 60.0  # default query timeout, seconds
    check_interval: float = 1.0  # how often held state is checked with its initiator
    check_timeout: float = 5.0
    tombstone_ttl: float = 30.0
    max_pending_bytes: int = 64 << 20  # early batches held per member
    max_pending_queries: int = 1024
    result_capacity: int = 4  # root batches buffered for the caller
    connect_timeout: float = 5.0
    # Executions of queries other members initiated, run here at once; one more fails its
    # query with QUERY_OVERLOADED at once, never waits (decision 0105). None: no cap.
    max_executions: int | None = None

    def __post_init__(self) -> None:
        if self.window < MIN_WINDOW:
            raise ConfigError(
                f"credit window {self.window} is below {MIN_WINDOW} bytes",
                details={"value": self.window, "hint": f"use a window >= {MIN_WINDOW}"},
            )
        for name in ("timeout", "check_interval", "check_timeout", "tombstone_ttl"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(
                    f"{name} must be positive, got {value}",
                    details={"value": value, "key": name, "hint": "seconds, > 0"},
                )
        if self.max_executions is not None and self.max_executions < 1:
            raise ConfigError(
                f"max_executions must be >= 1, got {self.max_executions}",
                details={"value": self.max_executions, "key": "max_executions", "hint": ">= 1"},
            )


class MemberDirectory(Protocol):
    """What the protocol needs from membership: where a member listens and whether the
    failure detector says it is down."""

    def address_of(self, member_id: str) -> str | None: ...

    def is_down(self, member_id: str) -> bool: ...


# Test seam: awaited before each message leaves the member; returning False drops it (a loss
# that no connection reset reports). Simulations use it to force the specification's message orders.
BeforeSend = Callable[[str, Message], Awaitable[bool]]

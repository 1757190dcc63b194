"""The TCP byte stream's framing: a 4-byte big-endian payload length, then the payload.

Shared by the event loop's ``TcpComm`` (``tcp_comm.py``) and the blocking ``BlockingConn``
(``blocking.py``), so both cut and write frames, and refuse oversized ones, alike. What a
frame's payload is (an encoded ``Envelope``) is ``messages.py``'s business.
"""

from __future__ import annotations

from typing import Final

from shardex.errors import FrameTooLarge

__all__ = ["HEADER", "announced_too_large", "header", "sending_too_large"]

HEADER: Final = 4


def header(size: int) -> bytes:
    """The length prefix of a payload of ``size`` bytes."""
    return size.to_bytes(HEADER, "big")


def announced_too_large(peer: str, size: int, max_frame: int) -> FrameTooLarge:
    """A peer announced a frame over our limit: the stream cannot be trusted any more."""
    return FrameTooLarge(
        f"peer {peer} announced a frame of {size} bytes",
        details={"peer": peer, "size": size, "max_frame": max_frame},
    )


def sending_too_large(peer: str, size: int, max_frame: int) -> FrameTooLarge:
    """A frame of ours over the limit: the caller learns at once, nothing is sent (the peer
    would cut us off anyway)."""
    return FrameTooLarge(
        f"frame of {size} bytes to {peer} exceeds max_frame {max_frame}",
        details={"peer": peer, "size": size, "max_frame": max_frame},
    )

"""The event loop every real process runs on: uvloop where it is installed, else asyncio's.

Nodes and the client's loop thread spend much of their CPU in the event loop itself (a
request is several loop iterations, stream reads and writes, timer and future callbacks):
profiles of a 100-row scan and of a write put asyncio's own machinery beside our code on
both sides. uvloop runs the same ``asyncio`` API on libuv, in C. ``SHARDEX_EVENT_LOOP=asyncio``
selects the standard loop (for an A/B, or to rule uvloop out when chasing a bug); the
deterministic simulation (``shardex.sim``) has a loop of its own and is not affected.
"""

from __future__ import annotations

import asyncio
import os

__all__ = ["ENV_VAR", "loop_kind", "new_event_loop"]

ENV_VAR = "SHARDEX_EVENT_LOOP"
_KINDS = ("uvloop", "asyncio")


def loop_kind() -> str:
    """``uvloop`` or ``asyncio``: what ``new_event_loop`` makes in this process."""
    wanted = os.environ.get(ENV_VAR, "uvloop").strip().lower() or "uvloop"
    if wanted not in _KINDS:
        raise ValueError(
            f"{ENV_VAR}={wanted!r} is not an event loop shardex knows; use one of {_KINDS}"
        )
    if wanted == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:  # an install without the optional speed-up still runs
            return "asyncio"
    return wanted


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of ``loop_kind()`` (not set as the thread's current loop)."""
    if loop_kind() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()

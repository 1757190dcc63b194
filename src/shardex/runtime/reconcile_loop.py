"""The loop every service uses to converge its local state on the coordinator's.

Data and index services both reconcile: at start, whenever the committed state changes
(``wake`` is set), and every ``interval`` seconds as a safety net. A failure is retried with
exponential backoff from 0.2 s up to the interval; ``ready`` is set after the first success,
so tests and callers can wait for a node to have caught up once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shardex.errors import ShardexError

log = logging.getLogger(__name__)


async def reconcile_forever(
    reconcile: Callable[[], Awaitable[Any]],
    *,
    wake: asyncio.Event,
    ready: asyncio.Event,
    interval: float,
    what: str,
) -> None:
    delay = 0.2
    while True:
        try:
            await reconcile()
            ready.set()
            delay = interval
        except ShardexError as exc:
            # expected while peers or the master are away: quiet, and sooner than the interval
            log.debug("%s reconcile failed (retrying): %s", what, exc)
            delay = min(delay * 2, interval)
        except Exception:
            log.exception("%s reconcile failed", what)
            delay = interval
        wake.clear()
        # ``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for`` can swallow a
        # cancellation that lands as ``wake`` is set, and the service's stop then waits
        # for this loop forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()

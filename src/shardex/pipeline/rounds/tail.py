"""The tail of a micro-batch (its stabilise round), run beside Spark's commit of the batch.

``foreachBatch`` returns once the batch's key versions are delivered; the stabilise round
(timekeeper -> indexers, one synced write each, publish) then runs on a thread of its own
while Spark writes the commit log, asks for the next offsets and writes the next offset log
(100s of ms per batch on this machine). The next batch, and an idle stabilise round, first
``join`` the tail: at most one tail is ever in flight, and nothing after it starts before it
ended. Why that keeps exactly-once: ``docs/decisions/0044-round-trip-per-indexer.md``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

__all__ = ["BatchTail"]


class BatchTail:
    """One background call at a time; ``join`` waits for it and re-raises its failure once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._future: concurrent.futures.Future[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a new daemon thread (a hung round must not keep the process alive
        at exit; the next batch's ``join`` is what waits for it). The previous tail must have
        been joined."""
        if self._future is not None:
            raise RuntimeError(f"{self.name}: the previous batch tail was not joined")
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                fn()
            except BaseException as exc:  # handed to join(), which re-raises it
                future.set_exception(exc)
            else:
                future.set_result(None)

        self._future = future
        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def future(self) -> concurrent.futures.Future[None] | None:
        """The tail in flight (or ended, not yet joined): what the rounds between batches
        wait for without taking its failure away from ``join``."""
        return self._future

    def busy(self) -> bool:
        """A tail is in flight (started, not finished)."""
        return self._future is not None and not self._future.done()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the tail in flight (if any) and forget it; its exception is raised here
        (once). ``TimeoutError`` when it does not end within ``timeout`` (it is kept)."""
        future = self._future
        if future is None:
            return
        try:
            future.result(timeout)
        finally:
            if future.done():
                self._future = None
                self._thread = None

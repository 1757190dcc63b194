"""The node's index engine as the parts of its index service share it.

``EngineHost`` is built by ``IndexService`` and handed to the parts it composes (the
pipeline's routes ``IndexDelivery``, partition moves ``SliceMoves``, the scan routes
``IndexScanServer``) instead of the service itself: each reaches the engine, the thread its
calls run on and the service's incarnation here, and none of them reaches the service.

* The engine is synchronous: its calls run in one I/O thread (serialised with each other),
  or inline on the loop when ``inline_io`` is set (the simulator forbids threads; its engine
  is in memory). ``run`` is that hand-off.
* ``lock`` serialises what changes the set of slices (allocate, drop, reconcile, a move's
  prepare and drop) with the reads of that set made around those calls.
* ``incarnation``: a random id picked at every ``open``. The mutation queues live in memory,
  so a delivery is only good for the incarnation that queued it.
* ``listeners``: called with an index id when its slices' snapshots, stability or state may
  have changed (stabilise, publish, rollback, drop, a move): scans waiting on it re-check.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from shardex.errors import NodeUnavailable
from shardex.meta.index_definition import IndexDefinition
from shardex.runtime.thread_names import os_thread_namer

__all__ = ["EngineHost", "SliceEngine"]

T = TypeVar("T")


class SliceEngine(Protocol):
    """What the service needs of an engine (``IndexerEngine``, or the simulator's fake)."""

    def create_slice(self, definition: IndexDefinition, partition: int) -> Any: ...

    def drop_index(self, index_id: str) -> int: ...

    def drop_slice(self, index_id: str, partition: int) -> bool: ...

    def slices(self, index_id: str | None = None) -> list[Any]: ...

    def close(self) -> None: ...


class EngineHost:
    """The engine of node ``name`` once open, its I/O thread, lock, incarnation and
    listeners (module docstring)."""

    def __init__(
        self, name: str, factory: Callable[[], SliceEngine], *, inline_io: bool = False
    ) -> None:
        self.name = name
        self.inline_io = inline_io
        self._factory = factory
        self._engine: SliceEngine | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.lock = asyncio.Lock()
        self.incarnation = uuid.uuid4().hex  # a new one at every open
        self.listeners: list[Callable[[str], None]] = []

    @property
    def engine(self) -> SliceEngine:
        if self._engine is None:
            raise NodeUnavailable(
                f"the index service of {self.name} is not running", details={"node": self.name}
            )
        return self._engine

    @property
    def is_open(self) -> bool:
        return self._engine is not None

    async def open(self) -> SliceEngine:
        """A new incarnation, the I/O thread, then the engine (opened in that thread)."""
        self.incarnation = uuid.uuid4().hex
        if not self.inline_io:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1,
                thread_name_prefix=f"index-io-{self.name}",
                # named: per-thread CPU in bench.diagnostics.pipeline_cpu
                initializer=os_thread_namer("index-io"),
            )
        self._engine = await self.run(self._factory)
        return self._engine

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await self.run(engine.close)
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True)

    def close_now(self) -> None:
        """Close the engine synchronously (a simulated crash: tasks are already cancelled)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the I/O thread (inline with ``inline_io``)."""
        if self.inline_io:
            return fn(*args)
        if self._executor is None:
            raise NodeUnavailable(f"the index service of {self.name} is not running")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def notify(self, index_ids: Iterable[str]) -> None:
        """Tell the listeners the slices of ``index_ids`` may have changed."""
        for index_id in index_ids:
            for listener in self.listeners:
                listener(index_id)

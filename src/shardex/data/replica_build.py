"""Building a replica copy from its active's snapshot, when its change log cannot serve.

A replica copy is normally fed from its active's change log from wherever it stands, seqno 0
included (``replica_sender.py``). When the active's retention has purged changes the copy
still needs, the active's sender asks for a build (``ReplicaRun.rebuild``): this node pulls a
consistent snapshot of the active's partition with the migration's chunked copy (``CopyOpen``
/ ``CopyChunk`` into one SST, ``migration_target.pull_chunks``), installs it and makes it a
replica copy at the snapshot's seqno, on the active's branch; the sender then goes on from
there. One build per partition at a time; a failed one is retried when the sender asks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from shardex.api.migration import DEFAULT_CHUNK_BYTES, CopyClose, CopyOpen, CopyOpened
from shardex.data.engine import DataEngine
from shardex.data.migration_target import PULL_TIMEOUT, pull_chunks
from shardex.errors import ShardexError
from shardex.net import ConnectionPool

log = logging.getLogger(__name__)

RunInExecutor = Callable[..., Awaitable[Any]]


class ReplicaBuilds:
    """The snapshot builds of this node's replica copies in flight."""

    def __init__(
        self,
        *,
        engine: Callable[[], DataEngine],
        run: RunInExecutor,
        pool: ConnectionPool,
        address: Callable[[str], str],
        placement_lock: asyncio.Lock,
    ) -> None:
        self._engine = engine
        self._run = run
        self._pool = pool
        self._address = address
        self._lock = placement_lock
        self.running: dict[tuple[str, int], asyncio.Task[None]] = {}

    def start(self, keyspace: str, partition: int, source: str) -> None:
        key = (keyspace, partition)
        if key in self.running:
            return
        task = asyncio.get_running_loop().create_task(
            self._build(keyspace, partition, source), name=f"replica-build {keyspace}/{partition}"
        )
        self.running[key] = task
        task.add_done_callback(lambda _t: self.running.pop(key, None))

    async def stop(self) -> None:
        tasks = list(self.running.values())
        self.running.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _build(self, keyspace: str, partition: int, source: str) -> None:
        engine = self._engine()
        started = time.monotonic()
        try:
            conn = await self._pool.get(self._address(source), PULL_TIMEOUT)
            opened = await conn.request(
                CopyOpen(
                    migration_id=f"replica-{uuid.uuid4().hex[:12]}",
                    keyspace=keyspace,
                    partition=partition,
                ),
                PULL_TIMEOUT,
                expect=CopyOpened,
            )
            try:
                copy = await self._run(engine.begin_ingest, keyspace, partition, opened.info)
                try:
                    await pull_chunks(conn, opened.session, copy, self._run, 0, DEFAULT_CHUNK_BYTES)
                    async with self._lock:
                        await self._run(copy.finish)
                        await self._run(engine.replicas.adopt_pending, keyspace, partition)
                except BaseException:
                    await self._run(copy.abort)
                    raise
            finally:
                with contextlib.suppress(ShardexError):
                    await conn.request(CopyClose(session=opened.session), PULL_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("building the replica copy of %s/%d failed: %s", keyspace, partition, exc)
            return
        log.info(
            "built the replica copy of %s/%d from %s's snapshot: %d items, seqno %d, %.2fs",
            keyspace,
            partition,
            source,
            copy.items,
            opened.info.high_seqno,
            time.monotonic() - started,
        )

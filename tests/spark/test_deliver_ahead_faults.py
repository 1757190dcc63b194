"""Deliver ahead under a real fault (``pipeline/rounds/deliver_ahead.py``): an indexer node killed
with SIGKILL and restarted right after it took rows delivered ahead of their batch (a
``DeliverKeyVersions`` with batch id -1). The new process never saw them; the batch's round
names the old incarnation, is refused (STALE_DELIVERY), and its retry drops and delivers
everything: when writes stop, the published stability TS covers the high seqnos and the
oracle holds. The cluster, writer and helpers are ``test_pipeline_faults.py``'s."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import wait_for
from pipeline_helpers import Writer
from test_pipeline_faults import (  # noqa: F401  (``env``: the module-scoped cluster fixture)
    KEYSPACE,
    Env,
    Retries,
    check_all,
    env,
    slice_nodes,
    wait_progress,
)

from shardex.client import Client, connect_local
from shardex.index.delivery_messages import DeliverKeyVersions
from shardex.net.messages import Message
from shardex.node.state import pid_alive
from shardex.pipeline import indexers
from shardex.pipeline.maintain import MaintenanceJob


@pytest.fixture(scope="module", autouse=True)
def stability_at_batch_ends() -> Iterator[None]:
    """Deliver-ahead is what this module tests: the jobs stabilise at Spark's batch ends
    only (``stabilise_ahead=False``). The default since session 8 runs stability rounds
    between batches instead, which deliver nothing early. Autouse and module-scoped, so it
    is in place before ``env`` starts the driver."""
    original = MaintenanceJob.__init__

    def init(self: MaintenanceJob, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stabilise_ahead", False)
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MaintenanceJob, "__init__", init)
        yield


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_indexer_restarted_after_an_early_delivery(
    env: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = env.client
    assert "node2" in slice_nodes(client, "by_name") | slice_nodes(client, "by_age")
    fired = threading.Event()
    armed = [True]
    to_node = indexers.to_node

    def kill_and_restart() -> None:
        pid = env.cluster.pid(2)
        assert pid is not None and pid_alive(pid)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, 0.05, "node2 gone")
        env.cluster.start()  # only the node that is not running

    async def wrapped(
        c: Client, node: str, msg: Message, expect: type[Any], timeout: Any = None
    ) -> Any:
        reply = await to_node(c, node, msg, expect, timeout)
        early = isinstance(msg, DeliverKeyVersions) and msg.batch_id == -1
        if armed[0] and node == "node2" and early and msg.rows:
            armed[0] = False
            await asyncio.to_thread(kill_and_restart)  # off the client's event loop
            fired.set()
        return reply

    monkeypatch.setattr(indexers, "to_node", wrapped)
    retries = Retries()
    logging.getLogger("shardex.pipeline.batch_steps").addHandler(retries)
    try:
        with (
            connect_local(env.path, name="writer") as wclient,
            Writer(wclient, KEYSPACE, 31) as w,
        ):
            assert fired.wait(240), "no rows delivered ahead to node2"
            wait_progress(client, 180, "batches after node2's restart")
            # Some more writes after the restarted node's first rounds, then stop the writer.
            more = w.done + 50
            deadline = time.monotonic() + 60
            while w.done < more:
                assert time.monotonic() < deadline, "the writer stalled after the restart"
                time.sleep(0.05)
    finally:
        logging.getLogger("shardex.pipeline.batch_steps").removeHandler(retries)
    counts = check_all(client)
    stale = [m for m in retries.messages if "STALE_DELIVERY" in m]
    print(f"\nkill -9 node2 after an early delivery: {w.done} mutations, {counts}, {stale[:1]}")
    # The round that counted on node2's early rows was refused and retried in full.
    assert stale, "the round after node2's restart was not refused as STALE_DELIVERY"

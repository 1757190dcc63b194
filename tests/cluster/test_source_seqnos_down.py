"""``latestOffset`` with a data node down (``source/seqnos.py``, ``partial``): the partitions
no owner can answer for stay where the stream is, the others advance, and the query is not
failed by it (it used to raise NODE_UNAVAILABLE from the gathered fallback, which made the
driver restart the whole query from its checkpoint for a node that comes back in seconds)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from cluster_helpers import pid_alive, wait_for
from data_helpers import docids_in, running_cluster

from shardex.client import connect_local
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.pipeline.source.options import SourceOptions
from shardex.pipeline.source.stream import _OffsetSource

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

KEYSPACE = "seqnos_down"
NUM_PARTITIONS = 12


def test_latest_offset_leaves_a_down_owners_partitions_where_they_are(tmp_path: Path) -> None:
    path = tmp_path / "cluster"
    with running_cluster(path, nodes=3) as cluster, connect_local(path) as client:
        desc = client.create_keyspace(KEYSPACE, num_partitions=NUM_PARTITIONS)
        ks = client.keyspace(KEYSPACE)
        for p in range(NUM_PARTITIONS):
            for d in docids_in(p, NUM_PARTITIONS, 2, f"a{p}-"):
                ks.upsert(d, {"p": p})
        offsets = _OffsetSource(
            SourceOptions.parse(
                {
                    "cluster_dir": str(path),
                    "keyspace": KEYSPACE,
                    "high_seqnos": "owners",
                    "latest_offset_interval_ms": "0",
                }
            )
        )
        start = offsets.next_end(Timestamp({}), None)
        down = set(desc.partitions_of("node3"))
        assert down and all(start.seqno(p) > 0 for p in range(NUM_PARTITIONS))

        pid = cluster.pid(3)
        assert pid is not None and pid_alive(pid)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="node3 gone")
        live = [p for p in range(NUM_PARTITIONS) if p not in down]
        for p in live:
            for d in docids_in(p, NUM_PARTITIONS, 1, f"b{p}-"):
                ks.upsert(d, {"p": p, "again": True})
        # Before the failure timeout (3 s) can move anything: node3's partitions have no
        # owner that answers, by either way of asking.
        with pytest.raises(ShardexError):
            client.high_seqnos(KEYSPACE)
        end = offsets.next_end(start, None)
        assert offsets._owner_seqnos is not None and offsets._owner_seqnos.partial >= 1
        assert sorted(end) == list(range(NUM_PARTITIONS))
        for p in down:
            assert end.get(p) == start.get(p), f"partition {p} of the down node moved"
        for p in live:
            assert end.seqno(p) == start.seqno(p) + 1, f"partition {p} did not advance"
        offsets.close()

"""A restored keyspace's indexes are built by the running pipeline and equal the oracle.

On the shared cluster (pipeline running): a keyspace with a partitioned index, an array
index and a primary index is backed up in full, changed by a writer while an incremental is
taken, and restored into a keyspace of another partition count; the recreated indexes are
built by the pipeline and every slice equals the definition evaluated over the restored
documents (``check_oracle``), which equal the source's documents at the backup's vector."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline_helpers import Writer, check_oracle, documents_at, mutate, wait_stable

from shardex.backup.repo import INCREMENTAL
from shardex.backup.restore import restore_backup
from shardex.backup.take import create_backup
from shardex.core.timestamp import Timestamp

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

SRC, DST = "bk_src", "bk_dst"
INDEXES = ["by_city", "by_tag", "#primary"]
WAIT = 240.0


def test_restored_indexes_are_built_and_equal_the_oracle(
    shared_cluster: SharedCluster, tmp_path: Path
) -> None:
    client = shared_cluster.client
    repo = tmp_path / "repo"
    with shared_cluster.keyspace(SRC, 8), shared_cluster.keyspace(DST, 5):
        mutate(client, SRC, random.Random(3), 600)
        client.create_index(
            SRC, "by_city", ["city", "age DESC"], partition_by=["META().id"], num_partition=3
        )
        client.create_index(SRC, "by_tag", ["DISTINCT ARRAY t.k FOR t IN tags END", "name"])
        client.create_index(SRC, None, primary=True)
        create_backup(client, repo)
        with Writer(client, SRC, seed=5):
            mutate(client, SRC, random.Random(4), 300)  # at least these, beside the writer's
            manifest = create_backup(client, repo)
        entry = manifest.keyspaces[SRC]
        assert {e.kind for e in entry.partitions.values()} == {INCREMENTAL}
        vector = Timestamp(entry.vector)
        expected = documents_at(client, SRC, vector)

        (result,) = restore_backup(client, repo, keyspace=SRC, to_keyspace=DST)
        assert not result.created_keyspace  # restored into the existing 5-partition one
        assert sorted(result.indexes_created) == sorted(INDEXES)
        for name in INDEXES:
            client.wait_for_index(DST, name, "ACTIVE", timeout=WAIT)
        ts = wait_stable(client, DST, INDEXES, timeout=WAIT)
        assert documents_at(client, DST, ts) == expected
        for name in INDEXES:
            assert check_oracle(client, DST, name, ts) > 0

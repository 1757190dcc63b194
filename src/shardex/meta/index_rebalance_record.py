"""The replicated record of one index-partition move (``RebalanceRecord.index_moves``).

Kept apart from ``rebalance_state`` (which imports it) so the record has no dependency on
the data-move rules. Two kinds: a ``move`` hands the source's copy of the partition to the
target (the source leaves the partition's chain), an ``add`` builds one more copy on the
target the same way and the source keeps its own (index replicas restored,
``index_copy_plan``). Statuses are the data moves' strings (``rebalance_state``)::

    planned --> moving --> done      (index topology seq_num + 1 published in the same commit)
       |          '------> failed    (target died, source died, copy refused, master failover)
       '--> cancelled                (never started: the rebalance was interrupted)

``routing`` is the second commit of a move: the target has allocated its catching-up slice,
so the pipeline may now send the partition's key versions to source AND target. Before it,
the router must not (rows for a slice the target does not hold yet would be dropped there).
"""

from __future__ import annotations

import msgspec

__all__ = ["ADD", "MOVE", "IndexMoveRecord"]

MOVE = "move"  # the target replaces the source in the partition's chain
ADD = "add"  # the target joins the chain as a replica; the source keeps its copy


class IndexMoveRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One index partition copied from indexer ``source`` to indexer ``target``: moved
    there, or added there as one more copy (``kind``)."""

    migration_id: str
    index_id: str
    index_name: str
    keyspace: str
    partition: int  # index partition
    source: str
    target: str
    base_seq: int  # the index topology seq_num the move was planned on
    status: str = "planned"
    kind: str = MOVE  # MOVE or ADD
    routing: bool = False  # the pipeline sends the partition to both source and target
    topology_seq: int = 0  # the index topology that published it (done)
    copy_ts: dict[int, tuple[int, int]] | None = None  # T1: the source's applied TS copied
    error: str = ""
    items: int = 0  # entries copied
    bytes: int = 0
    copy_seconds: float = 0.0
    seconds: float = 0.0

"""Pipeline driver -> timekeeper: the end of a micro-batch (the mutation flow's steps 12-16)."""

from __future__ import annotations

import msgspec

from shardex.api.delivery import Stabilised, WireTs
from shardex.net.messages import Message

__all__ = ["AdvanceStability", "StabilityAdvanced", "StabilityReply", "StabilityRequest"]


class AdvanceStability(Message, tag="manager.AdvanceStability"):
    """Stabilise ``index_ids`` of ``keyspace`` at ``ts`` (the batch's end offset) on every
    indexer hosting them, wait for all ACKs, then publish ``ts`` as their stability TS.
    ``incarnations``: node -> the indexer incarnation the batch was delivered to. With
    ``stabilised`` the indexers were stabilised already: only check and publish."""

    keyspace: str
    ts: WireTs
    index_ids: list[str]
    batch_id: int = -1
    incarnations: dict[str, str] = msgspec.field(default_factory=dict)
    # index id -> index partition -> target indexer of a move: this batch was routed to
    # the target too, so the target takes part in the round (not in the publish check)
    moving: dict[str, dict[int, str]] = msgspec.field(default_factory=dict)
    # node -> the indexer's reply, when the pipeline stabilised the indexers itself
    # (``DeliverAndStabilise``): the timekeeper checks them instead of sending its own round
    stabilised: dict[str, Stabilised] | None = None


class StabilityAdvanced(Message, tag="manager.StabilityAdvanced"):
    keyspace: str
    ts: WireTs
    published: list[str]  # index ids whose stability TS is now ``ts``
    items_count: dict[str, int]  # index id -> entries over all slices at ``ts``
    skipped: list[str] = msgspec.field(default_factory=list)  # not in a stabilisable state
    # index id -> (index partition, node) of the copies that missed the round and were taken
    # out of the index topology before ``ts`` was published without them
    dropped_copies: dict[str, list[tuple[int, str]]] = msgspec.field(default_factory=dict)


class StabilityRequest(Message, tag="manager.StabilityRequest"):
    """The stability TS this timekeeper last published for each index of a keyspace."""

    keyspace: str


class StabilityReply(Message, tag="manager.StabilityReply"):
    stability: dict[str, WireTs]

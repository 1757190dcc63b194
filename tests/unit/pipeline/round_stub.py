"""A stand-in for ``run_round`` (``pipeline/rounds/sender.py``) made of two models: the
indexers' side of a round (delivery and stabilise, returning the delivery report and each
node's reply) and the timekeeper's (its check and publish of those replies). The job tests
model each side apart and patch the pair into ``batch_steps``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardex.core.timestamp import Timestamp
from shardex.pipeline.rounds.machine import RoundDone, RoundEnds

__all__ = ["round_of"]


def round_of(deliver: Callable[..., Any], advance: Callable[..., Any]) -> Callable[..., Any]:
    """``deliver(client, keyspace, batch_id, ts, by_node, plan, moving, slices=..., **how)``
    -> (report, replies); ``advance(client, keyspace, ts, index_ids, **kw)`` ->
    ``StabilityAdvanced`` (``advance_stability``'s arguments)."""

    def run(
        client: Any,
        keyspace: str,
        batch_id: int,
        end: RoundEnds,
        *,
        timekeeper: str = "",
        drop_above: Any = None,
        sender: Any = None,
    ) -> tuple[RoundDone, float]:
        how = {"drop_above": drop_above} if sender is None else {"sender": sender}
        report, replies = deliver(
            client, keyspace, batch_id, end.ts, end.by_node, end.plan, end.moving,
            slices=end.slices, **how,
        )  # fmt: skip
        reply = advance(
            client, keyspace, end.ts, list(end.index_ids), batch_id=batch_id,
            timekeeper=timekeeper, moving=dict(end.advance_moving), stabilised=replies,
        )  # fmt: skip
        ts = Timestamp.from_wire(reply.ts)
        return RoundDone(ts, list(reply.published), list(reply.skipped), report), 0.0

    return run

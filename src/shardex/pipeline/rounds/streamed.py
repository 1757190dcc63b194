"""A batch's round begun while the batch is still read and projected.

A large batch on the driver (a backlog drained after a restart, or a batch taking over from
rounds between batches that stopped) used to read and project all its changes and only then
deliver them: two phases of similar length one after the other (read + project ~270 ms and
deliver + stabilise ~300 ms for 20,000 changes into two indexes). The indexers do most of
their work for a row when it arrives (``index/slice_decisions.py``: the back-index read and the
decision happen on arrival, the stabilise only writes), so sending each projected group as
soon as the next one is projected lets the indexers decide one group while the driver
projects the next.

``StreamedRound.offer`` takes the batch's rows group by group, in the order the batch lists
them, and holds the newest group back: a batch of one group (every small one) sends nothing
early and its round is the usual single ``DeliverAndStabilise`` per indexer. A held group is
sent when the next arrives: the rows not applied (``not_applied`` with the batch's applied
TSs, as the batch filters its whole list), routed by the batch's views, queued on the nodes
by the round's ``RoundSender`` (``sender.py``). The rows sent are then a prefix of the
batch's filtered list (the filter keeps order and decides row by row), so the round sends
only ``rest(rows)`` with the same sender, whose frames carry the round's ``drop_above``
first and name the incarnation that took them (a restarted indexer refuses: STALE_DELIVERY,
and the retry delivers every row). Nothing is stabilised before the round's end: the early
frames only queue.

``begin`` runs once, before the first row is sent: it raises the registry's ahead TS and
marks the round unpublished (``BatchSteps._attempt`` does the same before its own sends), so
a batch that sends nothing early changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import ERROR, KeyVersion
from shardex.pipeline.project.router import IndexRoute, route
from shardex.pipeline.rounds.between import not_applied
from shardex.pipeline.rounds.sender import RoundSender

__all__ = ["StreamedRound"]


class StreamedRound:
    """The early part of one round: see the module doc."""

    def __init__(
        self,
        sender: RoundSender,
        routes: Mapping[str, IndexRoute],
        applied: dict[str, Timestamp],
        begin: Callable[[], None],
        *,
        dropped: bool,
    ) -> None:
        self.sender = sender
        self.routes = routes
        self.applied = applied
        self.dropped = dropped  # the sender's first frames drop above the batch's start
        self._begin: Callable[[], None] | None = begin
        self._held: list[KeyVersion] | None = None
        self.count = 0  # rows of the batch's filtered list sent so far (a prefix of it)
        self.key_versions = 0  # routed key versions sent so far (broadcasts expanded)
        self.groups = 0  # groups sent early

    def offer(self, rows: list[KeyVersion]) -> None:
        """The batch's next rows (unfiltered): the group held back so far is sent now."""
        if self._held:
            self._send(self._held)
        self._held = rows

    def _send(self, raw: list[KeyVersion]) -> None:
        rows = not_applied(raw, self.applied)
        self.count += len(rows)
        routes = self.routes
        routed = route((r for r in rows if r[0] in routes or r[2] == ERROR), routes)
        by_node = {n: v for n, v in routed.by_node.items() if v}
        if not by_node:
            return
        if self._begin is not None:
            self._begin()
            self._begin = None
        self.key_versions += sum(len(v) for v in by_node.values())
        self.groups += 1
        self.sender.send(by_node)

    @property
    def started(self) -> bool:
        """Some rows went to the indexers: the round must be finished with this sender."""
        return self._begin is None

    def rest(self, rows: list[KeyVersion]) -> list[KeyVersion]:
        """Of the batch's filtered rows, those not sent yet."""
        return rows[self.count :]

    def abandon(self) -> None:
        self.sender.abandon()

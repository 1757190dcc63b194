"""A round's I/O: ``RoundMachine`` (``machine.py``) run on the client's loop.

``RoundSender`` feeds the machine its events and carries out its instructions with the
client's RPC session (``Client.rpc``): a frame to an indexer, the timekeeper's check and
publish, the round's end. The machine holds every rule (frames one after the other per
node, the drop on each node's first frame, later frames naming the incarnation that took
the first, STALE_DELIVERY for a restart between them, which replies the timekeeper checks);
this module only moves messages.

The round's hot path stays one step of the loop per frame: a reply is handed to the machine
in the task that awaited it, and the same node's next frame (or the timekeeper, after the
last stabilise) is sent from that task; only the instructions for other nodes (rows that
arrived while a node was idle) start tasks of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence

from shardex.api.delivery import MAX_ROWS_PER_FRAME, DeliverAndStabilise
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.client import Client
from shardex.errors import ShardexError
from shardex.index.keyversion import KeyVersion
from shardex.pipeline.indexers import ADVANCE_TIMEOUT, to_node
from shardex.pipeline.rounds.machine import (
    Advanced,
    AdvanceFailed,
    AskTimekeeper,
    Instruction,
    MoreRows,
    NodeFailed,
    NodeReplied,
    RoundDone,
    RoundEnds,
    RoundEvent,
    RoundFailed,
    RoundMachine,
    RoundSpec,
    SendToIndexer,
)

__all__ = ["RoundSender", "run_round"]


class RoundSender:
    """One round on the client's loop. ``send`` (from any thread, without waiting) queues
    rows on their nodes while the round's later rows are still being read and projected
    (``streamed.py``); ``finish`` ends the round: each node's last rows with the stabilise,
    then the timekeeper. A failure surfaces in ``finish``."""

    def __init__(
        self,
        client: Client,
        keyspace: str,
        batch_id: int,
        *,
        drop_above: Mapping[int, int] | None = None,
    ) -> None:
        self.client = client
        # Frames cut at the module's ``MAX_ROWS_PER_FRAME``, read per round (a fault test
        # makes frames small to open the window between a round's frames).
        spec = RoundSpec(keyspace, batch_id, drop_above=drop_above, frame_rows=MAX_ROWS_PER_FRAME)
        self.machine = RoundMachine(spec)
        self.timekeeper = ""  # the node to ask ("": the one the client talks to)
        self.stabilise = 0.0  # seconds the timekeeper's check and publish took
        self._loop = client.rpc.loop
        # What ended the round: the machine's last instruction, or an error that is no
        # refusal or transport failure (raised from ``finish`` as it is).
        self._outcome: asyncio.Future[RoundDone | RoundFailed | BaseException] = (
            self._loop.create_future()
        )
        self._tasks: set[asyncio.Task[None]] = set()  # sends under way (on the loop only)

    def send(self, by_node: Mapping[str, Sequence[KeyVersion]]) -> None:
        """Queue these rows on their nodes, after what was sent before (returns at once)."""
        rows = {n: v for n, v in by_node.items() if v}
        if rows:
            self._loop.call_soon_threadsafe(self._feed, MoreRows(rows))

    def finish(self, end: RoundEnds, *, timekeeper: str = "") -> RoundDone:
        """The round's last rows, its stabilise and the timekeeper's check and publish:
        see ``run_round``. Raises the error that failed the round."""
        self.timekeeper = timekeeper

        async def go() -> RoundDone | RoundFailed | BaseException:
            self._feed(end)
            return await self._outcome

        out = self.client.rpc.run(go())
        if isinstance(out, RoundDone):
            return out
        raise out.error if isinstance(out, RoundFailed) else out

    def abandon(self) -> None:
        """The round will not be finished (its batch failed): stop sending its frames."""

        def cancel() -> None:
            for task in list(self._tasks):
                task.cancel()

        with contextlib.suppress(RuntimeError):  # the client's loop is closed: nothing runs
            self._loop.call_soon_threadsafe(cancel)

    # -- on the client's loop ---------------------------------------------------------------

    def _feed(self, event: RoundEvent) -> None:
        for ins in self.machine.handle(event):
            self._start(ins)

    def _start(self, ins: Instruction) -> None:
        if self._outcome.done():
            return  # ended by an unexpected error: nothing more goes out
        if isinstance(ins, RoundDone | RoundFailed):
            self._outcome.set_result(ins)
            return
        task = self._loop.create_task(self._perform(ins))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _perform(self, first: SendToIndexer | AskTimekeeper) -> None:
        """Carry out ``first``, and in this same task what follows from its outcome while
        that is the same node's next frame or the timekeeper (see the module doc)."""
        ins: SendToIndexer | AskTimekeeper | None = first
        while ins is not None and not self._outcome.done():
            try:
                event = await self._carry_out(ins)
                instructions = self.machine.handle(event)
            except Exception as exc:  # no refusal or transport failure: the round ends
                if not self._outcome.done():
                    self._outcome.set_result(exc)
                return
            node = ins.node if isinstance(ins, SendToIndexer) else None
            ins = None
            for nxt in instructions:
                if ins is None and (
                    isinstance(nxt, AskTimekeeper)
                    or (isinstance(nxt, SendToIndexer) and nxt.node == node)
                ):
                    ins = nxt
                else:
                    self._start(nxt)

    async def _carry_out(self, ins: SendToIndexer | AskTimekeeper) -> RoundEvent:
        if isinstance(ins, SendToIndexer):
            # A stabilise writes and syncs every slice of the node: allow for a slow disk.
            timeout = ADVANCE_TIMEOUT if isinstance(ins.message, DeliverAndStabilise) else None
            try:
                reply = await to_node(self.client, ins.node, ins.message, ins.expect, timeout)
            except ShardexError as exc:
                return NodeFailed(ins.node, exc)
            return NodeReplied(ins.node, reply)
        t = time.perf_counter()
        try:
            advanced = await self._ask_timekeeper(ins.message)
        except ShardexError as exc:
            return AdvanceFailed(exc)
        finally:
            self.stabilise = time.perf_counter() - t
        return Advanced(advanced)

    async def _ask_timekeeper(self, msg: AdvanceStability) -> StabilityAdvanced:
        if self.timekeeper:
            return await to_node(
                self.client, self.timekeeper, msg, StabilityAdvanced, ADVANCE_TIMEOUT
            )
        conn = await self.client.rpc.connection()
        return await conn.request(msg, ADVANCE_TIMEOUT, expect=StabilityAdvanced)


def run_round(
    client: Client,
    keyspace: str,
    batch_id: int,
    end: RoundEnds,
    *,
    timekeeper: str = "",
    drop_above: Mapping[int, int] | None = None,
    sender: RoundSender | None = None,
) -> tuple[RoundDone, float]:
    """One round trip per indexer (in parallel): each node of ``end.plan`` (node -> the
    index ids it hosts) gets its rows and the stabilise at ``end.ts`` in one
    ``DeliverAndStabilise``; rows beyond one frame go ahead as ``DeliverKeyVersions`` and
    the last frame names the incarnation that took them. ``end.slices``: node -> index id ->
    the partitions its round stabilises there, from the topology the rows were routed by (an
    indexer leaves its other slices alone). Then the timekeeper on node ``timekeeper`` (the
    coordinator master, so every round of a keyspace meets the same one; "" = the node the
    client talks to) checks the replies and publishes. Returns the round's outcome and the
    seconds the timekeeper took; raises what failed it.

    ``drop_above``: every node of the round first forgets its queued versions of these data
    partitions above these seqnos (rows queued by a round this query does not know of:
    ``rounds/cleaned.py``). ``sender``: the round's frames sent so far (``RoundSender.send``),
    which then holds ``drop_above``; ``end.by_node`` is what they left."""
    if sender is None:
        sender = RoundSender(client, keyspace, batch_id, drop_above=drop_above)
    done = sender.finish(end, timekeeper=timekeeper)
    return done, sender.stabilise

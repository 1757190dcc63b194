"""The durable voter side of the coordinator: one per manager node, master or not.

A ``Replica`` owns the node's ``CoordinatorRecord`` (promise + latest state) and decides, with
no I/O but its store, what to do with a ``StateGather`` or a ``StateReplicate``. Every rule
that makes the protocol safe is here, in a few synchronous lines, so unit tests can drive it
directly and no ``await`` can ever split a check from the write it guards:

* A promise is monotonic: ``StateGather(epoch)`` is granted only if ``epoch`` is above every
  term promised before. A granted promise is persisted before the reply leaves.
* A candidate that is not a voter of the node's state (``StateContext.voters``) gets no
  promise.
* A ``StateReplicate`` from a term below the promise is refused: that master was deposed.
* A state is taken only if its ``cas`` is above the node's own. So a node holds at most one
  state per ``cas``, two majorities always share a node, and hence no two states can both be
  committed at one ``cas``. A state from a newer term whose ``cas`` is not above the node's
  (the node kept a change an old master never committed) is refused with the node's ``cas``,
  and the master re-commits above it (``StateReplicateReply`` doc).
* Everything is persisted before it is acknowledged.
"""

from __future__ import annotations

import logging

from shardex.api.coordinator import (
    StateGather,
    StateGatherReply,
    StateReplicate,
    StateReplicateReply,
)
from shardex.meta.state import CoordinatorRecord, StateContext, StateStore, version_of

log = logging.getLogger(__name__)


class Replica:
    """Promise, leader hint and latest state of one manager node, persisted together."""

    def __init__(self, name: str, store: StateStore) -> None:
        self.name = name
        self.store = store
        record = store.load() or CoordinatorRecord()
        self.promised_epoch = record.promised_epoch
        self.leader = record.leader
        self.state = record.state

    def __repr__(self) -> str:
        return (
            f"<Replica {self.name} promised={self.promised_epoch} leader={self.leader} "
            f"epoch={self.state.epoch} cas={self.state.cas}>"
        )

    def _persist(self, promised: int, leader: str | None, state: StateContext) -> None:
        """Write first, then change memory: a failed write (StorageError) changes nothing."""
        self.store.save(CoordinatorRecord(promised_epoch=promised, leader=leader, state=state))
        self.promised_epoch, self.leader, self.state = promised, leader, state

    # -- master side --

    def promise_self(self, epoch: int) -> None:
        """A candidate's own vote for its term (persisted before asking anyone else)."""
        if epoch <= self.promised_epoch:
            raise ValueError(f"epoch {epoch} is not above the promise {self.promised_epoch}")
        self._persist(epoch, self.name, self.state)

    def apply_local(self, state: StateContext) -> None:
        """The master persisting a state it is about to replicate."""
        if state.epoch != self.promised_epoch or state.cas <= self.state.cas:
            raise ValueError(
                f"local apply of epoch {state.epoch} cas {state.cas} over promise "
                f"{self.promised_epoch} cas {self.state.cas}"
            )
        self._persist(self.promised_epoch, self.name, state)

    def observe(self, epoch: int, leader: str | None) -> bool:
        """Learnt from a refusal that term ``epoch`` exists: promise it too (promises only
        ever restrict what this node accepts). Returns True if the promise rose."""
        if epoch > self.promised_epoch:
            self._persist(epoch, leader, self.state)
            return True
        return False

    # -- voter side --

    def on_gather(self, msg: StateGather) -> StateGatherReply:
        voters = self.state.voters
        if msg.epoch <= self.promised_epoch or (voters and msg.candidate not in voters):
            # Not a voter of our state (removed, or admitted later than our copy): refusing
            # is always safe, and keeps a removed manager from deposing the master.
            return StateGatherReply(
                ok=False, promised_epoch=self.promised_epoch, leader=self.leader
            )
        self._persist(msg.epoch, msg.candidate, self.state)
        return StateGatherReply(
            ok=True, promised_epoch=self.promised_epoch, leader=self.leader, state=self.state
        )

    def on_replicate(self, msg: StateReplicate) -> tuple[StateReplicateReply, bool]:
        """(reply, whether the node took the new state)."""
        if msg.epoch < self.promised_epoch:
            return self._reply(False), False
        incoming, mine = msg.state, self.state
        promised = max(self.promised_epoch, msg.epoch)
        if incoming.cas > mine.cas and incoming.epoch >= mine.epoch:
            self._persist(promised, msg.leader, incoming)
            return self._reply(True), True
        if version_of(incoming) <= version_of(mine) and incoming.epoch == mine.epoch:
            # The same state again (a retry), or an older one of the same term overtaken by
            # a later one: this node holds what was asked, or more.
            if (promised, msg.leader) != (self.promised_epoch, self.leader):
                self._persist(promised, msg.leader, mine)
            return self._reply(True), False
        # A newer term at a cas this node has already used (for a state that older term never
        # committed): refuse; the master commits again above our cas.
        if (promised, msg.leader) != (self.promised_epoch, self.leader):
            self._persist(promised, msg.leader, mine)
        log.info(
            "%s: refusing epoch %d cas %d from %s: holding epoch %d cas %d",
            self.name,
            incoming.epoch,
            incoming.cas,
            msg.leader,
            mine.epoch,
            mine.cas,
        )
        return self._reply(False), False

    def _reply(self, ok: bool) -> StateReplicateReply:
        return StateReplicateReply(
            ok=ok,
            promised_epoch=self.promised_epoch,
            leader=self.leader,
            epoch=self.state.epoch,
            cas=self.state.cas,
        )

"""Messages of the replicated coordinator (the protocol is described in ``coordinator.py``).

Public: ``StateRequest`` / ``StateReply`` (any node or client reads the replicated state).
Between manager nodes: ``StateGather`` (a candidate asks for promises and states),
``StateReplicate`` (the master pushes its whole state), ``OpForward`` (an op sent to a
non-master manager travels to the master inside one).
"""

from __future__ import annotations

from shardex.meta.state import StateContext
from shardex.net.messages import Message


class StateRequest(Message):
    """Ask a manager node for the ``StateContext``.

    ``sections``: only these fields (e.g. ``["data_topologies"]``); ``None`` for all.
    ``fresh``: answer from the master's last committed state (one more hop) instead of the
    receiving node's own replicated copy, which may lag a commit in flight or be one
    uncommitted change ahead of it."""

    sections: list[str] | None = None
    fresh: bool = False


class StateReply(Message):
    node: str  # who answered
    master: str | None  # the master as the answering node knows it
    is_master: bool  # the answering node is the master
    state: StateContext


class StateGather(Message):
    """Candidate -> manager: promise term ``epoch`` to me and send me your state."""

    epoch: int
    candidate: str


class StateGatherReply(Message):
    ok: bool  # promised; ``state`` is set
    promised_epoch: int  # the voter's promise after handling the request
    leader: str | None  # who holds ``promised_epoch``, as far as the voter knows
    state: StateContext | None = None


class StateReplicate(Message):
    """Master -> manager: persist ``state`` and acknowledge. Always the whole state."""

    epoch: int
    leader: str
    state: StateContext


class StateReplicateReply(Message):
    """``ok``: the voter holds ``state`` or a later state of the same term.

    Not ok: either the master is stale (``promised_epoch`` is above its term) or the voter
    holds a state with a ``cas`` at least as high from an older term, which the master must
    exceed (``cas`` tells by how much) before the voter can take its state."""

    ok: bool
    promised_epoch: int
    leader: str | None
    epoch: int  # version of the voter's state after handling the request
    cas: int


class OpForward(Message):
    """A registered op (or a fresh ``StateRequest``) forwarded to the master.

    ``frame`` is the original message encoded as a frame, so any registered message type
    travels without this class having to know it."""

    frame: bytes
    origin: str

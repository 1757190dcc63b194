"""The protocol's messages: one small class per message (the specification's operations).

All but ``QueryCheck`` travel one-way (fire and forget, in order per connection); the check
is a request whose response is ``QueryCheckResponse``. The dispatch table that routes them is
``QueryService.routes`` (``shardex.sql.protocol.member``). See docs/protocol.md, "SQL
execution protocol", and ``../shared/seeds/sql-execution-protocol.md``.

Flow control deviates from the specification on one point, on purpose: ``QueryFlowControl``
carries a cumulative ``credit_limit`` (total bytes the sender may have sent on the stream), not the
sender's remaining credits. A remaining-credits value computed by the receiver is wrong by
whatever is in flight when the sender reads it (it would let the sender exceed the window);
a cumulative limit stays correct whatever is in flight. ``QueryBatch.remaining_credits``
keeps the specification's field: the sender's credits left after this batch, for diagnostics.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shardex.api.query_ids import QueryId
from shardex.net.messages import Message

__all__ = [
    "FragmentSpec",
    "QueryBatch",
    "QueryCancel",
    "QueryCheck",
    "QueryCheckResponse",
    "QueryExecute",
    "QueryFlowControl",
    "QueryPlan",
]


class FragmentSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One fragment of a plan: what to run (``kind`` names a factory in every member's
    ``FragmentRegistry``; ``args`` are its arguments), where (one instance per member in
    ``members``), what it reads (edge ids in ``inputs``) and where its rows go (``output``:
    an edge id, or None for the root fragment whose rows go to the caller).

    ``exchange`` says how the output edge reaches the members of the fragment that reads
    it: ``gather`` (that fragment runs on one member, which gets every row), ``broadcast``
    (every batch to each of its members) or ``hash`` (each batch to one of its members: the
    fragment yields ``(partition, batch)`` pairs, ``partition`` the member's position in the
    reader's ``members``, chosen by a hash of the rows' key that every sender computes
    alike)."""

    fragment_id: int
    kind: str
    members: list[str]
    args: dict[str, Any] = {}
    inputs: list[int] = []
    output: int | None = None
    exchange: str = "gather"


class QueryPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Fragments split at exchanges. Each edge (exchange) goes from every instance of one
    fragment to the instances of another: to its single instance (a unicast gather), or to
    each of its instances (broadcast, or hash-partitioned by the sender)."""

    fragments: list[FragmentSpec]


class QueryExecute(Message, tag="sql.QueryExecute"):
    """Initiator -> every participant: start the query now (no synchronisation point)."""

    query_id: QueryId
    participants: list[str]  # fixed for the life of the query
    plan: QueryPlan
    timeout: float  # seconds; the initiator enforces it and cancels everywhere
    window: int  # initial credits (bytes) of every stream, the flow-control window
    parameters: list[Any] | dict[str, Any] = msgspec.field(default_factory=list)


class QueryBatch(Message, tag="sql.QueryBatch"):
    """Sender -> receiver: rows of one stream, ``(query, edge, sender)`` into the receiving
    member, as Arrow IPC bytes.
    ``seq`` numbers the stream's batches from 0 (a gap means a lost batch); the last batch
    of a stream has ``last`` set and may carry no rows (``data`` empty)."""

    query_id: QueryId
    edge_id: int
    sender: str
    seq: int
    data: bytes
    last: bool = False
    remaining_credits: int = 0


class QueryFlowControl(Message, tag="sql.QueryFlowControl"):
    """Receiver -> sender: the stream may carry ``credit_limit`` bytes in total."""

    query_id: QueryId
    edge_id: int
    receiver: str
    credit_limit: int


class QueryCancel(Message, tag="sql.QueryCancel"):
    """Cancel initiator -> query initiator -> every other participant (at most 2N messages).
    ``code`` is an ``ErrorCode`` name; the caller of the query sees this error."""

    query_id: QueryId
    cancel_initiator: str
    code: str
    message: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class QueryCheck(Message, tag="sql.QueryCheck"):
    """Participant -> initiator (request): which of these queries are still running?"""

    sender: str
    suspected: list[QueryId]


class QueryCheckResponse(Message, tag="sql.QueryCheckResponse"):
    """The subset of ``suspected`` the initiator no longer runs: free them."""

    inactive: list[QueryId]

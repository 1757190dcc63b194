"""Execution switches a query may carry (``SqlQuery.tuning``), so a benchmark compares the
fast paths against the plain ones in the same run, on the same data, under the same load.
Every switch defaults to on; turning one off never changes a result, only how it is reached:

* ``index_order``: when the chosen index's order satisfies ORDER BY, leaves stream in index
  order (no local sort) and stop after ``offset + limit`` rows, reading the index in blocks
  of that size; the root merges. Off: leaves sort (top-N) what the spans return.
* ``get_many``: document fetches go to each owner as one ``data.GetMany``. Off: one
  ``data.Get`` per document, 64 in parallel.
* ``plan_cache``: parsed and bound statements are kept by text (an LRU) on every member,
  so a repeated statement is parsed once. Off: parsed on each use.
* ``inline``: small work skips the machinery sized for large results: a key lookup of at
  most ``INLINE_KEYS`` documents runs on the initiator's event loop (no fragment, no
  thread); a fragment whose input ends within a few small chunks runs its operators on
  the loop instead of a thread of its own (``bridge.py``); the first block of result rows
  (all of them when they fit) rides in the ``SqlStarted`` reply. Off: every SELECT runs as
  fragments in threads and every row comes on the stream.
* ``local``: a plan whose one leaf is on its initiator runs in-process (``local_leaf.py``),
  and replies carry routing hints the client follows (the leaf's node, a key's owner).
  Off: every plan with a leaf goes through the protocol, and no hint is given.
* ``speculate``: such a local plan at request_plus reads the newest snapshot while the
  high-seqno round is out, and keeps the rows when that snapshot covers the answer
  (``local_leaf.speculate``). Off: the round first, then the read at a covering snapshot.
* ``exact_spans``: a covering scan whose spans decide the WHERE clause by themselves
  (``planner.exact``, decision 0112) does not evaluate it again on each row. Off: it always does.
* ``late``: an ORDER BY ... LIMIT over several leaves whose index covers everything but
  the projection has its leaves rank index entries without documents and send sort keys
  and docids; the root merges, cuts to the limit and fetches only the documents it returns
  (``late.py``). Off: every leaf fetches the documents of its own top rows.
* ``pin_guess``: a request_plus statement with leaves elsewhere runs at the TS its index was
  pinned at last on this node while the high-seqno round is out, and keeps the rows when
  that TS covers the round's answer (``pin_guess.py``). Off: it pins first, then runs.
* ``key_projection``: a covering scan whose spans decide WHERE and whose every result term
  reads one key part or ``META().id`` makes its leaves' result values straight from the
  decoded keys (``entries.key_projection``). Off: each entry becomes a scope row (its
  rebuilt document) and the projection is evaluated on it.
* ``join_exchange``: an INNER or LEFT hash join whose sides both read through index leaves
  runs in join fragments fed by hash exchanges from the leaves (``join_exchange.py``,
  decision 0135). Off: the initiator joins over side statements (decision 0123).
* ``leaf_calls``: a statement with leaves on other nodes whose result is small (a LIMIT, or
  rows that fit one reply) asks each leaf by one request and gets its rows in the reply,
  then runs its root here (``leaf_calls.py``). Off: its leaves stream through the protocol.
* ``point_read``: a request_plus plan run in-process whose index read ends within a few
  entries, with documents to fetch and a root that passes its rows on, runs its index read,
  fetch and operators as plain calls (``point_read.py``). Off: it runs its leaf pipeline.

Also here: ``BoundedMeter``, the node's ``ExchangeMeter`` that keeps the streams of the last
``METER_QUERIES`` queries only (a real node runs queries forever).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

from shardex.api.query_ids import QueryId
from shardex.api.sql_exec import StreamReport
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.protocol import ExchangeMeter, StreamStats
from shardex.sql.protocol.flow import StreamKey

__all__ = ["METER_QUERIES", "SWITCHES", "BoundedMeter", "check_tuning"]

SWITCHES: Final = (
    "index_order",
    "get_many",
    "plan_cache",
    "inline",
    "local",
    "speculate",
    "exact_spans",
    "late",
    "key_projection",
    "pin_guess",
    "join_exchange",
    "leaf_calls",
    "point_read",
)
METER_QUERIES: Final = 256
_ALL_ON: Final = dict.fromkeys(SWITCHES, True)


def check_tuning(tuning: Mapping[str, bool] | None) -> dict[str, bool]:
    """Every switch with its value (unnamed ones on); BAD_REQUEST for an unknown name or a
    value that is not a boolean. A new dict each call: callers may change theirs."""
    if not tuning:  # what nearly every statement carries: no check to make
        return dict(_ALL_ON)
    if (
        type(tuning) is dict
        and tuning.keys() == _ALL_ON.keys()
        and {*map(type, tuning.values())} == {bool}
    ):  # checked already (a plan's switches planned again): C-level checks, no loop
        return dict(tuning)
    out = dict(_ALL_ON)
    for name, value in tuning.items():
        if name not in out:
            raise ShardexError(
                f"unknown tuning switch {name!r}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": name, "hint": f"one of {', '.join(SWITCHES)}"},
            )
        if not isinstance(value, bool):
            raise ShardexError(
                f"tuning switch {name!r} must be true or false, got {value!r}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": repr(value)[:80], "key": name},
            )
        out[name] = value
    return out


class BoundedMeter(ExchangeMeter):
    """An ``ExchangeMeter`` holding the streams of the ``limit`` most recent queries."""

    def __init__(self, limit: int = METER_QUERIES) -> None:
        super().__init__()
        self.limit = limit
        self._queries: OrderedDict[QueryId, list[StreamKey]] = OrderedDict()

    def _stats(self, key: StreamKey, window: int) -> StreamStats:
        if key not in self.streams:
            q = key[0]
            keys = self._queries.get(q)
            if keys is None:
                keys = self._queries[q] = []
                while len(self._queries) > self.limit:
                    _, old = self._queries.popitem(last=False)
                    for k in old:
                        self.streams.pop(k, None)
            keys.append(key)
        return super()._stats(key, window)

    def of_query(self, query_id: str) -> list[tuple[StreamKey, StreamStats]]:
        """The streams of the query whose ``str(QueryId)`` is ``query_id``."""
        for q, keys in self._queries.items():
            if str(q) == query_id:
                return [(k, self.streams[k]) for k in keys if k in self.streams]
        return []

    def report(self, query_id: str) -> list[StreamReport]:
        """What each stream of that query carried, for an ``ExchangeStats`` request."""
        return [
            StreamReport(
                edge=edge,
                sender=sender,
                window=st.window,
                sent=st.sent,
                consumed=st.consumed,
                max_sender_bound=st.max_sender_bound,
                stalls=st.stalls,
            )
            for (_, edge, sender, _), st in self.of_query(query_id)
        ]

"""Invariant checkers of the SQL execution protocol (one function per invariant).

They read plain data (meters, registries' counts, counters), so a simulated run and a
real-TCP run are checked by the same code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from shardex.sql.protocol import ExchangeMeter, QueryService


def check_flow_control(meter: ExchangeMeter) -> None:
    """Bytes in flight per stream never exceeded its credit window, the sender never sent
    past its credits, and nothing was consumed that was not sent."""
    for key, st in meter.streams.items():
        q, edge, sender, receiver = key
        where = f"stream {q} edge {edge} from {sender} to {receiver}"
        if st.max_in_flight > st.window:
            raise AssertionError(
                f"{where}: {st.max_in_flight} bytes in flight, over the window of {st.window}"
            )
        if st.max_sender_bound > st.window:
            raise AssertionError(
                f"{where}: sender went {st.max_sender_bound} bytes past its granted base, "
                f"over the window of {st.window}"
            )
        if st.consumed > st.sent:
            raise AssertionError(f"{where}: consumed {st.consumed} > sent {st.sent} bytes")


def check_state_freed(services: Mapping[str, QueryService], *, tombstones: bool = False) -> None:
    """Every live member holds no query state: no execution, no initiated query, no held
    batch, no protocol task; with ``tombstones``, no tombstone either (all collected)."""
    leftovers: dict[str, dict[str, int]] = {}
    for host, svc in services.items():
        state = svc.describe()
        if not tombstones:
            state.pop("tombstones")
        busy = {k: v for k, v in state.items() if v}
        if busy:
            leftovers[host] = busy
    if leftovers:
        raise AssertionError(f"query state not freed: {leftovers}")


def check_cancel_messages(services: Iterable[QueryService], participants: int) -> int:
    """At most 2N cancel messages for a query with N participants (the specification's bound for
    cancels through the initiator). Call it on a run of exactly one query. Returns the count."""
    sent = sum(svc.sent["QueryCancel"] for svc in services)
    if sent > 2 * participants:
        raise AssertionError(
            f"{sent} cancel messages for one query of {participants} participants "
            f"(bound 2N = {2 * participants})"
        )
    return sent


def check_rows(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The rows delivered are exactly the expected multiset (no loss, no duplicate)."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sorted(row.items()))

    g, e = Counter(map(key, got)), Counter(map(key, expected))
    if g != e:
        missing = list((e - g).elements())[:5]
        extra = list((g - e).elements())[:5]
        raise AssertionError(
            f"rows differ: got {len(got)}, expected {len(expected)}; "
            f"missing e.g. {missing}, unexpected e.g. {extra}"
        )

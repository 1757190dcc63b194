"""Invariant checkers: one function per invariant, raising ``AssertionError`` with a clear message.

The TigerBeetle pattern (``state_checker.zig``, ``storage_checker.zig``, ...): every test that
touches an invariant ends by calling its checker, so the invariant is written down once. A
checker takes plain data recorded by the scenario (no live objects), so it works the same on
a simulated run and on a real-TCP run.

Add a checker here for each new protocol invariant (index == definition over the documents,
exact pagination under migration, replicas converge to the highest CAS, bytes in flight within
credits, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def check_exactly_once(
    acked: Mapping[str, Any],
    applied: Mapping[str, Sequence[tuple[str, Any]]],
    *,
    issued: Iterable[str] | None = None,
    require_all_acked: bool = False,
) -> None:
    """Requests with retries against servers that deduplicate: exactly-once effects.

    ``acked``: request id -> the response the client accepted.
    ``applied``: server -> its apply log, ``(request id, response it produced)`` in order.
    ``issued``: every request id a client ever sent (optional; enables the checks below).

    Invariants:
    1. no request was applied more than once, on one server or across servers;
    2. every acknowledged request was applied (an ack is a promise);
    3. the response a client accepted is the one the server produced when applying it
       (a retry got the cached answer, not a fresh, different one);
    4. nothing was applied that no client issued;
    5. with ``require_all_acked``, every issued request was acknowledged (liveness once the
       faults stopped).
    """
    where: dict[str, tuple[str, int, Any]] = {}
    for server, log in applied.items():
        for position, (rid, result) in enumerate(log):
            if rid in where:
                first_server, first_pos, _ = where[rid]
                raise AssertionError(
                    f"request {rid!r} applied twice: {first_server}[{first_pos}] and "
                    f"{server}[{position}]"
                )
            where[rid] = (server, position, result)
    for rid, response in acked.items():
        if rid not in where:
            raise AssertionError(f"request {rid!r} was acknowledged but never applied")
        server, position, result = where[rid]
        if response != result:
            raise AssertionError(
                f"request {rid!r}: client accepted {response!r} but {server}[{position}] "
                f"produced {result!r}"
            )
    if issued is None:
        return
    issued_set = set(issued)
    # Sorted: the message must not depend on set iteration order.
    phantom = sorted(rid for rid in where if rid not in issued_set)
    if phantom:
        raise AssertionError(f"applied but never issued: {phantom[:10]}")
    if require_all_acked:
        missing = sorted(rid for rid in issued_set if rid not in acked)
        if missing:
            raise AssertionError(
                f"{len(missing)} of {len(issued_set)} requests never acknowledged: {missing[:10]}"
            )

"""Checker of the replicated coordinator (``shardex.manager.coordinator``).

Like ``checkers.py``: one function, plain recorded data in, ``AssertionError`` with a precise
message out, so the same check ends a simulated run and a real-process run.

A *version* is ``(epoch, cas, digest)``: the master term that produced a state, its change
counter and a content hash (``shardex.meta.state.state_digest``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Version = tuple[int, int, str]  # (epoch, cas, digest)


def check_coordinator(
    *,
    commits: Sequence[tuple[str, Version]],
    applies: Mapping[str, Sequence[Version]],
    finals: Mapping[str, Version],
    acked: Mapping[str, str],
    final_ops: Mapping[str, Sequence[str]],
    issued: Iterable[str] | None = None,
) -> None:
    """Invariants of one run.

    ``commits``: (master, version) of every commit that succeeded, in the order they did.
    ``applies``: node -> every state it applied locally (master commit or replica apply), in
    order, across its restarts. ``finals``: node -> the version it holds at the end, after the
    faults stopped and the cluster settled. ``acked``: op id -> the effect key its reply
    named. ``final_ops``: op id -> every effect key of that op in the final state.
    ``issued``: every op id a client sent (optional).

    1. No two masters commit different states at the same cas.
    2. CAS strictly increases: along each master term's commits, and along every node's
       applies (whose ``(epoch, cas)`` also strictly increases: a node never goes back to an
       older term, nor to a cas it has used).
    3. Each commit is a state its master applied.
    4. Replicas converge: every node ends with the same state, at or above the highest
       committed cas (and equal to that commit if it is the last change).
    5. Every acknowledged op is in the final state exactly once, with the effect its reply
       named; no op is there twice; nothing is there that no client issued.
    """
    by_cas: dict[int, tuple[str, Version]] = {}
    last_of_term: dict[tuple[str, int], int] = {}
    for master, version in commits:
        epoch, cas, digest = version
        seen = by_cas.get(cas)
        if seen is not None and seen[1][2] != digest:
            raise AssertionError(
                f"two different states committed at cas {cas}: {seen[0]} committed "
                f"{seen[1]} and {master} committed {version}"
            )
        by_cas.setdefault(cas, (master, version))
        prev = last_of_term.get((master, epoch))
        if prev is not None and cas <= prev:
            raise AssertionError(
                f"master {master} term {epoch} committed cas {cas} after cas {prev}"
            )
        last_of_term[(master, epoch)] = cas
        if version not in applies.get(master, ()):
            raise AssertionError(f"{master} committed {version} but never applied it")

    for node, log in applies.items():
        for i in range(1, len(log)):
            a, b = log[i - 1], log[i]
            if not (b[1] > a[1] and (b[0], b[1]) > (a[0], a[1])):
                raise AssertionError(
                    f"{node} applied {b} after {a}: cas and (epoch, cas) must strictly increase"
                )

    if finals:
        distinct = sorted(set(finals.values()))
        if len(distinct) != 1:
            raise AssertionError(f"replicas did not converge: {dict(sorted(finals.items()))}")
        final = distinct[0]
        if by_cas:
            top = max(by_cas)
            if final[1] < top:
                raise AssertionError(f"final state {final} is below committed cas {top}")
            if final[1] == top and by_cas[top][1] != final:
                raise AssertionError(
                    f"final state {final} differs from the last commit {by_cas[top]}"
                )

    for op, keys in final_ops.items():
        if len(keys) > 1:
            raise AssertionError(f"op {op!r} applied {len(keys)} times: {list(keys)}")
    for op, key in acked.items():
        keys = list(final_ops.get(op, ()))
        if keys != [key]:
            raise AssertionError(
                f"op {op!r} was acknowledged with {key!r} but the final state has {keys}"
            )
    if issued is not None:
        issued_set = set(issued)
        phantom = sorted(op for op in final_ops if op not in issued_set)
        if phantom:
            raise AssertionError(f"in the final state but never issued: {phantom[:10]}")

"""Histories from a real sequential register, for the checker's randomized tests.

Each process runs calls one after another with random durations; every call takes effect at
one instant strictly inside its window (its linearization point), and the register is
applied in the order of those instants, so the history is linearizable by construction.
Ambiguous calls take effect at their instant or never; pending ones likewise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from shardex.testing.history import CAS_MISMATCH, Operation, OpId

_TICK = 100  # call and return times are multiples of it; instants fall strictly between


@dataclass
class _Call:
    process: int
    key: str
    op: str
    invoke: int
    instant: int
    complete: int
    ambiguous: bool
    pending: bool
    value: Any = None
    status: str | None = "ok"
    result: Any = None


def generate(
    rng: random.Random,
    *,
    processes: int,
    ops: int,
    keys: int,
    ambiguous: float = 0.05,
    failed: float = 0.03,
) -> list[Operation]:
    """A linearizable history of ``ops`` calls over ``keys`` keys from ``processes`` clients.

    Written values are unique across the history (every write and cas writes a fresh int).
    """
    assert processes < _TICK
    clocks = [rng.randint(0, 3) for _ in range(processes)]
    calls: list[_Call] = []
    for n in range(ops):
        p = n % processes if n < processes else rng.randrange(processes)
        invoke = clocks[p]
        complete = invoke + rng.randint(1, 6)
        # distinct instants: processes never share one, and one's calls are sequential
        instant = rng.randint(invoke, complete - 1) * _TICK + p + 1
        clocks[p] = complete + rng.randint(0, 2)
        op = rng.choices(["read", "write", "cas", "delete"], weights=[40, 30, 20, 10])[0]
        calls.append(
            _Call(
                p,
                f"k{rng.randrange(keys)}",
                op,
                invoke * _TICK,
                instant,
                complete * _TICK,
                ambiguous=rng.random() < ambiguous,
                pending=False,
            )
        )
    last = {c.process: c for c in calls}
    for c in last.values():
        c.pending = rng.random() < 0.3  # the process died in its last call

    register: dict[str, Any] = {}
    written: dict[str, list[Any]] = {}
    fresh = iter(range(1, 10**9))
    for c in sorted(calls, key=lambda c: c.instant):
        current = register.get(c.key)
        unsure = c.ambiguous or c.pending
        takes_effect = not unsure or rng.random() < 0.5
        if c.op == "read":
            c.result = current
        elif c.op == "write":
            c.value = next(fresh)
            if not unsure and rng.random() < failed:
                c.status, c.result, takes_effect = "fail", "DURABILITY_IMPOSSIBLE", False
            if takes_effect:
                register[c.key] = c.value
                written.setdefault(c.key, []).append(c.value)
        elif c.op == "delete":
            if takes_effect:
                register.pop(c.key, None)
        else:
            seen = written.get(c.key, [])
            expected = current if rng.random() < 0.6 or not seen else rng.choice([None, *seen])
            c.value = (expected, next(fresh))
            if expected != current:
                c.status, c.result = "fail", CAS_MISMATCH
            elif takes_effect:
                register[c.key] = c.value[1]
                written.setdefault(c.key, []).append(c.value[1])
        if c.pending:
            c.status, c.result = None, None
        elif c.ambiguous:
            c.status, c.result = "info", None

    return [
        Operation(
            OpId(n),
            c.process,
            c.key,
            c.op,  # type: ignore[arg-type]
            c.value,
            c.invoke,
            c.status,  # type: ignore[arg-type]
            c.result,
            None if c.status is None else c.complete,
        )
        for n, c in enumerate(calls)
    ]


def stale_read(ops: list[Operation], rng: random.Random) -> list[Operation] | None:
    """The history with one ok read made to return a value that was overwritten before the
    read began: write W1 of v returned before write W2 was called, and W2 returned before the
    read was called. v is unique to W1, so it is never current in the read's window. None
    when the history has no such read."""
    effects = [
        o
        for o in ops
        if o.status == "ok" and o.op in ("write", "cas", "delete") and o.complete_ns is not None
    ]
    choices = []
    for read in ops:
        if read.op != "read" or read.status != "ok":
            continue
        for w1 in effects:
            if w1.key != read.key or w1.op == "delete":
                continue
            stale = w1.value if w1.op == "write" else w1.value[1]
            overwritten = any(
                w2.key == read.key
                and w1.complete_ns < w2.invoke_ns
                and w2.complete_ns < read.invoke_ns
                for w2 in effects
            )
            if overwritten:
                choices.append((read, stale))
    if not choices:
        return None
    read, stale = rng.choice(choices)
    return [replace(o, result=stale) if o.id == read.id else o for o in ops]


def unwritten_read(ops: list[Operation], rng: random.Random) -> list[Operation] | None:
    """The history with one ok read made to return a value no call ever wrote."""
    reads = [o for o in ops if o.op == "read" and o.status == "ok"]
    if not reads:
        return None
    read = rng.choice(reads)
    return [replace(o, result=-1) if o.id == read.id else o for o in ops]

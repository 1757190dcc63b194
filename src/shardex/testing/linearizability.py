"""Linearizability of a recorded history, per document (a CAS register per key).

The search is Wing & Gong's, with Lowe's just-in-time refinements as Porcupine
(github.com/anishathalye/porcupine, ``checker.go``) implements them:

- The history splits by key and each key is checked alone: linearizability is compositional
  (Herlihy & Wing's locality, Porcupine's P-compositionality), and the search is exponential
  in the number of operations it holds at once.
- A key's calls and returns form one doubly linked list in time order (a call before a return
  at the same instant: touching operations overlap). The operations that may take effect next
  are the calls before the first return still in the list. Linearizing one (the register's
  step accepts it) lifts its call and return out of the list, so the list always holds what
  is left; reaching a return means that operation had to take effect already, so the search
  backtracks: it pops the last linearized operation, puts its entries back (dancing links)
  and tries the next candidate.
- Memoization: a (set of linearized operations, register value) pair already explored is
  never explored again, which keeps the search polynomial on the usual histories.

What each status means here:

- ``ok``: took effect between its call and its return, with the result recorded.
- ``fail``: took no effect and is dropped, except a ``cas`` failed with ``CAS_MISMATCH``: that
  says the value was not ``expected`` at some instant of its window, and it is checked as
  such (so a cas refused while the value did match is caught), as long as it returned
  before the key's first ambiguous call. After that an ambiguous write can explain any
  mismatch, and checking them would keep every ambiguous call alive to the end of the
  history; Knossos drops every failed op. A cas failed for another reason is dropped.
- ``info`` (or still pending): Knossos's rule. The call has no return (it completes at
  infinity), so it never forces a backtrack: it may be linearized at any point after its
  call, or never. A key's search succeeds once every ``ok`` operation is placed. Ambiguous
  reads say nothing and are dropped. An ambiguous write, cas or delete whose resulting value
  no operation observes (no read returned it, no cas expected it) is dropped too: placing it
  can only make later reads harder to explain, so a linearization with it gives one without
  it. For the same reason an ambiguous call expires once every operation observing its
  value is placed: the search stops trying it and the memo forgets whether it was placed.
  Without these, each timed-out write would double the states the search explores for the
  rest of the history.

The result is per key: linearizable (with one linearization), not linearizable (with the
longest linearizable prefix the search reached, the register's value after it, and the
operations that could not go next and why), or unknown when the step or time budget ran out.
"""

from __future__ import annotations

import enum
import json
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shardex.testing.history import CAS_MISMATCH, History, HistoryError, Operation

# register steps, as small ints for the search's inner loop
_READ, _WRITE, _CAS, _DELETE, _MISMATCH = range(5)
_ABSENT = 0  # the interned id of an absent document (every key starts absent)
_CLOCK_EVERY = 4096  # steps between looks at the wall clock


class Verdict(enum.StrEnum):
    LINEARIZABLE = "linearizable"
    VIOLATION = "not linearizable"
    UNKNOWN = "unknown (budget exceeded)"


@dataclass(frozen=True, slots=True)
class Candidate:
    """An operation that could have gone next after the longest prefix, and why it did not."""

    op: Operation
    why: str


@dataclass(frozen=True, slots=True)
class KeyResult:
    """One key's verdict.

    ``linearization``: the whole order found when linearizable; the longest linearizable
    prefix found when not; empty when unknown. ``value_after`` is the document after it.
    ``blocked``: the operation whose return the search reached without a place for it (it
    had to take effect before then); ``candidates``: every operation that could have gone
    next, each with the reason it did not fit.
    """

    key: str
    verdict: Verdict
    checked: int  # operations in the search
    dropped: int  # fail ops, unchecked mismatches, ambiguous reads, unobserved ambiguous writes
    steps: int
    linearization: tuple[Operation, ...] = ()
    value_after: Any = None
    blocked: Operation | None = None
    candidates: tuple[Candidate, ...] = ()
    reason: str = ""

    def describe(self, prefix_lines: int = 20) -> str:
        head = (
            f"key {self.key!r}: {self.verdict} ({self.checked} operations checked, "
            f"{self.dropped} dropped, {self.steps} steps)"
        )
        if self.verdict is Verdict.UNKNOWN:
            return f"{head}: {self.reason}"
        if self.verdict is Verdict.LINEARIZABLE:
            return head
        lines = [head]
        shown = self.linearization[-prefix_lines:] if prefix_lines else ()
        lines.append(
            f"  longest linearizable prefix found: {len(self.linearization)} operations"
            + (f" (the last {len(shown)} shown)" if len(shown) < len(self.linearization) else "")
        )
        lines.extend(f"    {op.describe()}" for op in shown)
        lines.append(f"  value after it: {_text(self.value_after)}")
        if self.blocked is not None:
            lines.append(f"  reached the return of {self.blocked.describe()}")
            lines.append("  no operation could go next:")
        lines.extend(f"    {c.op.describe()}: {c.why}" for c in self.candidates)
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Result:
    """Verdicts for every key of a history."""

    keys: dict[str, KeyResult] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        verdicts = {k.verdict for k in self.keys.values()}
        if Verdict.VIOLATION in verdicts:
            return Verdict.VIOLATION
        if Verdict.UNKNOWN in verdicts:
            return Verdict.UNKNOWN
        return Verdict.LINEARIZABLE

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.LINEARIZABLE

    def violations(self) -> list[KeyResult]:
        return [k for k in self.keys.values() if k.verdict is Verdict.VIOLATION]

    def unknown(self) -> list[KeyResult]:
        return [k for k in self.keys.values() if k.verdict is Verdict.UNKNOWN]

    def describe(self, prefix_lines: int = 20) -> str:
        bad, unknown = self.violations(), self.unknown()
        lines = [
            f"history {self.verdict}: {len(self.keys)} keys, {len(bad)} not linearizable, "
            f"{len(unknown)} unknown"
        ]
        lines.extend(k.describe(prefix_lines) for k in (*bad, *unknown))
        return "\n".join(lines)

    def assert_linearizable(self) -> None:
        """Raise ``AssertionError`` with the explanation unless every key is linearizable."""
        if not self.ok:
            raise AssertionError(self.describe())


def check(
    history: History | Iterable[Operation],
    *,
    max_steps: int = 2_000_000,
    time_budget_s: float | None = 60.0,
) -> Result:
    """Check every key of ``history``; never runs past the budgets.

    ``max_steps``: register steps tried per key before that key is unknown. ``time_budget_s``:
    wall-clock seconds for the whole check (None: no limit); keys left when it runs out are
    unknown.
    """
    if max_steps < 1:
        raise HistoryError(f"max_steps must be positive, got {max_steps}", details={})
    ops = history.operations() if isinstance(history, History) else list(history)
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    by_key: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    return Result(
        {key: _check_key(key, key_ops, max_steps, deadline) for key, key_ops in by_key.items()}
    )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _text(value: Any) -> str:
    return "absent" if value is None else json.dumps(value, sort_keys=True)


class _Search:
    """One key's operations as register steps over interned values, and the entry list."""

    def __init__(self, ops: list[Operation]) -> None:
        self.values: list[Any] = [None]  # id -> a representative value
        self._ids: dict[str, int] = {_canonical(None): _ABSENT}
        self.ops: list[Operation] = []
        self.kind: list[int] = []
        self.arg: list[int] = []  # written value, cas expected, read result
        self.arg2: list[int] = []  # cas new value
        self.definite: list[bool] = []
        # per op, the bitset of ops whose placing expires it (-1: never expires)
        self.expiry: list[int] = []
        self.dropped = 0
        self._select(ops)

    def _id(self, value: Any) -> int:
        return self._ids.setdefault(_canonical(value), len(self.values)) if value is not None else 0

    def _intern(self, value: Any) -> int:
        vid = self._id(value)
        if vid == len(self.values):
            self.values.append(value)
        return vid

    def _select(self, ops: list[Operation]) -> None:
        kept: list[tuple[Operation, int, int, int, bool]] = []
        mismatches: list[Operation] = []
        for op in ops:
            outcome = op.outcome
            if outcome == "ok" and op.complete_ns is None:
                raise HistoryError(
                    f"operation #{op.id} is ok without a completion time", details={"op": op.id}
                )
            if op.op == "read":
                if outcome != "ok":
                    self.dropped += 1
                    continue
                step = (op, _READ, self._intern(op.result), 0, True)
            elif outcome == "fail":
                if op.op == "cas" and op.result == CAS_MISMATCH:
                    mismatches.append(op)
                else:
                    self.dropped += 1
                continue
            elif op.op == "write":
                step = (op, _WRITE, self._intern(op.value), 0, outcome == "ok")
            elif op.op == "delete":
                step = (op, _DELETE, _ABSENT, 0, outcome == "ok")
            else:
                expected, new = op.value
                step = (op, _CAS, self._intern(expected), self._intern(new), outcome == "ok")
            kept.append(step)
        # a mismatch is checked only if it returned before the first ambiguous call: an open
        # ambiguous write explains any later mismatch, and checking those would keep every
        # ambiguous call alive in the search to the end of the history
        first_open = min((op.invoke_ns for op, *_, ok in kept if not ok), default=None)
        for op in mismatches:
            if first_open is None or op.complete_ns < first_open:
                kept.append((op, _MISMATCH, self._intern(op.value[0]), 0, True))
            else:
                self.dropped += 1
        self._keep(kept)

    def _keep(self, kept: list[tuple[Operation, int, int, int, bool]]) -> None:
        """Drops the ambiguous calls nothing can observe and sets when the others expire.

        An ambiguous call's observers are the reads of the value it leaves and the cas that
        expect it, among those that may be linearized after its call (ambiguous, or returned
        after it). With none, placing it can only make later operations harder to explain (no
        mismatch check follows it, see ``_select``), so a linearization with it gives one
        without it: it is dropped. Once every observer is placed, the same holds for the rest
        of the search: it expires (the search stops trying it and the memo forgets whether it
        was placed), if its observers are all definite (an ambiguous one may never be placed).
        """
        readers: dict[int, list[int]] = defaultdict(list)
        for j, (_, kind, arg, _, _) in enumerate(kept):
            if kind in (_READ, _CAS):
                readers[arg].append(j)
        observers: dict[int, list[int]] = {}
        for i, (op, kind, arg, arg2, definite) in enumerate(kept):
            if not definite:
                observers[i] = [
                    j
                    for j in readers.get(arg2 if kind == _CAS else arg, ())
                    if j != i and (not kept[j][4] or kept[j][0].complete_ns >= op.invoke_ns)
                ]
        position: dict[int, int] = {}
        for i, (op, kind, arg, arg2, definite) in enumerate(kept):
            if not definite and not observers[i]:
                self.dropped += 1
                continue
            position[i] = len(self.ops)
            self.ops.append(op)
            self.kind.append(kind)
            self.arg.append(arg)
            self.arg2.append(arg2)
            self.definite.append(definite)
        self.expiry = [-1] * len(self.ops)
        for i, seen_by in observers.items():
            if i in position and all(kept[j][4] for j in seen_by):
                self.expiry[position[i]] = sum(1 << position[j] for j in seen_by)

    def step(self, i: int, state: int) -> int:
        """The register's value after operation ``i`` from ``state``; -1 if it cannot happen."""
        kind = self.kind[i]
        if kind == _READ:
            return state if state == self.arg[i] else -1
        if kind == _WRITE:
            return self.arg[i]
        if kind == _CAS:
            return self.arg2[i] if state == self.arg[i] else -1
        if kind == _DELETE:
            return _ABSENT
        return state if state != self.arg[i] else -1  # _MISMATCH

    def why_not(self, i: int, state: int) -> str:
        """Why operation ``i`` cannot take effect in ``state``, for a failure message."""
        now = _text(self.values[state])
        kind = self.kind[i]
        if self.step(i, state) >= 0:
            return "fits here, but no order of the remaining operations does after it"
        if kind == _READ:
            return f"returned {_text(self.values[self.arg[i]])}, but the value was {now}"
        if kind == _CAS:
            return f"expected {_text(self.values[self.arg[i]])}, but the value was {now}"
        return f"failed as a mismatch, but the value was {now}, the expected one"


def _check_key(key: str, ops: list[Operation], max_steps: int, deadline: float | None) -> KeyResult:
    search = _Search(ops)
    n = len(search.ops)
    base = {"key": key, "checked": n, "dropped": search.dropped}
    if deadline is not None and time.monotonic() > deadline:
        return KeyResult(verdict=Verdict.UNKNOWN, steps=0, reason="time budget spent", **base)

    # entries: node 0 is the head; a call before a return at the same instant
    order = []
    for i, op in enumerate(search.ops):
        order.append((op.invoke_ns, 0, i))
        if search.definite[i]:
            order.append((op.complete_ns, 1, i))
    order.sort()
    size = len(order) + 1
    nxt = [*range(1, size), -1]
    prv = [-1, *range(size - 1)]
    op_of = [-1] * size
    is_call = [False] * size
    ret_of = [-1] * size
    call_node = [0] * n
    for node, (_, kind, i) in enumerate(order, start=1):
        op_of[node] = i
        if kind == 0:
            is_call[node] = True
            call_node[i] = node
        else:
            ret_of[call_node[i]] = node

    def unlink(node: int) -> None:
        nxt[prv[node]] = nxt[node]
        if nxt[node] != -1:
            prv[nxt[node]] = prv[node]

    def relink(node: int) -> None:
        nxt[prv[node]] = node
        if nxt[node] != -1:
            prv[nxt[node]] = node

    bits = [1 << i for i in range(n)]
    expiry = search.expiry
    expiring = [(bits[i], mask) for i, mask in enumerate(expiry) if mask >= 0]

    def expired(marked: int) -> int:
        gone = 0
        for bit, mask in expiring:
            if marked & mask == mask:
                gone |= bit
        return gone

    remaining = sum(search.definite)
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[int, int]] = []  # (call node, value before it)
    state, linearized, steps = _ABSENT, 0, 0
    best: tuple[list[int], int, int] | None = None  # (prefix ops, value after, blocked op)
    node = nxt[0]
    while remaining:
        if is_call[node]:
            i = op_of[node]
            steps += 1
            if steps % _CLOCK_EVERY == 0 or steps >= max_steps:
                late = deadline is not None and time.monotonic() > deadline
                if late or steps >= max_steps:
                    spent = "time budget spent" if late else f"step budget of {max_steps} spent"
                    return KeyResult(
                        verdict=Verdict.UNKNOWN,
                        steps=steps,
                        reason=f"{spent} after {steps} steps, {len(seen)} states explored",
                        **base,
                    )
            waits_for = expiry[i]
            if waits_for >= 0 and linearized & waits_for == waits_for:
                node = nxt[node]  # expired: nothing left can see what it would write
                continue
            after = search.step(i, state)
            if after >= 0:
                marked = linearized | bits[i]
                memo = (marked & ~expired(marked), after) if expiring else (marked, after)
                if memo not in seen:
                    seen.add(memo)
                    stack.append((node, state))
                    state, linearized = after, marked
                    unlink(node)
                    if ret_of[node] != -1:
                        unlink(ret_of[node])
                        remaining -= 1
                    node = nxt[0]
                    continue
            node = nxt[node]
            continue
        # the return of an operation not yet linearized: it had to take effect by now
        if best is None or len(stack) > len(best[0]):
            best = ([op_of[c] for c, _ in stack], state, op_of[node])
        if not stack:
            break
        node, state = stack.pop()
        linearized &= ~bits[op_of[node]]
        if ret_of[node] != -1:
            relink(ret_of[node])
            remaining += 1
        relink(node)
        node = nxt[node]
    else:
        order_found = tuple(search.ops[op_of[c]] for c, _ in stack)
        return KeyResult(
            verdict=Verdict.LINEARIZABLE,
            steps=steps,
            linearization=order_found,
            value_after=search.values[state],
            **base,
        )
    assert best is not None  # the loop breaks only at a return
    return _violation(search, base, steps, *best)


def _violation(
    search: _Search, base: dict[str, Any], steps: int, prefix: list[int], state: int, blocked: int
) -> KeyResult:
    """The explanation at the deepest point the search reached: the operations that could go
    next are those invoked before the blocked return, minus the prefix."""
    placed = set(prefix)
    blocked_op = search.ops[blocked]
    candidates = []
    for i, op in enumerate(search.ops):
        if i not in placed and op.invoke_ns <= blocked_op.complete_ns:
            candidates.append(Candidate(op, search.why_not(i, state)))
    return KeyResult(
        verdict=Verdict.VIOLATION,
        steps=steps,
        linearization=tuple(search.ops[i] for i in prefix),
        value_after=search.values[state],
        blocked=blocked_op,
        candidates=tuple(candidates),
        **base,
    )

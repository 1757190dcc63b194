"""A recorded history of operations on documents, for the linearizability checker.

Fault tests (kill -9, partitions) record every client operation here as Jepsen does: an
invocation when the call starts and a completion when its outcome is known, each stamped
with a monotonic clock (or the simulator's virtual one). ``shardex.testing.linearizability``
then checks the history per document.

Every document is a register with these operations (``value`` is what ``invoke`` takes):

- ``read``: ``value`` None; an ``ok`` result is the document, or None when it was absent.
- ``write``: ``value`` the document; ``ok`` means written (an upsert).
- ``cas``: ``value`` ``(expected, new)``; ``ok`` means the document equalled ``expected`` and
  became ``new``. ``fail`` with result ``CAS_MISMATCH`` means it did not equal ``expected``
  (the store answered CAS_MISMATCH, or DOC_NOT_FOUND for a non-None ``expected``); ``fail``
  with any other result (e.g. DURABILITY_IMPOSSIBLE) means only "nothing happened".
- ``delete``: ``value`` None; ``ok`` means the document is now absent.

Statuses: ``ok`` (took effect, result known), ``fail`` (definitely took no effect: a refusal
before anything was written) and ``info`` (ambiguous: a timeout, DURABILITY_AMBIGUOUS, a
connection lost mid-call; it may or may not have taken effect, now or later). An operation
still pending when the history is read counts as ``info``: its process died with it.

Documents are compared as JSON: a value must survive ``json.dumps``, and two values are equal
when their canonical JSON text (sorted keys) is. CAS in shardex compares tokens, not values;
a test that records a token-checked replace as ``cas`` on values must write each value to a
key at most once, so that "the value equals ``expected``" means "no other write happened".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Literal, NewType

from shardex.errors import ErrorCode, ShardexError

OpId = NewType("OpId", int)
OpKind = Literal["read", "write", "cas", "delete"]
Status = Literal["ok", "fail", "info"]

OP_KINDS: tuple[str, ...] = ("read", "write", "cas", "delete")
STATUSES: tuple[str, ...] = ("ok", "fail", "info")

# the result of a failed cas whose expected value did not match (it carries information)
CAS_MISMATCH = "mismatch"

# first line of a dumped history: names the format so a later change can stay readable
_FORMAT = {"format": "shardex-history", "version": 1}


class HistoryError(ShardexError):
    """A history used wrongly: an unknown operation or status, a value that is not JSON, an
    operation completed twice, a process invoking while its previous call is pending."""

    default_code = ErrorCode.BAD_REQUEST


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation, invoked and (maybe) completed. ``complete_ns`` is None while pending."""

    id: OpId
    process: Hashable
    key: str
    op: OpKind
    value: Any
    invoke_ns: int
    status: Status | None = None
    result: Any = None
    complete_ns: int | None = None

    @property
    def outcome(self) -> Status:
        """The status the checker uses: a pending operation is ambiguous."""
        return self.status if self.status is not None else "info"

    def describe(self) -> str:
        """One line for a failure message: ``#12 p3 cas(1 -> 2) ok [100, 250]`` (an ambiguous
        operation ends at ``inf``)."""
        if self.op == "cas":
            expected, new = self.value
            call = f"cas({_short(expected)} -> {_short(new)})"
        elif self.op == "write":
            call = f"write({_short(self.value)})"
        else:
            call = f"{self.op}()"
        if self.status is None:
            outcome = "pending"
        elif self.op == "read" and self.status == "ok":
            outcome = f"ok -> {_short(self.result)}"
        elif self.status == "fail" and self.result is not None:
            outcome = f"fail ({_short(self.result)})"
        else:
            outcome = self.status
        end = "inf" if self.outcome == "info" else str(self.complete_ns)
        who = f"p{self.process}" if isinstance(self.process, int) else str(self.process)
        return f"#{self.id} {who} {call} {outcome} [{self.invoke_ns}, {end}]"


def _short(value: Any, limit: int = 60) -> str:
    text = "absent" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise HistoryError(
            f"{what} is not a JSON value: {value!r}",
            details={"value": repr(value), "hint": "record documents as JSON values"},
        ) from exc


class History:
    """Thread-safe recorder of invocations and completions.

    ``clock`` returns nanoseconds and must never go back (``time.monotonic_ns`` by default;
    the simulator passes its virtual clock). A process is one sequential client: it may not
    invoke while its previous operation is pending (after an ``info`` it may go on, as the
    ambiguous call counts as concurrent with everything after it).
    """

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[Operation] = []
        self._pending: dict[Hashable, OpId] = {}

    def invoke(self, process: Hashable, key: str, op: OpKind, value: Any = None) -> OpId:
        """Record the start of a call; returns the id to complete it with."""
        if op not in OP_KINDS:
            raise HistoryError(
                f"unknown operation {op!r}",
                details={"op": op, "hint": f"one of {', '.join(OP_KINDS)}"},
            )
        if not isinstance(key, str):
            raise HistoryError(f"key must be a string, got {key!r}", details={"key": repr(key)})
        value = _normalise_value(op, value)
        with self._lock:
            if process in self._pending:
                raise HistoryError(
                    f"process {process!r} invoked {op} while #{self._pending[process]} is pending",
                    details={
                        "process": repr(process),
                        "hint": "complete the previous operation first (info if unknown)",
                    },
                )
            op_id = OpId(len(self._ops))
            self._ops.append(Operation(op_id, process, key, op, value, self._clock()))
            self._pending[process] = op_id
        return op_id

    def complete(self, op_id: OpId, status: Status, result: Any = None) -> None:
        """Record the outcome of a call: ``ok``, ``fail`` (no effect) or ``info`` (unknown)."""
        if status not in STATUSES:
            raise HistoryError(
                f"unknown status {status!r}",
                details={"status": status, "hint": f"one of {', '.join(STATUSES)}"},
            )
        _check_json(result, "result")
        with self._lock:
            if not 0 <= op_id < len(self._ops):
                raise HistoryError(f"no operation #{op_id}", details={"op_id": op_id})
            op = self._ops[op_id]
            if op.status is not None:
                raise HistoryError(
                    f"operation #{op_id} completed twice ({op.status}, then {status})",
                    details={"op_id": op_id},
                )
            self._ops[op_id] = replace(op, status=status, result=result, complete_ns=self._clock())
            del self._pending[op.process]

    def operations(self) -> list[Operation]:
        """A snapshot of every operation so far, in invocation order."""
        with self._lock:
            return list(self._ops)

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.operations())

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def dump(self, target: str | Path | IO[str]) -> None:
        """Write the history as JSON lines (a format line, then one operation a line)."""
        if isinstance(target, str | Path):
            with open(target, "w", encoding="utf-8") as out:
                self.dump(out)
            return
        target.write(json.dumps(_FORMAT) + "\n")
        for op in self.operations():
            target.write(json.dumps(_to_json(op), sort_keys=True) + "\n")

    @classmethod
    def load(cls, source: str | Path | IO[str]) -> History:
        """Read a history written by ``dump``; operations keep their ids and times."""
        if isinstance(source, str | Path):
            with open(source, encoding="utf-8") as src:
                return cls.load(src)
        return cls.from_operations(_parse_lines(source))

    @classmethod
    def from_operations(cls, ops: Iterable[Operation]) -> History:
        """A history holding these operations (ids renumbered in order if they have gaps)."""
        history = cls()
        for position, op in enumerate(ops):
            history._ops.append(replace(op, id=OpId(position), value=_check_loaded(op)))
            if op.status is None:
                history._pending[op.process] = OpId(position)
        return history


def _normalise_value(op: str, value: Any) -> Any:
    if op == "cas":
        if not isinstance(value, tuple | list) or len(value) != 2:
            raise HistoryError(
                f"cas takes (expected, new), got {value!r}",
                details={"value": repr(value), "hint": "invoke(p, key, 'cas', (old, new))"},
            )
        _check_json(list(value), "cas value")
        if value[1] is None:
            raise HistoryError(
                "cas cannot write an absent document (new is None)",
                details={"value": repr(value), "hint": "use delete"},
            )
        return (value[0], value[1])
    if op == "write":
        if value is None:
            raise HistoryError(
                "write of None: a document cannot be written absent",
                details={"hint": "use delete"},
            )
        _check_json(value, "written value")
        return value
    if value is not None:
        raise HistoryError(
            f"{op} takes no value, got {value!r}", details={"op": op, "value": repr(value)}
        )
    return None


def _check_loaded(op: Operation) -> Any:
    """Checks an operation built outside ``invoke``/``complete``; returns its value normalised."""
    if op.op not in OP_KINDS or (op.status is not None and op.status not in STATUSES):
        raise HistoryError(
            f"operation #{op.id}: unknown op {op.op!r} or status {op.status!r}",
            details={"op": op.op, "status": op.status},
        )
    if op.status is not None and (op.complete_ns is None or op.complete_ns < op.invoke_ns):
        raise HistoryError(
            f"operation #{op.id} completed at {op.complete_ns}, invoked at {op.invoke_ns}",
            details={"op_id": op.id, "hint": "a completion needs a time not before its call"},
        )
    return _normalise_value(op.op, op.value)


def _to_json(op: Operation) -> dict[str, Any]:
    return {
        "id": op.id,
        "process": op.process,
        "key": op.key,
        "op": op.op,
        "value": list(op.value) if op.op == "cas" else op.value,
        "invoke": op.invoke_ns,
        "status": op.status,
        "result": op.result,
        "complete": op.complete_ns,
    }


def _parse_lines(source: IO[str]) -> Iterator[Operation]:
    for number, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(
                f"history line {number} is not JSON: {exc}", details={"line": number}
            ) from exc
        if number == 1:
            if record != _FORMAT:
                raise HistoryError(
                    f"not a shardex history (first line {line.strip()[:80]!r})",
                    details={"hint": f"the first line of a dump is {json.dumps(_FORMAT)}"},
                )
            continue
        try:
            op = record["op"]
            value = tuple(record["value"]) if op == "cas" else record["value"]
            process = record["process"]
            yield Operation(
                id=OpId(record["id"]),
                # JSON has no tuples: a list process id comes back hashable
                process=tuple(process) if isinstance(process, list) else process,
                key=record["key"],
                op=op,
                value=value,
                invoke_ns=record["invoke"],
                status=record["status"],
                result=record["result"],
                complete_ns=record["complete"],
            )
        except (KeyError, TypeError) as exc:
            raise HistoryError(
                f"history line {number} is not an operation: {exc!r}",
                details={"line": number},
            ) from exc

"""Query parameter checks: every ``$n`` / ``$name`` a statement uses must be supplied, and
positional arguments must match the positions used (a count mismatch is a caller bug that
would otherwise surface as a wrong answer); no value may nest deeper than a document."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

from shardex.api.validation import MAX_DOC_DEPTH
from shardex.core.expr.functions_date import without_statement_time
from shardex.errors import ErrorCode, ShardexError

_CONTAINERS = (list, dict)


def _fail(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def check_params(used: set[str], params: Sequence[Any] | Mapping[str, Any] | None) -> None:
    params = without_statement_time(params)  # as the caller gave them
    positional = sorted(int(n) for n in used if n.isdigit())
    named = sorted(n for n in used if not n.isdigit())
    if params is None:
        params = ()
    # A list (what the wire decodes) is a sequence: the ABC checks below cost more than
    # the rest of a point query's check.
    if type(params) is not list and isinstance(params, Mapping):
        missing = [n for n in named if n not in params and f"${n}" not in params] + [
            f"${p}" for p in positional if str(p) not in params and p not in params
        ]
        if missing:
            raise _fail(
                "no value supplied for parameter "
                + ", ".join("$" + m.lstrip("$") for m in missing),
                parameters=missing,
                hint="pass params={'name': value} (or a list for $1, $2, ...)",
            )
        return
    if type(params) is not list and (isinstance(params, str) or not isinstance(params, Sequence)):
        raise _fail(
            f"params must be a list or a mapping, not {type(params).__name__}",
            hint="pass params=[...] for $1, $2 or {'name': ...} for $name",
        )
    if named:
        raise _fail(
            f"named parameter ${named[0]} needs params as a mapping",
            parameters=named,
            hint=f"pass params={{'{named[0]}': value}}",
        )
    need = positional[-1] if positional else 0
    if need != len(params):
        raise _fail(
            f"parameter count mismatch: the statement uses {need} positional parameter"
            f"{'' if need == 1 else 's'}, {len(params)} supplied",
            expected=need,
            supplied=len(params),
            hint="pass exactly one value per $1, $2, ...",
        )


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels deep: level by
    level without recursion, each level's members typed in C (``set(map(type, ...))``) so a
    level of scalars costs no Python step per value: a flat IN list of 100k values costs a
    few ms, about what decoding it did."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        members = list(chain.from_iterable(v.values() if type(v) is dict else v for v in level))
        kinds = set(map(type, members))
        if list not in kinds and dict not in kinds:
            return False
        level = [c for c in members if type(c) in _CONTAINERS]
    return False


def check_params_depth(params: Sequence[Any] | Mapping[str, Any] | None) -> None:
    """BAD_REQUEST for a parameter value nested deeper than a document may be
    (``MAX_DOC_DEPTH``): comparing, sorting and encoding values recurse per level, and past
    a few hundred levels they hit Python's recursion limit (INTERNAL, not a clear error)."""
    if params is None:
        return
    mapping = type(params) is not list and isinstance(params, Mapping)
    values = params.items() if mapping else enumerate(params, start=1)
    for name, value in values:
        if _deeper_than(value, MAX_DOC_DEPTH):
            raise _fail(
                f"parameter ${name} is nested more than {MAX_DOC_DEPTH} levels deep "
                "(the limit for documents too)",
                parameter=str(name),
                limit=MAX_DOC_DEPTH,
                hint="flatten the value, or store it in a document and read it there",
            )

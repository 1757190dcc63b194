"""Query parameter checks: every ``$n`` / ``$name`` a statement uses must be supplied, and
positional arguments must match the positions used (a count mismatch is a caller bug that
would otherwise surface as a wrong answer)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardex.errors import ErrorCode, ShardexError


def _fail(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def check_params(used: set[str], params: Sequence[Any] | Mapping[str, Any] | None) -> None:
    positional = sorted(int(n) for n in used if n.isdigit())
    named = sorted(n for n in used if not n.isdigit())
    if params is None:
        params = ()
    if isinstance(params, Mapping):
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
    if isinstance(params, str) or not isinstance(params, Sequence):
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

"""Tree-walking interpreter: the reference semantics.

``evaluate`` is the straightforward definition of what an expression means; ``compiler``
builds specialized closures for the hot path and is tested against this module on random
documents. Keep this one simple rather than fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import shardex.core.expr.ops as ops
from shardex.core.values import MISSING
from shardex.errors import ExpressionEvalError

from .ast import (
    And,
    ArrayConstruct,
    Between,
    BinaryOp,
    Case,
    Expr,
    Field,
    FunctionCall,
    Identifier,
    In,
    Index,
    IsCheck,
    Like,
    Literal,
    Meta,
    Neg,
    Not,
    ObjectConstruct,
    Or,
    Param,
    Slice,
)
from .functions import FUNCTIONS, FunctionSpec, call_function
from .functions_array import slice_array


class Env:
    """What an expression is evaluated against: the root (document), metadata, params."""

    __slots__ = ("doc", "meta", "params")

    def __init__(self, doc: Any, meta: Any = None, params: Any = None) -> None:
        self.doc = doc
        self.meta = meta
        self.params = params


def lookup_param(params: Any, name: str) -> Any:
    """Value of ``$name`` / ``$1``. ``params`` is a mapping (keys "name", "$name", or for
    positional ones "1"/1) or a sequence for positional parameters. An absent parameter is
    a caller error, as in N1QL, not a MISSING value."""
    if isinstance(params, Mapping):
        for key in (name, "$" + name):
            if key in params:
                return params[key]
        if name.isdigit() and int(name) in params:
            return params[int(name)]
    elif isinstance(params, Sequence) and not isinstance(params, str) and name.isdigit():
        i = int(name) - 1
        if 0 <= i < len(params):
            return params[i]
    raise ExpressionEvalError(
        f"no value supplied for parameter ${name}", details={"parameter": name}
    )


def meta_value(meta: Any, keyspace: str | None) -> Any:
    """META() / META(alias). In a single-document context the alias names the only
    keyspace, so it does not select anything; the SQL layer rewrites aliases for joins."""
    if meta is None:
        raise ExpressionEvalError(
            "META() needs document metadata but none was supplied",
            details={"keyspace": keyspace},
        )
    return meta


def resolve_function(name: str) -> FunctionSpec:
    spec = FUNCTIONS.get(name.upper())
    if spec is None:
        # Only reachable with a hand-built AST: the parser rejects unknown names.
        raise ExpressionEvalError(f"unknown function {name!r}", details={"function": name})
    return spec


def _literal(node: Literal, env: Env) -> Any:
    return node.value


def _array(node: ArrayConstruct, env: Env) -> Any:
    # MISSING cannot live inside a JSON array; N1QL turns it into null.
    out = []
    for item in node.items:
        v = _eval(item, env)
        out.append(None if v is MISSING else v)
    return out


def _object(node: ObjectConstruct, env: Env) -> Any:
    out: dict[str, Any] = {}
    for key_expr, value_expr in node.items:
        key = _eval(key_expr, env)
        if key is MISSING:
            continue
        if type(key) is not str:
            return None  # N1QL: a non-string name makes the whole object NULL
        value = _eval(value_expr, env)
        if value is not MISSING:  # MISSING values are omitted
            out[key] = value
    return out


def _identifier(node: Identifier, env: Env) -> Any:
    return ops.get_field(env.doc, node.name)


def _field(node: Field, env: Env) -> Any:
    return ops.get_field(_eval(node.base, env), node.name)


def _index(node: Index, env: Env) -> Any:
    return ops.get_element(_eval(node.base, env), _eval(node.index, env))


def _slice(node: Slice, env: Env) -> Any:
    base, start = _eval(node.base, env), _eval(node.start, env)
    if node.end is None:
        return slice_array(base, start, to_end=True)
    return slice_array(base, start, _eval(node.end, env))


def _meta(node: Meta, env: Env) -> Any:
    return meta_value(env.meta, node.keyspace)


def _param(node: Param, env: Env) -> Any:
    return lookup_param(env.params, node.name)


def _neg(node: Neg, env: Env) -> Any:
    return ops.negate(_eval(node.operand, env))


def _not(node: Not, env: Env) -> Any:
    return ops.logical_not(_eval(node.operand, env))


def _binary(node: BinaryOp, env: Env) -> Any:
    a = _eval(node.left, env)
    b = _eval(node.right, env)
    if node.op == "||":
        return ops.concat(a, b)
    if node.op in ops.ARITHMETIC:
        return ops.arith(node.op, a, b)
    return ops.compare(node.op, a, b)


def _junction(operands: tuple[Expr, ...], env: Env, absorbing: bool) -> Any:
    # AND (absorbing False): FALSE wins and stops evaluation, then MISSING, then NULL, then
    # TRUE. OR (absorbing True): TRUE wins and stops, then NULL, then MISSING, then FALSE.
    decides = ops.is_true if absorbing else ops.is_false
    combine = ops.logical_or if absorbing else ops.logical_and
    result: Any = not absorbing
    for operand in operands:
        v = _eval(operand, env)
        if decides(v):
            return absorbing
        result = combine(result, v)
    return result


def _and(node: And, env: Env) -> Any:
    return _junction(node.operands, env, absorbing=False)


def _or(node: Or, env: Env) -> Any:
    return _junction(node.operands, env, absorbing=True)


def _negate_if(result: Any, negated: bool) -> Any:
    return ops.logical_not(result) if negated else result


def _like(node: Like, env: Env) -> Any:
    return _negate_if(ops.like(_eval(node.operand, env), _eval(node.pattern, env)), node.negated)


def _between(node: Between, env: Env) -> Any:
    v = _eval(node.operand, env)
    result = ops.between(v, _eval(node.low, env), _eval(node.high, env))
    return _negate_if(result, node.negated)


def _in(node: In, env: Env) -> Any:
    v = _eval(node.operand, env)
    return _negate_if(ops.in_collection(v, _eval(node.collection, env)), node.negated)


def is_check(kind: str, v: Any) -> Any:
    if kind == "NULL":
        return MISSING if v is MISSING else v is None
    if kind == "MISSING":
        return v is MISSING
    return v is not MISSING and v is not None  # VALUED


def _is(node: IsCheck, env: Env) -> Any:
    return _negate_if(is_check(node.kind, _eval(node.operand, env)), node.negated)


def _case(node: Case, env: Env) -> Any:
    if node.subject is None:
        for cond, result in node.whens:
            if ops.truth(_eval(cond, env)):
                return _eval(result, env)
    else:
        subject = _eval(node.subject, env)
        for cand, result in node.whens:
            if ops.equals(subject, _eval(cand, env)) is True:
                return _eval(result, env)
    return None if node.default is None else _eval(node.default, env)


def _call(node: FunctionCall, env: Env) -> Any:
    spec = resolve_function(node.name)
    return call_function(spec, [_eval(a, env) for a in node.args], env.params)


_DISPATCH: dict[type, Callable[[Any, Env], Any]] = {
    Literal: _literal,
    ArrayConstruct: _array,
    ObjectConstruct: _object,
    Identifier: _identifier,
    Field: _field,
    Index: _index,
    Slice: _slice,
    Meta: _meta,
    Param: _param,
    Neg: _neg,
    Not: _not,
    BinaryOp: _binary,
    And: _and,
    Or: _or,
    Like: _like,
    Between: _between,
    In: _in,
    IsCheck: _is,
    Case: _case,
    FunctionCall: _call,
}


def register_node(node_type: type, handler: Callable[[Any, Env], Any]) -> None:
    """Let a layer above (SQL) add node types; ``handler(node, env)`` may call
    ``evaluate_in(child, env)`` for children."""
    _DISPATCH[node_type] = handler


def _eval(node: Expr, env: Env) -> Any:
    handler = _DISPATCH.get(type(node))
    if handler is None:
        raise ExpressionEvalError(
            f"cannot evaluate node type {type(node).__name__}",
            details={"node": type(node).__name__},
        )
    return handler(node, env)


evaluate_in = _eval


def evaluate(expr: Expr | str, doc: Any, *, meta: Any = None, params: Any = None) -> Any:
    """Evaluate ``expr`` against ``doc`` (the root that leading identifiers resolve in).

    Returns a JSON value, None for NULL, or MISSING. Type mismatches never raise (they give
    NULL); ExpressionEvalError is raised only for misuse: an absent parameter, META()
    without metadata, or an AST naming an unknown function.
    """
    if isinstance(expr, str):
        from .parser import parse_expression

        expr = parse_expression(expr)
    return _eval(expr, Env(doc, meta, params))

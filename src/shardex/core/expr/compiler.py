"""Compile an expression once into nested closures for fast per-document evaluation.

This is the projector's hot path (every index key expression on every mutation), so the
compiler does the work the interpreter repeats per call: constant sub-expressions are
folded, plain paths (``a.b.c``) become a direct subscript chain guarded by one ``try``,
comparisons and IN against constants take a same-type fast path, LIKE patterns are
translated once, and functions are resolved once. Every fast path falls back to the shared
semantics in ``ops``, and a property test checks the result equals ``evaluate``.

Compiled functions are plain closures: not picklable with the standard pickle. Ship the AST
(or its text) to Spark executors and compile there, once per task.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import shardex.core.expr.ops as ops
from shardex.core.values import MISSING

from .analysis import is_constant, static_path
from .ast import (
    And,
    ArrayConstruct,
    Between,
    BinaryOp,
    Case,
    Expr,
    Field,
    FunctionCall,
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
from .evaluator import Env, evaluate, evaluate_in, is_check, lookup_param, meta_value
from .evaluator import resolve_function as _resolve
from .functions import call_function
from .functions_array import slice_array
from .paths import compile_path

CompiledExpr = Callable[..., Any]  # (doc, meta=None, params=None) -> value
_Compiler = Callable[[Any], CompiledExpr]

_PYOPS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_PYARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_MIRROR = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def compile_expression(expr: Expr | str) -> CompiledExpr:
    """Build ``f(doc, meta=None, params=None) -> value`` computing ``evaluate(expr, doc, ...)``.

    Results may share structure with the document and with folded constants: treat them as
    read-only.
    """
    if isinstance(expr, str):
        from .parser import parse_expression

        expr = parse_expression(expr)
    return _compile(expr)


def _compile(node: Expr) -> CompiledExpr:
    if not isinstance(node, Literal) and is_constant(node):
        return _const(evaluate(node, None))
    path = static_path(node)
    if path is not None:
        return compile_path(path)
    handler = _COMPILERS.get(type(node))
    if handler is None:
        return _interpreted(node)
    return handler(node)


def register_compiler(node_type: type, handler: _Compiler) -> None:
    """Let a layer above add node types (nodes without one fall back to the interpreter)."""
    _COMPILERS[node_type] = handler


def _interpreted(node: Expr) -> CompiledExpr:
    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        return evaluate_in(node, Env(d, m, p))

    return f


def _const(value: Any) -> CompiledExpr:
    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        return value

    return f


def _constant_value(node: Expr) -> tuple[bool, Any]:
    if isinstance(node, Literal):
        return True, node.value
    if is_constant(node):
        return True, evaluate(node, None)
    return False, None


# -- paths -------------------------------------------------------------------------------------


def _field(node: Field) -> CompiledExpr:
    base, name, get_field = _compile(node.base), node.name, ops.get_field

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        v = base(d, m, p)
        if type(v) is dict:
            return v.get(name, MISSING)
        return get_field(v, name)

    return f


def _index(node: Index) -> CompiledExpr:
    base, index, get_element = _compile(node.base), _compile(node.index), ops.get_element
    return lambda d, m=None, p=None: get_element(base(d, m, p), index(d, m, p))


def _slice(node: Slice) -> CompiledExpr:
    base, start = _compile(node.base), _compile(node.start)
    if node.end is None:
        return lambda d, m=None, p=None: slice_array(base(d, m, p), start(d, m, p), to_end=True)
    end = _compile(node.end)
    return lambda d, m=None, p=None: slice_array(base(d, m, p), start(d, m, p), end(d, m, p))


def _meta(node: Meta) -> CompiledExpr:
    ks = node.keyspace
    return lambda d, m=None, p=None: meta_value(m, ks)


def _param(node: Param) -> CompiledExpr:
    name = node.name
    # A filter reads its parameters once per row: the wire's own shapes (a list for $1,
    # a dict for $name) are looked up directly, without ``lookup_param``'s ABC checks.
    index = int(name) - 1 if name.isdigit() else -1

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        kind = type(p)
        if kind is list and 0 <= index < len(p):
            return p[index]
        if kind is dict and name in p:
            return p[name]
        return lookup_param(p, name)

    return f


# -- constructors ------------------------------------------------------------------------------


def _array(node: ArrayConstruct) -> CompiledExpr:
    fns = tuple(_compile(i) for i in node.items)

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        out = []
        for fn in fns:
            v = fn(d, m, p)
            out.append(None if v is MISSING else v)
        return out

    return f


def _object(node: ObjectConstruct) -> CompiledExpr:
    pairs = tuple((_compile(k), _compile(v)) for k, v in node.items)

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        out: dict[str, Any] = {}
        for kf, vf in pairs:
            key = kf(d, m, p)
            if key is MISSING:
                continue
            if type(key) is not str:
                return None
            value = vf(d, m, p)
            if value is not MISSING:
                out[key] = value
        return out

    return f


# -- operators ---------------------------------------------------------------------------------


def _neg(node: Neg) -> CompiledExpr:
    operand, negate = _compile(node.operand), ops.negate
    return lambda d, m=None, p=None: negate(operand(d, m, p))


def _not(node: Not) -> CompiledExpr:
    operand, lnot = _compile(node.operand), ops.logical_not
    return lambda d, m=None, p=None: lnot(operand(d, m, p))


def _binary(node: BinaryOp) -> CompiledExpr:
    op = node.op
    if op in ops.COMPARATORS:
        return _comparison(node)
    fn = ops.concat if op == "||" else ops.ARITHMETIC[op]
    if op in ("+", "-", "*"):
        rconst, rval = _constant_value(node.right)
        if rconst and type(rval) in (int, float):
            return _arith_const(op, _compile(node.left), rval)
    left, right = _compile(node.left), _compile(node.right)
    return lambda d, m=None, p=None: fn(left(d, m, p), right(d, m, p))


def _arith_const(op: str, operand: CompiledExpr, c: int | float) -> CompiledExpr:
    """x + 1, price * 2: skip the generic type dispatch when x is a plain number."""
    pyop, slow = _PYARITH[op], ops.ARITHMETIC[op]

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        v = operand(d, m, p)
        tv = type(v)
        if tv is int or tv is float:
            try:
                return ops.finite(pyop(v, c))
            except OverflowError:
                return None
        return slow(v, c)

    return f


def _comparison(node: BinaryOp) -> CompiledExpr:
    op = node.op
    lconst, lval = _constant_value(node.left)
    rconst, rval = _constant_value(node.right)
    if lconst and not rconst:
        # Put the constant on the right: c < x is x > c.
        return _compare_const(_MIRROR[op], _compile(node.right), lval)
    if rconst and not lconst:
        return _compare_const(op, _compile(node.left), rval)
    cmp, left, right = ops.COMPARATORS[op], _compile(node.left), _compile(node.right)
    return lambda d, m=None, p=None: cmp(left(d, m, p), right(d, m, p))


def _compare_const(op: str, operand: CompiledExpr, c: Any) -> CompiledExpr:
    cmp = ops.COMPARATORS[op]
    ctype = type(c)
    pyop = _PYOPS[op]
    if ctype is str:
        # Same-type comparisons are exactly Python's (collation within a type).

        def fast_str(d: Any, m: Any = None, p: Any = None) -> Any:
            v = operand(d, m, p)
            if type(v) is str:
                return pyop(v, c)
            return cmp(v, c)

        return fast_str
    if (ctype is int or ctype is float) and c == c:
        # Any two non-NaN numbers compare numerically, int against float included.

        def fast_num(d: Any, m: Any = None, p: Any = None) -> Any:
            v = operand(d, m, p)
            tv = type(v)
            if (tv is int or tv is float) and v == v:
                return pyop(v, c)
            return cmp(v, c)

        return fast_num
    return lambda d, m=None, p=None: cmp(operand(d, m, p), c)


def _junction(operands: tuple[Expr, ...], absorbing: bool) -> CompiledExpr:
    """AND (``absorbing`` False) and OR (True) are one loop: a known value whose truth is
    ``absorbing`` decides at once and stops evaluation; the plain opposite boolean (the
    common case) is skipped without the generic combine; anything else (MISSING, NULL,
    other types) folds in through the operator's own precedence of unknowns."""
    fns = tuple(_compile(o) for o in operands)
    neutral = not absorbing
    decides = ops.is_true if absorbing else ops.is_false
    combine = ops.logical_or if absorbing else ops.logical_and

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        result: Any = neutral
        for fn in fns:
            v = fn(d, m, p)
            if v is neutral:
                continue
            if v is absorbing or decides(v):
                return absorbing
            result = combine(result, v)
        return result

    return f


def _and(node: And) -> CompiledExpr:
    return _junction(node.operands, absorbing=False)


def _or(node: Or) -> CompiledExpr:
    return _junction(node.operands, absorbing=True)


def _like(node: Like) -> CompiledExpr:
    operand = _compile(node.operand)
    negated = node.negated
    pconst, pattern = _constant_value(node.pattern)
    if pconst and type(pattern) is str:
        match = ops.like_matcher(pattern)

        def f(d: Any, m: Any = None, p: Any = None) -> Any:
            v = operand(d, m, p)
            if type(v) is str:
                return (not match(v)) if negated else match(v)
            return MISSING if v is MISSING else None

        return f
    pat, like, lnot = _compile(node.pattern), ops.like, ops.logical_not
    if negated:
        return lambda d, m=None, p=None: lnot(like(operand(d, m, p), pat(d, m, p)))
    return lambda d, m=None, p=None: like(operand(d, m, p), pat(d, m, p))


def _between(node: Between) -> CompiledExpr:
    operand, low, high = _compile(node.operand), _compile(node.low), _compile(node.high)
    between, lnot, negated = ops.between, ops.logical_not, node.negated

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        r = between(operand(d, m, p), low(d, m, p), high(d, m, p))
        return lnot(r) if negated else r

    return f


def _in(node: In) -> CompiledExpr:
    operand, negated = _compile(node.operand), node.negated
    in_collection, lnot = ops.in_collection, ops.logical_not
    cconst, coll = _constant_value(node.collection)
    if cconst and type(coll) is list and all(type(x) in (str, int, float) and x == x for x in coll):
        # Only strings and (non-NaN) numbers: membership is exactly a hash lookup for a
        # str/number value; anything else takes the general path.
        members = frozenset(coll)

        def fast(d: Any, m: Any = None, p: Any = None) -> Any:
            v = operand(d, m, p)
            tv = type(v)
            r = v in members if tv is str or tv is int or tv is float else in_collection(v, coll)
            return lnot(r) if negated else r

        return fast
    collection = _compile(node.collection)

    def f(d: Any, m: Any = None, p: Any = None) -> Any:
        r = in_collection(operand(d, m, p), collection(d, m, p))
        return lnot(r) if negated else r

    return f


def _is(node: IsCheck) -> CompiledExpr:
    operand, kind = _compile(node.operand), node.kind
    if node.kind == "MISSING":
        if node.negated:
            return lambda d, m=None, p=None: operand(d, m, p) is not MISSING
        return lambda d, m=None, p=None: operand(d, m, p) is MISSING
    lnot = ops.logical_not
    if node.negated:
        return lambda d, m=None, p=None: lnot(is_check(kind, operand(d, m, p)))
    return lambda d, m=None, p=None: is_check(kind, operand(d, m, p))


def _case(node: Case) -> CompiledExpr:
    whens = tuple((_compile(c), _compile(r)) for c, r in node.whens)
    default = _const(None) if node.default is None else _compile(node.default)
    truth, equals = ops.truth, ops.equals
    if node.subject is None:

        def searched(d: Any, m: Any = None, p: Any = None) -> Any:
            for cond, result in whens:
                if truth(cond(d, m, p)):
                    return result(d, m, p)
            return default(d, m, p)

        return searched
    subject = _compile(node.subject)

    def simple(d: Any, m: Any = None, p: Any = None) -> Any:
        s = subject(d, m, p)
        for cand, result in whens:
            if equals(s, cand(d, m, p)) is True:
                return result(d, m, p)
        return default(d, m, p)

    return simple


def _call(node: FunctionCall) -> CompiledExpr:
    spec = _resolve(node.name)
    impl = spec.impl
    args = tuple(_compile(a) for a in node.args)
    if spec.with_params:
        return lambda d, m=None, p=None: call_function(spec, [a(d, m, p) for a in args], p)
    if spec.propagate and len(args) == 1:
        (a0,) = args

        def call1(d: Any, m: Any = None, p: Any = None) -> Any:
            x = a0(d, m, p)
            if x is MISSING or x is None:
                return x
            return impl(x)

        return call1
    if spec.propagate and len(args) == 2:
        a0, a1 = args

        def call2(d: Any, m: Any = None, p: Any = None) -> Any:
            x = a0(d, m, p)
            y = a1(d, m, p)
            if x is MISSING or y is MISSING:
                return MISSING
            if x is None or y is None:
                return None
            return impl(x, y)

        return call2
    if spec.propagate:
        return lambda d, m=None, p=None: call_function(spec, [a(d, m, p) for a in args])
    return lambda d, m=None, p=None: impl(*[a(d, m, p) for a in args])


_COMPILERS: dict[type, _Compiler] = {
    Literal: lambda node: _const(node.value),
    ArrayConstruct: _array,
    ObjectConstruct: _object,
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

"""The SQL++ expression language: one parser and one evaluator for document expressions.

Used by index definitions (CREATE INDEX key expressions and WHERE filters, evaluated by the
Spark projector) and extended by the SQL++ statement parser.

    >>> from shardex.core.expr import parse_expression, evaluate, compile_expression
    >>> e = parse_expression("LOWER(name) || '-' || TO_STRING(age + 1)")
    >>> evaluate(e, {"name": "Ann", "age": 41})
    'ann-42'
    >>> f = compile_expression(e)          # build once, call per document
    >>> f({"name": "Bo", "age": 1})
    'bo-2'
    >>> e.to_text()
    'LOWER(name) || "-" || TO_STRING(age + 1)'

Values: JSON values as Python objects, ``None`` for NULL, ``shardex.core.values.MISSING``
for MISSING.
"""

from shardex.core.values import MISSING

from . import (  # noqa: F401 - register on import
    functions_array,
    functions_bits,
    functions_cond,
    functions_crypto,
    functions_date,
    functions_json,
    functions_misc,
    functions_num,
    functions_obj,
    functions_pattern,
    functions_str,
    functions_uuid,
)
from .analysis import is_constant, is_deterministic, referenced_paths, static_path
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
    format_identifier,
    walk,
)
from .compiler import CompiledExpr, compile_expression, register_compiler
from .evaluator import Env, evaluate, register_node
from .functions import FUNCTIONS, FunctionSpec, lookup_function, register_function
from .lexer import Token, TokenKind, tokenize
from .ops import collate, equals, truth, type_name
from .parser import Parser, parse_expression

__all__ = [
    "FUNCTIONS",
    "MISSING",
    "And",
    "ArrayConstruct",
    "Between",
    "BinaryOp",
    "Case",
    "CompiledExpr",
    "Env",
    "Expr",
    "Field",
    "FunctionCall",
    "FunctionSpec",
    "Identifier",
    "In",
    "Index",
    "IsCheck",
    "Like",
    "Literal",
    "Meta",
    "Neg",
    "Not",
    "ObjectConstruct",
    "Or",
    "Param",
    "Parser",
    "Slice",
    "Token",
    "TokenKind",
    "collate",
    "compile_expression",
    "equals",
    "evaluate",
    "format_identifier",
    "is_constant",
    "is_deterministic",
    "lookup_function",
    "parse_expression",
    "referenced_paths",
    "register_compiler",
    "register_function",
    "register_node",
    "static_path",
    "tokenize",
    "truth",
    "type_name",
    "walk",
]

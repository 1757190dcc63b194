"""SQL++ statements: the tree (``ast``), the parser (``parser.parse_statement``) and name
binding (``bind``)."""

from .ast import (
    Aggregate,
    ArrayComprehension,
    Binding,
    CollectionPredicate,
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    KeyspaceRef,
    OrderTerm,
    ResultTerm,
    SelectStmt,
    UpdateStmt,
)
from .parser import SqlParser, Statement, parse_select, parse_statement

__all__ = [
    "Aggregate",
    "ArrayComprehension",
    "Binding",
    "CollectionPredicate",
    "DeleteStmt",
    "ExplainStmt",
    "InsertStmt",
    "KeyspaceRef",
    "OrderTerm",
    "ResultTerm",
    "SelectStmt",
    "SqlParser",
    "Statement",
    "UpdateStmt",
    "parse_select",
    "parse_statement",
]

"""The SQL layer: the index DDL statements (``shardex.sql.ddl``); the SQL++ query parser,
planner and execution protocol extend the same parser."""

from shardex.sql.ddl import (
    BuildIndexStmt,
    CreateIndexStmt,
    DDLParser,
    DDLStatement,
    DropIndexStmt,
    parse_ddl,
    parse_index_key,
)

__all__ = [
    "BuildIndexStmt",
    "CreateIndexStmt",
    "DDLParser",
    "DDLStatement",
    "DropIndexStmt",
    "parse_ddl",
    "parse_index_key",
]

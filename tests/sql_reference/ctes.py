"""Random WITH statements in both dialects: a term that is the documents under a random
WHERE (``SELECT RAW d`` in SQL++, ``SELECT d.*`` in DuckDB: the same fields and presence
columns), and a random query over it (``FROM t AS d``, so every rule of the package holds
as over the documents), a SELECT or a set operation (the term read by every branch)."""

from __future__ import annotations

import dataclasses

from tests.sql_reference.generator import ALIAS, QueryGen, RefQuery
from tests.sql_reference.setops import set_op_query

TERM = "t"


def with_query(gen: QueryGen, over: QueryGen) -> RefQuery:
    """``gen`` makes the term's WHERE over the documents; ``over`` (keyspace and table
    ``TERM``) the query over the term."""
    wpp, wdk = gen.where()
    pp = f"WITH {TERM} AS (SELECT RAW {ALIAS} FROM {gen.keyspace} AS {ALIAS}{wpp}) "
    dk = f"WITH {TERM} AS (SELECT {ALIAS}.* FROM {gen.table} AS {ALIAS}{wdk}) "
    body = set_op_query(over) if gen.rng.random() < 0.3 else over.query()
    return dataclasses.replace(body, sqlpp=pp + body.sqlpp, duck=dk + body.duck)


def with_generators(seed: int, keyspace: str, table: str) -> tuple[QueryGen, QueryGen]:
    return QueryGen(seed, keyspace, table), QueryGen(seed + 1, TERM, TERM)

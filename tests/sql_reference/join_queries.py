"""Random JOIN / NEST queries over two generated keyspaces, rendered as SQL++ for shardex
and as SQL for DuckDB (the rules of ``tests/sql_reference`` hold; what joins add):

* ``lj`` and ``rj`` hold ``make_documents``' flat documents; each ``lj`` document may also
  have ``k``, the id of an ``rj`` document (or of none, or NULL, or MISSING). DuckDB's
  tables add ``meta_id`` (the docid) and ``k``.
* ANSI joins are DuckDB's joins with the same ON; ``ON KEYS l.k`` is ``ON r.meta_id = l.k``;
  ``ON KEY l.k FOR r`` is ``ON l.k = r.meta_id``. An unmatched LEFT / RIGHT side is MISSING
  in SQL++ and NULL in DuckDB (projections compare absent as NULL); ``r IS MISSING`` is
  ``r.meta_id IS NULL`` (every document has an id).
* ``NEST`` is a join grouped per left document: ``ARRAY_LENGTH(r)`` is ``COUNT(r.meta_id)``,
  ``ARRAY_SUM(ARRAY x.a FOR x IN r END)`` is ``COALESCE(SUM(r.a), 0)``; an INNER NEST keeps
  the left documents with a match (``HAVING COUNT(r.meta_id) > 0``), a LEFT NEST all (its
  alias ``[]``: count 0, sum 0).
* Hints (``USE HASH``, ``USE NL``) and indexes change how a join runs, never its rows.
"""

from __future__ import annotations

import random
from typing import Any, Final

from tests.sql_reference.documents import FIELDS, make_documents
from tests.sql_reference.generator import RefQuery

LEFT: Final = "lj"
RIGHT: Final = "rj"
# Indexes the shardex side may have (probed by joins on their key).
INDEXES: Final = ("CREATE INDEX rj_b ON rj(b)", "CREATE INDEX lj_k ON lj(k)")


def make_join_documents(seed: int, n_left: int, n_right: int) -> tuple[dict, dict]:
    rng = random.Random(seed * 7919)
    left = make_documents(seed, n_left)
    right = {f"r{i:05d}": d for i, d in enumerate(make_documents(seed + 1, n_right).values())}
    for doc in left.values():
        r = rng.random()
        if r < 0.1:
            continue  # MISSING
        if r < 0.15:
            doc["k"] = None
        elif r < 0.25:
            doc["k"] = f"r{n_right + rng.randrange(50):05d}"  # names no document
        else:
            doc["k"] = f"r{rng.randrange(n_right):05d}"
    return left, right


def join_connection(left: dict, right: dict) -> Any:
    """A DuckDB connection (one thread, as ``compare.duck_connection``) holding both tables."""
    import duckdb

    con = duckdb.connect(":memory:", config={"threads": 1})
    load_join_tables(con, left, right)
    return con


def load_join_tables(con: Any, left: dict, right: dict) -> None:
    cols = [f"{f} {t}" for f, t in FIELDS.items()] + [f"{f}__p BOOLEAN" for f in FIELDS]
    cols += ["k VARCHAR", "k__p BOOLEAN", "meta_id VARCHAR"]
    for table, docs in ((LEFT, left), (RIGHT, right)):
        con.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
        rows = [
            tuple(d.get(f) for f in FIELDS)
            + tuple(f in d for f in FIELDS)
            + (d.get("k"), "k" in d, docid)
            for docid, d in docs.items()
        ]
        marks = ", ".join(["?"] * (2 * len(FIELDS) + 3))
        con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


class JoinGen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def atom(self, alias: str) -> str:
        """A comparison over one alias's fields (same text in both dialects)."""
        r = self.rng
        kind = r.choice(["a", "a", "b", "f", "g", "in"])
        if kind == "a":
            return f"{alias}.a {r.choice(['<', '>', '<=', '>=', '=', '!='])} {r.randint(-5, 25)}"
        if kind == "b":
            return f"{alias}.b {r.choice(['<', '>', '='])} {r.randint(0, 4)}"
        if kind == "f":
            return f"{alias}.f < {r.randint(-20, 80) / 4}"
        if kind == "g":
            return f"{alias}.g = '{r.choice('xyz')}'"
        return f"{alias}.b IN [{r.randint(0, 4)}, {r.randint(0, 4)}]"

    def pred(self, aliases: tuple[str, ...]) -> str:
        r = self.rng
        k = r.random()
        if k < 0.25:
            op = r.choice(["AND", "OR"])
            return f"({self.pred(aliases)} {op} {self.pred(aliases)})"
        if k < 0.3:
            return f"(NOT {self.pred(aliases)})"
        return self.atom(r.choice(aliases))

    @staticmethod
    def duck(sqlpp: str) -> str:
        return sqlpp.replace("IN [", "IN (").replace("]", ")")

    def hint(self) -> str:
        return self.rng.choice(["", "", "", " USE HASH(BUILD)", " USE HASH(PROBE)", " USE NL"])

    def query(self) -> RefQuery:
        k = self.rng.random()
        if k < 0.45:
            return self.ansi()
        if k < 0.6:
            return self.lookup()
        if k < 0.7:
            return self.index_join()
        if k < 0.85:
            return self.nest()
        return self.grouped()

    def _order(self, pp: str, dk: str, keys: list[str]) -> tuple[str, str, bool]:
        if self.rng.random() < 0.4:
            n = self.rng.randint(1, 30)
            pp += " ORDER BY " + ", ".join(keys) + f" LIMIT {n}"
            dk += " ORDER BY " + ", ".join(f"{x} NULLS FIRST" for x in keys) + f" LIMIT {n}"
            return pp, dk, True
        return pp, dk, False

    def ansi(self) -> RefQuery:
        r = self.rng
        kind = r.choice(["", "INNER ", "LEFT ", "LEFT OUTER ", "RIGHT "])
        key = r.choice(["b", "b", "g", "a"])
        on = f"l.{key} = r.{key}"
        if r.random() < 0.4:
            on += f" AND {self.pred(('l', 'r'))}"
        if r.random() < 0.15:
            on = f"l.b < r.b AND l.a = r.a + {r.randint(-3, 3)}"
        where = ""
        if r.random() < 0.5:
            where = f" WHERE {self.pred(('l', 'r'))}"
        elif kind.startswith("LEFT") and r.random() < 0.3:
            where = " WHERE r IS MISSING"
        hint = self.hint() if kind != "RIGHT " else ""
        value = r.choice(["l.a + r.a", "r.s", "l.f", "r.g || l.g"])
        pp = (
            f"SELECT l.id AS lid, r.id AS rid, {value} AS v FROM {LEFT} AS l "
            f"{kind}JOIN {RIGHT} AS r{hint} ON {on}{where}"
        )
        dwhere = where.replace("r IS MISSING", "r.meta_id IS NULL")
        dk = (
            f"SELECT l.id AS lid, r.id AS rid, {value} AS v FROM {LEFT} AS l "
            f"{kind}JOIN {RIGHT} AS r ON {self.duck(on)}{self.duck(dwhere)}"
        )
        pp, dk, ordered = self._order(pp, dk, ["lid", "rid"])
        return RefQuery(pp, dk, ["lid", "rid", "v"], ordered)

    def lookup(self) -> RefQuery:
        r = self.rng
        kind = r.choice(["", "LEFT "])
        where = f" WHERE {self.pred(('l', 'r'))}" if r.random() < 0.4 else ""
        chain_pp = chain_dk = ""
        cols = ["lid", "rid"]
        if r.random() < 0.3:  # a second join, ANSI, on the first one's document
            chain_pp = f" JOIN {RIGHT} AS r2 ON r2.b = r.b AND r2.a > {r.randint(5, 20)}"
            chain_dk = chain_pp
            cols.append("r2id")
        extra = ", r2.id AS r2id" if "r2id" in cols else ""
        pp = (
            f"SELECT l.id AS lid, r.id AS rid{extra} FROM {LEFT} AS l "
            f"{kind}JOIN {RIGHT} AS r ON KEYS l.k{chain_pp}{where}"
        )
        dk = (
            f"SELECT l.id AS lid, r.id AS rid{extra} FROM {LEFT} AS l "
            f"{kind}JOIN {RIGHT} AS r ON r.meta_id = l.k{chain_dk}{self.duck(where)}"
        )
        pp, dk, ordered = self._order(pp, dk, cols)
        return RefQuery(pp, dk, cols, ordered)

    def index_join(self) -> RefQuery:
        r = self.rng
        kind = r.choice(["", "LEFT "])
        where = f" WHERE {self.pred(('l', 'r'))}" if r.random() < 0.4 else ""
        pp = (
            f"SELECT r.id AS rid, l.id AS lid FROM {RIGHT} AS r "
            f"{kind}JOIN {LEFT} AS l ON KEY l.k FOR r{where}"
        )
        dk = (
            f"SELECT r.id AS rid, l.id AS lid FROM {RIGHT} AS r "
            f"{kind}JOIN {LEFT} AS l ON l.k = r.meta_id{self.duck(where)}"
        )
        pp, dk, ordered = self._order(pp, dk, ["rid", "lid"])
        return RefQuery(pp, dk, ["rid", "lid"], ordered)

    def nest(self) -> RefQuery:
        r = self.rng
        left = r.random() < 0.5
        form = r.choice(["ansi", "ansi", "keys"])
        if form == "keys":
            pp_on, dk_on = (
                "ON KEYS ARRAY_DISTINCT([l.k, 'r00001'])",
                "ON r.meta_id = l.k OR r.meta_id = 'r00001'",
            )
        else:
            cond = f"l.b = r.b AND {self.atom('r')}" if r.random() < 0.5 else "l.b = r.b"
            pp_on = f"{self.hint()} ON {cond}"
            dk_on = f"ON {self.duck(cond)}"
        where = f" WHERE {self.pred(('l',))}" if r.random() < 0.4 else ""
        pp = (
            f"SELECT l.id AS lid, ARRAY_LENGTH(r) AS n, ARRAY_SUM(ARRAY x.a FOR x IN r END) AS s "
            f"FROM {LEFT} AS l {'LEFT ' if left else ''}NEST {RIGHT} AS r {pp_on.strip()}{where}"
        )
        having = "" if left else " HAVING COUNT(r.meta_id) > 0"
        dk = (
            f"SELECT l.id AS lid, COUNT(r.meta_id) AS n, COALESCE(SUM(r.a), 0) AS s "
            f"FROM {LEFT} AS l LEFT JOIN {RIGHT} AS r {dk_on}{self.duck(where)} "
            f"GROUP BY l.id{having}"
        )
        pp, dk, ordered = self._order(pp, dk, ["lid"])
        return RefQuery(pp, dk, ["lid", "n", "s"], ordered)

    def grouped(self) -> RefQuery:
        r = self.rng
        kind = r.choice(["", "LEFT "])
        pp = (
            f"SELECT l.g AS g, COUNT(*) AS n, SUM(r.a) AS s, COUNT(r.id) AS m "
            f"FROM {LEFT} AS l {kind}JOIN {RIGHT} AS r{self.hint()} ON l.b = r.b GROUP BY l.g"
        )
        dk = (
            f"SELECT l.g AS g, COUNT(*) AS n, SUM(r.a) AS s, COUNT(r.id) AS m "
            f"FROM {LEFT} AS l {kind}JOIN {RIGHT} AS r ON l.b = r.b GROUP BY l.g, l.g__p"
        )
        return RefQuery(pp, dk, ["g", "n", "s", "m"], False)


def join_queries(seed: int, n: int) -> list[RefQuery]:
    gen = JoinGen(seed)
    return [gen.query() for _ in range(n)]

"""Random queries, each rendered twice: SQL++ for shardex and SQL for DuckDB under the
translation rules of ``tests/sql_reference``.

An expression is a small tree whose nodes render both dialects (``pp`` / ``dk``) and say
when the value is MISSING (``present``: a DuckDB condition, None when never MISSING):
arithmetic, concatenation and comparisons are MISSING when an operand is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

from tests.sql_reference.documents import GROUPS, WORDS

ALIAS: Final = "d"
NUM_COLS: Final = ("a", "b", "f")
INT_COLS: Final = ("a", "b")
PATTERNS: Final = ("ap%", "%an%", "b_n%", "%y", "C%", "%", "_a%", "band")


@dataclass(frozen=True)
class E:
    pp: str
    dk: str
    present: str | None = None  # DuckDB condition for "not MISSING"; None: never MISSING

    @staticmethod
    def col(name: str) -> E:
        ref = f"{ALIAS}.{name}"
        return E(ref, ref, None if name == "id" else f"{ref}__p")

    @staticmethod
    def lit(value: object) -> E:
        if isinstance(value, str):
            text = "'" + value + "'"  # generated words hold no quote
        elif isinstance(value, bool):
            text = "TRUE" if value else "FALSE"
        else:
            text = repr(value)
        return E(text, text)


def _both(x: E, y: E) -> str | None:
    parts = [p for p in (x.present, y.present) if p is not None]
    return " AND ".join(parts) if parts else None


def binary(x: E, op: str, y: E) -> E:
    return E(f"({x.pp} {op} {y.pp})", f"({x.dk} {op} {y.dk})", _both(x, y))


def value(x: E) -> str:
    """A projected value in DuckDB: NULL where SQL++ gives MISSING (``MISSING IS NULL`` is
    MISSING, while DuckDB's rewrite of it is FALSE)."""
    return x.dk if x.present is None else f"CASE WHEN {x.present} THEN {x.dk} END"


@dataclass
class RefQuery:
    sqlpp: str
    duck: str
    columns: list[str]  # projection names, in order (RAW: one)
    ordered: bool
    raw: bool = False
    hidden: int = 0  # trailing DuckDB columns to drop (DISTINCT presence)
    notes: list[str] = field(default_factory=list)


class QueryGen:
    def __init__(self, seed: int, keyspace: str, table: str) -> None:
        self.rng = random.Random(seed)
        self.keyspace = keyspace
        self.table = table

    # -- expressions ----------------------------------------------------------------------

    def num_lit(self, col: str) -> E:
        r = self.rng
        if col == "f":
            return E.lit(r.randint(-20, 80) / 4)
        return E.lit(r.randint(-6, 26) if col == "a" else r.randint(-1, 5))

    def num_expr(self, depth: int = 0) -> E:
        r = self.rng
        col = r.choice(NUM_COLS)
        x = E.col(col)
        k = r.random()
        if depth >= 1 or k < 0.45:
            return x
        if k < 0.7:
            return binary(x, r.choice("+-*"), self.num_lit(col))
        if k < 0.8:
            return binary(x, "/", E.lit(r.choice([2, 4, -5, 0.5])))
        if k < 0.88 and col in INT_COLS:
            return binary(x, "%", E.lit(r.choice([2, 3, 7])))
        return binary(x, r.choice("+-*"), self.num_expr(depth + 1))

    def predicate(self, depth: int = 0) -> E:
        r = self.rng
        k = r.random()
        if depth < 2 and k < 0.3:
            op = r.choice(["AND", "OR"])
            x, y = self.predicate(depth + 1), self.predicate(depth + 1)
            return E(f"({x.pp} {op} {y.pp})", f"({x.dk} {op} {y.dk})")
        if depth < 2 and k < 0.38:
            x = self.predicate(depth + 1)
            return E(f"(NOT {x.pp})", f"(NOT {x.dk})")
        return self.atom()

    def atom(self) -> E:
        r = self.rng
        kind = r.choice(["cmp", "cmp", "cmp", "strcmp", "in", "between", "like", "is", "bool"])
        if kind == "cmp":
            x = self.num_expr()
            op = r.choice(["=", "!=", "<", "<=", ">", ">="])
            if r.random() < 0.2:
                return binary(E.col("a"), op, E.col("b"))
            return binary(x, op, self.num_lit(r.choice(NUM_COLS)))
        if kind == "strcmp":
            col, pool = r.choice([("s", WORDS), ("g", GROUPS)])
            return binary(E.col(col), r.choice(["=", "!=", "<", ">="]), E.lit(r.choice(pool)))
        if kind == "in":
            col = r.choice(["a", "b", "s", "g"])
            pool = {"a": range(-5, 26), "b": range(5), "s": WORDS, "g": GROUPS}[col]
            items = [E.lit(v) for v in r.sample(list(pool), r.randint(1, 3))]
            neg = " NOT" if r.random() < 0.25 else ""
            x = E.col(col)
            return E(
                f"{x.pp}{neg} IN [{', '.join(i.pp for i in items)}]",
                f"{x.dk}{neg} IN ({', '.join(i.dk for i in items)})",
                x.present,
            )
        if kind == "between":
            col = r.choice(NUM_COLS)
            lo, hi = sorted([self.num_lit(col), self.num_lit(col)], key=lambda e: float(e.pp))
            neg = " NOT" if r.random() < 0.2 else ""
            x = E.col(col)
            return E(
                f"{x.pp}{neg} BETWEEN {lo.pp} AND {hi.pp}",
                f"{x.dk}{neg} BETWEEN {lo.dk} AND {hi.dk}",
                x.present,
            )
        if kind == "like":
            neg = " NOT" if r.random() < 0.25 else ""
            pat = r.choice(PATTERNS)
            x = E.col("s")
            return E(f"{x.pp}{neg} LIKE '{pat}'", f"{x.dk}{neg} LIKE '{pat}'", x.present)
        if kind == "is":
            x = E.col(r.choice(["a", "b", "f", "s", "g", "t"]))
            # MISSING IS [NOT] NULL is MISSING; the other tests are TRUE or FALSE.
            test, dk, present = r.choice(
                [
                    ("IS NULL", f"(CASE WHEN {x.present} THEN {x.dk} IS NULL END)", x.present),
                    (
                        "IS NOT NULL",
                        f"(CASE WHEN {x.present} THEN {x.dk} IS NOT NULL END)",
                        x.present,
                    ),
                    ("IS MISSING", f"(NOT {x.present})", None),
                    ("IS NOT MISSING", f"({x.present})", None),
                    ("IS VALUED", f"({x.dk} IS NOT NULL)", None),
                    ("IS NOT VALUED", f"({x.dk} IS NULL)", None),
                ]
            )
            return E(f"{x.pp} {test}", dk, present)
        t = E.col("t")
        return r.choice(
            [
                t,
                binary(t, "=", E.lit(r.random() < 0.5)),
                E(f"(NOT {t.pp})", f"(NOT {t.dk})", t.present),
            ]
        )

    def where(self) -> tuple[str, str]:
        if self.rng.random() < 0.15:
            return "", ""
        p = self.predicate()
        return f" WHERE {p.pp}", f" WHERE {p.dk}"

    def order_key(
        self, x: E, pp_name: str | None = None, dk_name: str | None = None
    ) -> tuple[str, str]:
        """One ORDER BY key in both dialects (the MISSING/NULL rule of the package doc)."""
        r = self.rng
        desc = r.random() < 0.4
        direction = " DESC" if desc else ""
        nulls = r.choice(["", " NULLS FIRST", " NULLS LAST"])
        first = (not desc) if not nulls else nulls == " NULLS FIRST"
        pp = f"{pp_name or x.pp}{direction}{nulls}"
        dk = f"{dk_name or x.dk}{direction} NULLS {'FIRST' if first else 'LAST'}"
        if x.present is not None:
            dk += f", {x.present}{direction}"
        return pp, dk

    # -- queries --------------------------------------------------------------------------

    def query(self) -> RefQuery:
        k = self.rng.random()
        if k < 0.35:
            return self.select(ordered=False)
        if k < 0.6:
            return self.select(ordered=True)
        if k < 0.8:
            return self.grouped()
        if k < 0.88:
            return self.global_aggregates()
        if k < 0.95:
            return self.distinct()
        return self.raw()

    def _from(self) -> tuple[str, str]:
        return f" FROM {self.keyspace} AS {ALIAS}", f" FROM {self.table} AS {ALIAS}"

    def terms(self) -> list[E]:
        r = self.rng
        out: list[E] = []
        for _ in range(r.randint(1, 3)):
            k = r.random()
            if k < 0.5:
                out.append(E.col(r.choice(["a", "b", "f", "s", "g", "t", "id"])))
            elif k < 0.8:
                out.append(self.num_expr())
            elif k < 0.9:
                x = E.col("s")
                out.append(binary(x, "||", E.lit(r.choice(["!", "-x"]))))
            else:
                out.append(self.atom())
        return out

    def select(self, *, ordered: bool) -> RefQuery:
        r = self.rng
        terms = self.terms()
        names = [f"x{i}" for i in range(len(terms))]
        fpp, fdk = self._from()
        wpp, wdk = self.where()
        pp = "SELECT " + ", ".join(f"{t.pp} AS {n}" for t, n in zip(terms, names, strict=True))
        dk = "SELECT " + ", ".join(f"{value(t)} AS {n}" for t, n in zip(terms, names, strict=True))
        pp, dk = pp + fpp + wpp, dk + fdk + wdk
        if ordered:
            keys = [
                self.order_key(E.col(c))
                for c in r.sample(["a", "b", "f", "s", "g"], r.randint(1, 2))
            ]
            keys.append(self.order_key(E.col("id")))
            pp += " ORDER BY " + ", ".join(k[0] for k in keys)
            dk += " ORDER BY " + ", ".join(k[1] for k in keys)
            if r.random() < 0.7:
                limit = f" LIMIT {r.randint(0, 40)}"
                offset = f" OFFSET {r.randint(0, 60)}" if r.random() < 0.5 else ""
                pp, dk = pp + limit + offset, dk + limit + offset
            elif r.random() < 0.3:
                offset = f" OFFSET {r.randint(0, 200)}"
                pp, dk = pp + offset, dk + offset
        return RefQuery(pp, dk, names, ordered)

    def aggregates(self) -> list[E]:
        r = self.rng
        out: list[E] = []
        for _ in range(r.randint(1, 3)):
            fn = r.choice(["COUNT(*)", "COUNT", "COUNT DISTINCT", "SUM", "AVG", "MIN", "MAX"])
            if fn == "COUNT(*)":
                out.append(E("COUNT(*)", "COUNT(*)"))
            elif fn == "COUNT DISTINCT":
                x = E.col(r.choice(["a", "b", "s", "g"]))
                out.append(E(f"COUNT(DISTINCT {x.pp})", f"COUNT(DISTINCT {x.dk})"))
            elif fn in ("MIN", "MAX"):
                x = E.col(r.choice(["a", "f", "s"]))
                out.append(E(f"{fn}({x.pp})", f"{fn}({x.dk})"))
            elif fn == "COUNT":
                x = E.col(r.choice(["a", "f", "s", "t"]))
                out.append(E(f"COUNT({x.pp})", f"COUNT({x.dk})"))
            else:
                x = self.num_expr()
                out.append(E(f"{fn}({x.pp})", f"{fn}({x.dk})"))
        return out

    def grouped(self) -> RefQuery:
        r = self.rng
        keys = [E.col(c) for c in r.sample(["b", "g", "t"], r.randint(1, 2))]
        if r.random() < 0.2:
            keys = [binary(E.col("a"), "%", E.lit(3))]
        aggs = self.aggregates()
        names = [f"k{i}" for i in range(len(keys))] + [f"v{i}" for i in range(len(aggs))]
        terms = keys + aggs
        fpp, fdk = self._from()
        wpp, wdk = self.where()
        pp = "SELECT " + ", ".join(f"{t.pp} AS {n}" for t, n in zip(terms, names, strict=True))
        dk = "SELECT " + ", ".join(f"{t.dk} AS {n}" for t, n in zip(terms, names, strict=True))
        pp += fpp + wpp + " GROUP BY " + ", ".join(k.pp for k in keys)
        dk += (
            fdk
            + wdk
            + " GROUP BY "
            + ", ".join(k.dk + (f", {k.present}" if k.present else "") for k in keys)
        )
        if r.random() < 0.4:
            h = r.choice(
                [
                    (f"COUNT(*) > {r.randint(0, 30)}",) * 2,
                    (f"SUM({ALIAS}.a) >= {r.randint(-10, 200)}",) * 2,
                    (f"MIN({ALIAS}.f) < {r.randint(-5, 10)}",) * 2,
                ]
            )
            pp, dk = pp + f" HAVING {h[0]}", dk + f" HAVING {h[1]}"
        ordered = r.random() < 0.6
        if ordered:
            order = []
            if r.random() < 0.5:  # an aggregate first, by its alias; the keys break ties
                order.append(self.order_key(E("v0", "v0", None)))
            order += [self.order_key(k, f"k{i}", f"k{i}") for i, k in enumerate(keys)]
            pp += " ORDER BY " + ", ".join(o[0] for o in order)
            dk += " ORDER BY " + ", ".join(o[1] for o in order)
            if r.random() < 0.4:
                limit = f" LIMIT {r.randint(1, 6)} OFFSET {r.randint(0, 3)}"
                pp, dk = pp + limit, dk + limit
        return RefQuery(pp, dk, names, ordered)

    def global_aggregates(self) -> RefQuery:
        aggs = self.aggregates()
        names = [f"v{i}" for i in range(len(aggs))]
        fpp, fdk = self._from()
        wpp, wdk = self.where()
        pp = "SELECT " + ", ".join(f"{t.pp} AS {n}" for t, n in zip(aggs, names, strict=True))
        dk = "SELECT " + ", ".join(f"{t.dk} AS {n}" for t, n in zip(aggs, names, strict=True))
        return RefQuery(pp + fpp + wpp, dk + fdk + wdk, names, ordered=False)

    def distinct(self) -> RefQuery:
        r = self.rng
        terms = [E.col(c) for c in r.sample(["b", "g", "t", "s"], r.randint(1, 2))]
        if r.random() < 0.3:
            terms.append(binary(E.col("a"), "%", E.lit(2)))
        names = [f"x{i}" for i in range(len(terms))]
        fpp, fdk = self._from()
        wpp, wdk = self.where()
        pp = "SELECT DISTINCT " + ", ".join(
            f"{t.pp} AS {n}" for t, n in zip(terms, names, strict=True)
        )
        hidden = [t.present or "TRUE" for t in terms]
        dk = "SELECT DISTINCT " + ", ".join(
            [f"{t.dk} AS {n}" for t, n in zip(terms, names, strict=True)]
            + [f"{h} AS __p{i}" for i, h in enumerate(hidden)]
        )
        return RefQuery(pp + fpp + wpp, dk + fdk + wdk, names, False, hidden=len(hidden))

    def raw(self) -> RefQuery:
        x = self.rng.choice([E.col("a"), E.col("s"), self.num_expr()])
        fpp, fdk = self._from()
        wpp, wdk = self.where()
        keep = x.present or "TRUE"
        # RAW drops rows whose value is MISSING: DuckDB keeps only rows where it is present.
        dk_where = f" WHERE ({wdk.removeprefix(' WHERE ')}) AND {keep}" if wdk else f" WHERE {keep}"
        return RefQuery(
            f"SELECT RAW {x.pp}{fpp}{wpp}",
            f"SELECT {x.dk} AS v{fdk}{dk_where}",
            ["v"],
            False,
            raw=True,
        )

"""Random set operations (UNION / INTERSECT / EXCEPT [ALL]) in both dialects.

Every branch projects the same terms (so the values line up) under its own WHERE, so the
branches' rows overlap. Translation, beyond the package's rules:

* Each DuckDB branch also projects the presence of every term (``__p<i>``, hidden from the
  comparison): SQL++ compares whole result objects, where a MISSING field is absent and so
  differs from a NULL one; the presence columns keep DuckDB's set operators apart likewise.
* N1QL combines left to right with one precedence: DuckDB's side nests each step as a
  subquery (``SELECT * FROM (...)``), so its INTERSECT-first rule never applies.
* UNION, INTERSECT and EXCEPT without ALL are set operations in both. N1QL's INTERSECT ALL
  keeps every left row whose value the right side has, EXCEPT ALL every one it lacks (SQL's
  bag rules would keep min(m, n) / m - n copies): DuckDB's side is a semi-join
  (``[NOT] EXISTS`` with ``IS NOT DISTINCT FROM`` on every column, presence included).
* ORDER BY of the whole reads the result's fields: every term (with its presence, the
  package's MISSING-before-NULL rule) so the order is total up to equal rows.
"""

from __future__ import annotations

from tests.sql_reference.generator import ALIAS, E, QueryGen, RefQuery, value


def _columns(n: int) -> list[str]:
    return [f"x{i}" for i in range(n)] + [f"__p{i}" for i in range(n)]


def _combine(op: str, all_: bool, left: str, right: str, n: int) -> str:
    lsel, rsel = f"SELECT * FROM ({left}) AS l", f"SELECT * FROM ({right}) AS r"
    if op == "UNION" or not all_:
        return f"{lsel} {op}{' ALL' if all_ else ''} {rsel}"
    same = " AND ".join(f"r.{c} IS NOT DISTINCT FROM l.{c}" for c in _columns(n))
    neg = "NOT " if op == "EXCEPT" else ""
    return f"{lsel} WHERE {neg}EXISTS ({rsel} WHERE {same})"


def set_op_query(gen: QueryGen) -> RefQuery:
    r = gen.rng
    terms: list[E] = [E.col(c) for c in r.sample(["b", "g", "t", "s", "a", "f"], r.randint(1, 2))]
    if r.random() < 0.3:
        terms.append(gen.num_expr())
    n = len(terms)
    names = [f"x{i}" for i in range(n)]
    fpp, fdk = f" FROM {gen.keyspace} AS {ALIAS}", f" FROM {gen.table} AS {ALIAS}"

    def branch() -> tuple[str, str]:
        wpp, wdk = gen.where()
        pp = "SELECT " + ", ".join(f"{t.pp} AS {m}" for t, m in zip(terms, names, strict=True))
        dk = "SELECT " + ", ".join(
            [f"{value(t)} AS {m}" for t, m in zip(terms, names, strict=True)]
            + [f"{t.present or 'TRUE'} AS __p{i}" for i, t in enumerate(terms)]
        )
        return pp + fpp + wpp, dk + fdk + wdk

    pp, dk = branch()
    for _ in range(r.choice([1, 1, 1, 2])):
        op, all_ = r.choice(["UNION", "INTERSECT", "EXCEPT"]), r.random() < 0.5
        bpp, bdk = branch()
        pp = f"{pp} {op}{' ALL' if all_ else ''} {bpp}"
        dk = _combine(op, all_, dk, bdk, n)
    ordered = r.random() < 0.5
    if ordered:
        keys = [gen.order_key(t, m, m) for t, m in zip(terms, names, strict=True)]
        # The presence column by name: DuckDB reads the combined result's columns.
        dk_keys = [
            k[1].replace(f", {t.present}", f", __p{i}")
            for i, (k, t) in enumerate(zip(keys, terms, strict=True))
        ]
        pp += " ORDER BY " + ", ".join(k[0] for k in keys)
        dk = f"SELECT * FROM ({dk}) AS o ORDER BY " + ", ".join(dk_keys)
        if r.random() < 0.6:
            tail = f" LIMIT {r.randint(0, 30)}" + (
                f" OFFSET {r.randint(0, 20)}" if r.random() < 0.5 else ""
            )
            pp, dk = pp + tail, dk + tail
    return RefQuery(pp, dk, names, ordered, hidden=n)

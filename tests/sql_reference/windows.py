"""Random window functions in both dialects: ``SELECT d.id, <window>, ... FROM docs AS d
[WHERE ...]``, compared as multisets (``id`` makes each row one document's).

Translation, beyond the package's rules:

* PARTITION BY x keeps MISSING apart from NULL: DuckDB partitions by ``x, x__p``; a window's
  ORDER BY key is the package's ``x NULLS FIRST|LAST, x__p`` pair.
* Functions whose value depends on the order among peers (ROW_NUMBER, NTILE, LAG, LEAD,
  FIRST/LAST/NTH_VALUE, aggregates over ROWS frames) order by ``id`` last, so the order is
  total; RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST and aggregates over RANGE or GROUPS
  frames see the ties (peers share their values in both).
* RANGE frames with an offset order by ``id`` alone (one numeric key that is never NULL).
* ARRAY_AGG is left out: shardex returns its values in collation order (decision 0119).
"""

from __future__ import annotations

from tests.sql_reference.generator import ALIAS, NUM_COLS, E, QueryGen, RefQuery, value

RANKING = ("RANK", "DENSE_RANK", "PERCENT_RANK", "CUME_DIST")
VALUES = ("FIRST_VALUE", "LAST_VALUE", "NTH_VALUE")
AGGREGATES = ("SUM", "AVG", "MIN", "MAX", "COUNT", "COUNT(*)")


def _frame(gen: QueryGen, unit: str) -> tuple[str, str]:
    r = gen.rng
    start = r.choice(["UNBOUNDED PRECEDING", f"{r.randint(0, 3)} PRECEDING", "CURRENT ROW"])
    end = r.choice(["CURRENT ROW", f"{r.randint(0, 3)} FOLLOWING", "UNBOUNDED FOLLOWING"])
    exclude = r.choice(["", "", " EXCLUDE CURRENT ROW", " EXCLUDE GROUP", " EXCLUDE TIES"])
    text = f" {unit} BETWEEN {start} AND {end}{exclude}"
    return text, text


def window_term(gen: QueryGen) -> E:
    r = gen.rng
    ppp, pdk = "", ""
    if r.random() < 0.6:
        p = E.col(r.choice(["g", "b", "t"]))
        ppp, pdk = f"PARTITION BY {p.pp} ", f"PARTITION BY {p.dk}, {p.present} "
    keys = [gen.order_key(E.col(c)) for c in r.sample(["a", "b", "f", "s", "g"], r.randint(1, 2))]
    kind = r.choice(["ROW_NUMBER", "NTILE", "LAG", "LEAD", *RANKING, *VALUES, *AGGREGATES * 2])
    total = kind not in RANKING and not (kind in AGGREGATES and r.random() < 0.4)
    if total:
        keys.append(gen.order_key(E.col("id")))
    fpp = fdk = ""
    if kind in AGGREGATES or kind in VALUES:
        k = r.random()
        if k < 0.4 and total:
            fpp, fdk = _frame(gen, "ROWS")
        elif k < 0.6:
            fpp, fdk = _frame(gen, "GROUPS")
        elif k < 0.7:
            keys = [gen.order_key(E.col("id"))]
            n, m = r.randint(0, 5), r.randint(0, 5)
            fpp = fdk = f" RANGE BETWEEN {n} PRECEDING AND {m} FOLLOWING"
    opp = "ORDER BY " + ", ".join(k[0] for k in keys)
    odk = "ORDER BY " + ", ".join(k[1] for k in keys)
    over_pp, over_dk = f" OVER ({ppp}{opp}{fpp})", f" OVER ({pdk}{odk}{fdk})"
    x = E.col(r.choice([*NUM_COLS, "s"]))
    if kind in ("ROW_NUMBER", *RANKING):
        return E(f"{kind}(){over_pp}", f"{kind}(){over_dk}")
    if kind == "NTILE":
        n = r.randint(1, 9)
        return E(f"NTILE({n}){over_pp}", f"NTILE({n}){over_dk}")
    nulls = r.random() < 0.3
    ipp, idk = (" IGNORE NULLS", " IGNORE NULLS") if nulls else ("", "")
    if kind in ("LAG", "LEAD"):
        off = r.randint(0, 3)
        default = E.lit("zz") if x.pp.endswith(".s") else gen.num_lit("a")
        args_pp = f"{x.pp}, {off}, {default.pp}"
        return E(
            f"{kind}({args_pp}){ipp}{over_pp}", f"{kind}({x.dk}, {off}, {default.dk}{idk}){over_dk}"
        )
    if kind in VALUES:
        n = r.randint(1, 3)
        arg = f", {n}" if kind == "NTH_VALUE" else ""
        return E(f"{kind}({x.pp}{arg}){ipp}{over_pp}", f"{kind}({x.dk}{arg}{idk}){over_dk}")
    if kind == "COUNT(*)":
        return E(f"COUNT(*){over_pp}", f"COUNT(*){over_dk}")
    if kind in ("SUM", "AVG"):
        x = E.col(r.choice(NUM_COLS))
    return E(f"{kind}({x.pp}){over_pp}", f"{kind}({x.dk}){over_dk}")


def window_query(gen: QueryGen) -> RefQuery:
    r = gen.rng
    terms = [window_term(gen) for _ in range(r.randint(1, 2))]
    names = ["id"] + [f"w{i}" for i in range(len(terms))]
    wpp, wdk = gen.where()
    frm = f" FROM {gen.keyspace} AS {ALIAS}"
    fdk = f" FROM {gen.table} AS {ALIAS}"
    pp = f"SELECT {ALIAS}.id AS id, " + ", ".join(
        f"{t.pp} AS {n}" for t, n in zip(terms, names[1:], strict=True)
    )
    dk = f"SELECT {ALIAS}.id AS id, " + ", ".join(
        f"{value(t)} AS {n}" for t, n in zip(terms, names[1:], strict=True)
    )
    pp, dk = pp + frm + wpp, dk + fdk + wdk
    ordered = r.random() < 0.3
    if ordered:
        tail = f" ORDER BY id LIMIT {r.randint(0, 40)}"
        pp, dk = pp + tail, dk + tail
    return RefQuery(pp, dk, names, ordered)

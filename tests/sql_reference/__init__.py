"""The SQL correctness suite's reference: generated documents and queries run on shardex and
on DuckDB, compared result for result.

Translation rules (SQL++ -> DuckDB), where the two languages differ:

* Documents are flat: every field has one JSON type (ints, floats, strings, booleans) or is
  NULL or MISSING; no field mixes types, so SQL++'s collation across types never matters.
  The table has one column per field plus ``<field>__p`` (present: false when MISSING).
* Outputs: a projected MISSING is an absent field in SQL++ and NULL in DuckDB; rows are
  compared with absent fields read as NULL. ``SELECT RAW x`` drops rows whose value is
  MISSING, so the DuckDB query also filters on the presence of ``x``.
* ``IS NULL`` / ``IS NOT NULL`` of a MISSING value is MISSING, not FALSE (``NOT`` keeps it
  MISSING): ``CASE WHEN x__p THEN x IS [NOT] NULL END``; ``IS MISSING`` is ``NOT x__p``;
  ``IS NOT MISSING`` is ``x__p``; ``IS VALUED`` is ``IS NOT NULL``; ``IN [..]`` is
  ``IN (..)``. WHERE keeps a row only when its condition is TRUE in both; a MISSING
  operand is NULL on the DuckDB side, which AND/OR/NOT treat as SQL++ treats MISSING.
* ORDER BY: SQL++ puts NULL and MISSING first ascending and last descending (DuckDB's
  default is NULLS LAST), with MISSING before NULL ascending; each key becomes ``x {dir}
  NULLS {pos}, x__p {dir}``. Every ordered query ends with ``id`` so the order is total.
* GROUP BY x groups MISSING apart from NULL: DuckDB groups by ``x, x__p``. DISTINCT keeps
  a MISSING apart from a NULL: DuckDB's DISTINCT also carries the presence of each term
  (hidden ``__p<i>`` columns, dropped before comparing).
* Numbers compare by value (1 == 1.0; floats within 1e-12 relative, e.g. AVG), DuckDB
  DECIMAL results as floats. Division only by non-zero literals (1/0 is NULL in SQL++,
  an error or infinity elsewhere); ``%`` truncates in both.
"""

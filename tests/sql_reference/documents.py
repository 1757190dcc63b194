"""Generated flat documents and their DuckDB table (rules: ``tests/sql_reference``)."""

from __future__ import annotations

import random
from typing import Any, Final

# field -> DuckDB type; ``id`` is always present and unique (the final ORDER BY key).
FIELDS: Final = {
    "id": "BIGINT",
    "a": "BIGINT",
    "b": "BIGINT",
    "f": "DOUBLE",
    "s": "VARCHAR",
    "g": "VARCHAR",
    "t": "BOOLEAN",
}
WORDS: Final = (
    "apple",
    "apricot",
    "banana",
    "band",
    "bandana",
    "cherry",
    "Cherry",
    "date",
    "fig",
    "kiwi",
    "",
)
GROUPS: Final = ("x", "y", "z")


def _value(rng: random.Random, field: str) -> Any:
    if field == "a":
        return rng.randint(-5, 25)
    if field == "b":
        return rng.randint(0, 4)
    if field == "f":
        return rng.randint(-20, 80) / 4  # quarters: sums of them are exact in binary
    if field == "s":
        return rng.choice(WORDS)
    if field == "g":
        return rng.choice(GROUPS)
    return rng.random() < 0.5  # t


def make_documents(seed: int, n: int) -> dict[str, dict[str, Any]]:
    """``n`` documents (docid -> document); each field other than ``id`` is NULL or
    MISSING about one time in ten each."""
    rng = random.Random(seed)
    docs: dict[str, dict[str, Any]] = {}
    for i in range(n):
        doc: dict[str, Any] = {"id": i}
        for field in FIELDS:
            if field == "id":
                continue
            r = rng.random()
            if r < 0.1:
                continue  # MISSING
            doc[field] = None if r < 0.2 else _value(rng, field)
        docs[f"d{i:05d}"] = doc
    return docs


def load_duckdb(con: Any, table: str, docs: dict[str, dict[str, Any]]) -> None:
    """Create ``table`` with a column per field and its ``__p`` presence column."""
    cols = [f"{f} {t}" for f, t in FIELDS.items()] + [f"{f}__p BOOLEAN" for f in FIELDS]
    con.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
    rows = [
        tuple(doc.get(f) for f in FIELDS) + tuple(f in doc for f in FIELDS) for doc in docs.values()
    ]
    marks = ", ".join(["?"] * (2 * len(FIELDS)))
    con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)

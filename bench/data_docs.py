"""The data service benchmark's documents (``bench.data_service``): the demo's users with
benchmark extras, ~500 B - 1 KB each, deterministic for a seed; and their size figures.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import msgspec

__all__ = ["Doc", "Item", "doc_sizes", "make_docs"]

Doc = dict[str, Any]
Item = tuple[str, Doc]

_STREETS = ("Main", "Oak", "Pine", "Maple", "Cedar", "Elm", "Lake", "Hill", "Park", "River")
_WORD_TEXT = (
    "data store index query shard node partition replica stream change seqno durable batch "
    "latency throughput cluster topology migrate rebalance json document key value range "
    "scan filter sort join group aggregate window cursor snapshot commit log flush sync"
)
_WORDS = _WORD_TEXT.split()
_ORDER_STATUS = ("paid", "shipped", "delivered", "returned")


def _extras(rng: random.Random, i: int, orders: int) -> Doc:
    """What the benchmark adds to a demo user to reach ~500 B - 1 KB: a street and geo point
    in the address, preferences, the last few orders (nested objects in an array), a bio."""
    return {
        "street": f"{rng.randint(1, 999)} {rng.choice(_STREETS)} Street",
        "geo": {"lat": round(rng.uniform(-60, 70), 5), "lon": round(rng.uniform(-180, 180), 5)},
        "preferences": {
            "newsletter": rng.random() < 0.4,
            "language": rng.choice(("en", "de", "fr", "pt", "ja", "es")),
            "theme": rng.choice(("light", "dark", "system")),
        },
        "recent_orders": [
            {
                "order_id": f"o{i}-{k}",
                "total": round(rng.uniform(5, 500), 2),
                "items": rng.randint(1, 9),
                "status": rng.choice(_ORDER_STATUS),
            }
            for k in range(min(orders, 3))
        ],
        "bio": " ".join(rng.choices(_WORDS, k=rng.randint(15, 45))),
    }


def make_docs(n: int, seed: int) -> tuple[list[Item], str]:
    """``n`` documents (docid, doc) and a description of where they come from: the demo's
    users (``shardex.demo.datagen``, the same documents the demo loads) with benchmark
    extras from a second seeded stream, so they weigh ~500 B - 1 KB. Deterministic."""
    from shardex.demo.datagen import users

    rng = random.Random(seed + 1)
    out: list[Item] = []
    for i, user in enumerate(users(n, seed)):
        extra = _extras(rng, i, int(user.get("orders", 0)))
        doc: Doc = dict(user)
        doc["address"] = {**user["address"], "street": extra.pop("street"), "geo": extra.pop("geo")}
        doc.update(extra)
        out.append((str(user["id"]), doc))
    return out, "shardex.demo.datagen users + bench extras (street, geo, preferences, orders, bio)"


def doc_sizes(items: Sequence[Item]) -> dict[str, float]:
    sizes = sorted(len(msgspec.json.encode(d)) for _, d in items)
    return {
        "min_bytes": sizes[0],
        "median_bytes": sizes[len(sizes) // 2],
        "max_bytes": sizes[-1],
        "mean_bytes": round(sum(sizes) / len(sizes), 1),
    }

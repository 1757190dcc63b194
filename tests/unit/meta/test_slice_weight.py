"""The expected load of index slices (``meta/slice_weight.py``): what placement balances."""

from __future__ import annotations

from shardex.core.topology import Topology
from shardex.index import make_definition
from shardex.meta.index_state import ACTIVE, DELETED, INIT, IndexRecord
from shardex.meta.slice_weight import (
    ARRAY_FACTOR,
    UNIT,
    copies_load,
    index_weights,
    slice_weights,
)


def _index(
    index_id: str, parts: int = 1, *, items: int = 0, key: str = "k", state: str = ACTIVE
) -> IndexRecord:
    defn = make_definition(
        id=index_id,
        name=f"ix_{index_id}",
        keyspace="ks",
        keys=[key],
        partition_by=["META().id"] if parts > 1 else None,
        num_partition=parts,
    )
    return IndexRecord(definition=defn, state=state, items_count=items)


def test_a_slice_carries_its_share_of_the_index_whatever_the_partition_count() -> None:
    indexes = {"one": _index("one"), "eight": _index("eight", 8), "three": _index("three", 3)}
    assert slice_weights(indexes) == {"one": UNIT, "eight": UNIT // 8, "three": UNIT // 3}
    # An array index keeps an entry per element: more per document.
    arr = _index("arr", key="DISTINCT ARRAY t FOR t IN tags END")
    assert index_weights({"arr": arr}) == {"arr": ARRAY_FACTOR * UNIT}


def test_measured_indexes_weigh_their_entries_and_the_others_an_average() -> None:
    indexes = {
        "big": _index("big", 4, items=3_000_000),
        "small": _index("small", items=1_000_000),
        "new": _index("new"),  # not measured yet: taken for an average index
        "gone": _index("gone", items=50_000_000, state=DELETED),  # counts for nothing
    }
    assert index_weights(indexes) == {"big": 3 * UNIT // 2, "small": UNIT // 2, "new": UNIT}
    assert slice_weights(indexes)["big"] == 3 * UNIT // 8


def test_copies_load_counts_every_copy_of_the_accepted_indexes() -> None:
    indexes = {"r": _index("r", 2), "i": _index("i", state=INIT)}
    topologies = {
        "r": [Topology(seq_num=2, assignment={0: "n1", 1: "n2"}, replicas={0: ["n3"]})],
        "i": [Topology(seq_num=1, assignment={0: "n3"})],
    }
    load = copies_load(indexes, topologies, lambda rec: rec.state != INIT)
    assert load == {"n1": UNIT // 2, "n2": UNIT // 2, "n3": UNIT // 2}
    assert copies_load(indexes, topologies, lambda _rec: True)["n3"] == UNIT // 2 + UNIT

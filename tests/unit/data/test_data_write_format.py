"""The write path's storage format is pinned: the RocksDB keys and values a fixed set of ops
writes (under a fixed clock and fixed partition uuids) and every op's outcome, error text and
details included, are compared with the bytes the pre-optimisation ``Partition.stage`` wrote
(recorded from its tree). ``stage`` encodes its records as tuples in the field order of
``DocRecord`` / ``ChangeRecord``, so a change to either struct, or to the encoding, fails here."""

from __future__ import annotations

import time

import pytest

import shardex.data.engine as engine_mod
from shardex.api.records import MutationResult
from shardex.data.engine import DataEngine
from shardex.data.records import ChangeRecord, DocRecord, decode_change, decode_doc, encode
from shardex.errors import ShardexError

# (key hex, value hex) of each partition's column family, in key order.
EXPECTED_ITEMS: dict[int, list[tuple[str, str]]] = {
    0: [
        ("630000000000000001", "96a5c3a92dc3bca6757073657274cd07d0c4087b2279223a20327d0000"),
        ("630000000000000002", "96a5c3a92dc3bca664656c657465cd0bb8c4000000"),
        ("64c3a92dc3bc", "96cd0bb802c3c4000000"),
        (
            "6d",
            "89a86b65797370616365a26b73a9706172746974696f6e00ae6e756d5f706172746974696f6e7302"
            "aa686967685f7365716e6f02ac6661696c6f7665725f6c6f679192cd111100ab70757267655f7365"
            "716e6f00a76d61785f636173cd0bb8a9646f635f636f756e7400a57374617465a6616374697665",
        ),
    ],
    1: [
        ("630000000000000001", "96a161a6757073657274cd03e8c4077b2278223a317d0000"),
        ("630000000000000002", "96a161a6757073657274cd0fa0c4087b2278223a20327d0000"),
        ("630000000000000003", "96a161a6757073657274cd1388c4087b2278223a20347d0000"),
        ("630000000000000004", "96a161a6757073657274cd1389c4087b2278223a20357d0000"),
        ("630000000000000005", "96a161a664656c657465cd138ac4000000"),
        ("630000000000000006", "96a161a6757073657274cd138bc40f7b22616761696e223a20747275657d0000"),
        (
            "630000000000000007",
            "96a163a6757073657274cd138cc41a7b226b223a205b312c20322e352c202273222c206e756c6c5d"
            "7d0000",
        ),
        ("630000000000000008", "96a163a664656c657465cd138dc4000000"),
        ("6461", "96cd138b06c2c40f7b22616761696e223a20747275657d0000"),
        ("6463", "96cd138d08c3c4000000"),
        (
            "6d",
            "89a86b65797370616365a26b73a9706172746974696f6e01ae6e756d5f706172746974696f6e7302"
            "aa686967685f7365716e6f08ac6661696c6f7665725f6c6f679192cd222200ab70757267655f7365"
            "716e6f00a76d61785f636173cd138da9646f635f636f756e7401a57374617465a6616374697665",
        ),
    ],
}

# (partition, seqno, uuid, cas) of each success; (error class, message, details) of each error.
EXPECTED_OUTCOMES: list[object] = [
    (1, 1, 8738, 1000),
    (0, 1, 4369, 2000),
    (1, 2, 8738, 4000),
    ("DocExists", "DOC_EXISTS: document 'a' already exists", {"docid": "a", "partition": 1}),
    (
        "DocNotFound",
        "DOC_NOT_FOUND: document 'missing' not found",
        {"docid": "missing", "partition": 1},
    ),
    (
        "CasMismatch",
        "CAS_MISMATCH: CAS mismatch on 'a': expected 999, document has 4000",
        {"actual": 4000, "docid": "a", "expected": 999, "partition": 1},
    ),
    (1, 3, 8738, 5000),
    (1, 4, 8738, 5001),
    (1, 5, 8738, 5002),
    ("DocNotFound", "DOC_NOT_FOUND: document 'a' not found", {"docid": "a", "partition": 1}),
    (1, 6, 8738, 5003),
    ("DocNotFound", "DOC_NOT_FOUND: document 'nope' not found", {"docid": "nope", "partition": 0}),
    (
        "BadRequest",
        "BAD_REQUEST: document must be a JSON object: Expected `object`, got `array`",
        {"docid": "b"},
    ),
    (1, 7, 8738, 5004),
    (0, 2, 4369, 3000),
    (1, 8, 8738, 5005),
]


@pytest.fixture
def engine(tmp_path, monkeypatch):
    # The CAS clock: five readings, then one behind them, so max_cas + 1 takes over.
    clock = iter([1_000, 2_000, 3_000, 4_000, 5_000, *[50] * 100])
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    uuids = iter(range(0x1111, 0x10000, 0x1111))
    monkeypatch.setattr(engine_mod, "new_uuid", lambda: next(uuids))
    eng = DataEngine(tmp_path / "db", boot_id="boot")
    eng.create_keyspace("ks", 2)
    for p in range(2):
        eng.create_partition("ks", p)
    yield eng
    eng.close()


def _outcome(r: MutationResult | ShardexError) -> object:
    if isinstance(r, ShardexError):
        return (type(r).__name__, str(r), r.details)
    return (r.partition, r.seqno, r.uuid, r.cas)


def test_ops_write_the_recorded_bytes_and_outcomes(engine):
    out: list[MutationResult | ShardexError] = [
        engine.insert("ks", "a", {"x": 1}),
        engine.upsert("ks", "é-ü", b'{"y": 2}', durability="memory"),
    ]
    # Partition 1 holds "a" and "c", partition 0 "é-ü" and "nope": both staged in one batch,
    # with repeated docids (the in-batch current version), tombstones and every check.
    out += engine.mutate_many(
        "ks",
        [
            ("upsert", "a", b'{"x": 2}', None),
            ("insert", "a", b"{}", None),
            ("replace", "missing", b"{}", None),
            ("upsert", "a", b'{"x": 3}', 999),
            ("replace", "a", b'{"x": 4}', 4000),
            ("upsert", "a", b'{"x": 5}', 5000),
            ("delete", "a", None, None),
            ("upsert", "a", b"{}", 5002),
            ("insert", "a", b'{"again": true}', None),
            ("delete", "nope", None, None),
            ("upsert", "b", b"[]", None),
            ("upsert", "c", b'{"k": [1, 2.5, "s", null]}', None),
            ("delete", "é-ü", None, 2000),
        ],
        durability="memory",
    )
    out.append(engine.delete("ks", "c"))
    assert [_outcome(r) for r in out] == EXPECTED_OUTCOMES
    for p, expected in EXPECTED_ITEMS.items():
        cf = engine._parts[("ks", p)].cf
        assert [(k.hex(), v.hex()) for k, v in cf.iterate()] == expected, f"partition {p}"


@pytest.mark.parametrize("body", [b"", b"{}", b'{"a": "' + b"x" * 300 + b'"}'])
@pytest.mark.parametrize("cas", [1, 2**63 - 1])
def test_records_decode_as_the_structs_they_mirror(body, cas):
    """The tuples ``stage`` encodes are the structs' array form, for any field values."""
    for deleted in (False, True):
        assert encode((cas, 7, deleted, body, 0, 0)) == encode(DocRecord(cas, 7, deleted, body))
        assert decode_doc(encode((cas, 7, deleted, body, 0, 0))) == DocRecord(cas, 7, deleted, body)
    rec = ChangeRecord("d-é", "delete", cas, body)
    assert encode(("d-é", "delete", cas, body, 0, 0)) == encode(rec)
    assert decode_change(encode(("d-é", "delete", cas, body, 0, 0))) == rec

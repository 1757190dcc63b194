"""The demo's verdicts (``shardex.demo.checks``): "rows read == rows expected" and "every
acknowledged write visible" must be False whenever a row is lost, doubled, unexpected or
carries a stale key."""

from __future__ import annotations

from shardex.demo.checks import check_visibility, compare_rows, row_key


def test_equal_multisets_compare_equal_in_any_order() -> None:
    c = compare_rows(["b", "a", "c"], ["a", "b", "c"])
    assert c.equal
    assert (c.read, c.expected) == (3, 3)
    assert "rows read == rows expected: True" in c.describe()


def test_lost_doubled_and_unexpected_rows_are_named() -> None:
    c = compare_rows(["a", "a", "x"], ["a", "b"])
    assert not c.equal
    assert c.lost == ["b"]
    assert c.doubled == ["a"]
    assert c.unexpected == ["x"]
    text = c.describe()
    assert "rows read == rows expected: False" in text
    assert "1 lost" in text and "1 doubled" in text and "1 unexpected" in text


def test_a_row_read_twice_is_not_equal_even_when_the_sets_match() -> None:
    c = compare_rows(["a", "b", "b"], ["a", "b"])
    assert not c.equal and c.doubled == ["b"] and not c.lost


def test_row_key_tells_keys_and_docids_apart() -> None:
    a = row_key({"docid": "d1", "key": ["Lyon", 30]})
    assert a == row_key({"docid": "d1", "key": ["Lyon", 30]})
    assert a != row_key({"docid": "d1", "key": ["Lyon", 31]})
    assert a != row_key({"docid": "d2", "key": ["Lyon", 30]})
    # 1 and 1.0 are one JSON number but distinct from "1"
    assert row_key({"docid": "d", "key": [1]}) != row_key({"docid": "d", "key": ["1"]})


def _rows(*pairs: tuple[str, int]) -> list[dict]:
    return [{"docid": d, "key": ["Reykjavik", age]} for d, age in pairs]


def test_every_acknowledged_write_seen_with_its_key() -> None:
    must = {"u1": ["Reykjavik", 30], "u2": ["Reykjavik", 40]}
    v = check_visibility(_rows(("u1", 30), ("u2", 40), ("u3", 50)), must, {"u1", "u2", "u3"})
    assert v.ok
    assert (v.must_see, v.seen, v.in_flight_seen) == (2, 2, 1)


def test_a_missing_write_fails() -> None:
    v = check_visibility(_rows(("u1", 30)), {"u1": ["Reykjavik", 30], "u2": ["Reykjavik", 40]})
    assert not v.ok and v.missing == ["u2"] and v.seen == 1


def test_a_stale_key_fails() -> None:
    v = check_visibility(_rows(("u1", 29)), {"u1": ["Reykjavik", 30]})
    assert not v.ok
    assert v.wrong_key == [("u1", ["Reykjavik", 30], ["Reykjavik", 29])]


def test_a_row_nobody_wrote_and_a_doubled_row_fail() -> None:
    v = check_visibility(_rows(("u1", 30), ("zz", 1)), {"u1": ["Reykjavik", 30]}, {"u1"})
    assert not v.ok and v.unexpected == ["zz"]
    v = check_visibility(_rows(("u1", 30), ("u1", 30)), {"u1": ["Reykjavik", 30]})
    assert not v.ok and v.doubled == ["u1"]

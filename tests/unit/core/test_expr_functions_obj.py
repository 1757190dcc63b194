"""Object functions and the ``a[*]`` operator, with both engines (``expr_eval_env.py``).

The OBJECT_PAIRS_NESTED rows marked "conformance" are Couchbase's case_obj.json cases 5-7
(which select ``FROM {...} t``), with the constant passed straight to the function.
"""

from __future__ import annotations

from tests.unit.core.expr_eval_env import M, N, check_table

NESTED = "{'a':1,'b':2,'c':{'a':[{'b':3},{'b':4},{'b':[{'c':5}]}]}}"
FLIGHTS = (
    "[{'flight': 'AI444', 'utc': '4:44:44', 'codename': 'green'},"
    " {'flight': 'AI333', 'utc': '3:33:33', 'alert': 'red'},"
    " {'flight': 'AI222', 'utc': '2:22:22', 'codename': 'yellow'}]"
)

OBJECT_FUNCTIONS: list[tuple[str, object]] = [
    ("OBJECT_LENGTH(address)", 3),
    ("OBJECT_LENGTH(tags)", N),
    ("OBJECT_LENGTH(nope)", M),
    ("OBJECT_NAMES({'b': 1, 'a': 2})", ["a", "b"]),
    ("OBJECT_PAIRS({'b': 1, 'a': NULL})", [{"name": "a", "val": N}, {"name": "b", "val": 1}]),
    ("OBJECT_PAIRS({'b': 1}, {'types': TRUE})", [{"name": "b", "type": "number"}]),
    ("OBJECT_PAIRS({'b': 1}, 1)", N),
    ("OBJECT_OUTER_PAIRS({'b': 1})", [{"name": "b", "val": 1}]),
    ("OBJECT_VALUES({'b': 1, 'a': [2]})", [[2], 1]),
    ("OBJECT_VALUES('x')", N),
    # a[*] collates the fields of an array of objects (NULL where one lacks the name) ...
    (
        f"OBJECT_VALUES({FLIGHTS}[*])",
        [
            [N, "red", N],
            ["green", N, "yellow"],
            ["AI444", "AI333", "AI222"],
            ["4:44:44", "3:33:33", "2:22:22"],
        ],
    ),
    # ... and the INNER forms leave out the objects that lack it.
    (
        f"OBJECT_INNER_VALUES({FLIGHTS}[*])",
        [
            "red",
            ["green", "yellow"],
            ["AI444", "AI333", "AI222"],
            ["4:44:44", "3:33:33", "2:22:22"],
        ],
    ),
    (
        f"OBJECT_INNER_PAIRS({FLIGHTS}[*])[0:2]",
        [{"name": "alert", "val": "red"}, {"name": "codename", "val": ["green", "yellow"]}],
    ),
    ("OBJECT_INNER_PAIRS({'a': 1, 'b': NULL})", [{"name": "a", "val": 1}]),
    ("OBJECT_TYPES({'a': 1, 'b': NULL, 'c': {}})", {"a": "number", "b": "null", "c": "object"}),
    (
        "OBJECT_TYPES_NESTED({'a': [1, 'x'], 'b': {'c': TRUE}})",
        {"a": ["number", "string"], "b": {"c": "boolean"}},
    ),
    ("OBJECT_UNWRAP({'a': [1]})", [1]),
    ("OBJECT_UNWRAP({'a': 1, 'b': 2})", N),
    ("OBJECT_UNWRAP({})", N),
    ("OBJECT_UNWRAP(nope)", M),
    ("OBJECT_CONCAT({'a': 1}, {'b': 2}, {'a': 3})", {"a": 3, "b": 2}),
    ("OBJECT_CONCAT({'a': 1}, [])", N),
    ("OBJECT_ADD({'a': 1}, 'b', 2)", {"a": 1, "b": 2}),
    ("OBJECT_ADD({'a': 1}, 'a', 2)", N),  # an existing name
    ("OBJECT_ADD({'a': 1}, nope, 2)", {"a": 1}),
    ("OBJECT_ADD({'a': 1}, 'b', nope)", {"a": 1}),
    ("OBJECT_ADD({'a': 1}, NULL, 2)", {"a": 1}),
    ("OBJECT_ADD({'a': 1}, 3, 2)", N),
    ("OBJECT_ADD('x', 'b', 2)", N),
    ("OBJECT_ADD(nope, 'b', 2)", M),
    ("OBJECT_PUT({'a': 1}, 'a', 2)", {"a": 2}),
    ("OBJECT_PUT({'a': 1}, 'a', nope)", {}),
    ("OBJECT_PUT({'a': 1}, nope, 2)", M),
    ("OBJECT_PUT({'a': 1}, 1, 2)", N),
    ("OBJECT_REMOVE({'a': 1, 'b': 2, 'c': 3}, 'a', 'c')", {"b": 2}),
    ("OBJECT_REMOVE({'a': 1}, 1)", N),
    ("OBJECT_RENAME({'a': 1, 'b': 2}, 'a', 'z')", {"z": 1, "b": 2}),
    ("OBJECT_RENAME({'a': 1, 'b': 2}, 'a', 'b')", {"b": 1}),
    ("OBJECT_RENAME({'a': 1}, 'x', 'y')", {"a": 1}),
    ("OBJECT_REPLACE({'a': 1, 'b': 1.0, 'c': '1'}, 1, 0)", {"a": 0, "b": 0, "c": "1"}),
    # Paths: composites by default, fields only (array elements are steps), names quoted
    # when they are not plain words.
    (
        "OBJECT_PATHS({'g': {'x': 1}, 'likes': ['a'], 'r': [{'q q': 1}, {'q q': 2}]})",
        ["g", "g.x", "likes", "r", "r[0].`q q`", "r[1].`q q`"],
    ),
    (
        "OBJECT_PATHS({'r': [{'q': 1}, {'q': 2}]}, {'arraysubscript': FALSE})",
        ["r", "r[*].q"],
    ),
    (
        "OBJECT_PATHS({'r': [{'q': 1}, {'q': 2}]}, {'arraysubscript': FALSE, 'unique': FALSE})",
        ["r", "r[*].q", "r[*].q"],
    ),
    ("OBJECT_PATHS({'g': {'x': 1}, 'h': 2}, {'composites': FALSE})", ["g.x", "h"]),
    ("OBJECT_PATHS({'a': {'name': 1}}, {'pattern': '^n', 'patternspace': 'field'})", ["a.name"]),
    ("OBJECT_PATHS({'a': {'name': 1}}, {'pattern': '^n'})", []),
    ("OBJECT_PATHS({'a': 1}, 'x')", N),
    ("OBJECT_PATHS(nope)", M),
    (
        f"OBJECT_PAIRS_NESTED({NESTED})",  # conformance
        [
            {"name": "a", "val": 1},
            {"name": "b", "val": 2},
            {"name": "c.a[0].b", "val": 3},
            {"name": "c.a[1].b", "val": 4},
            {"name": "c.a[2].b[0].c", "val": 5},
        ],
    ),
    (
        f"OBJECT_PAIRS_NESTED({NESTED}, {{'pattern': '\\\\[2\\\\].b'}})",  # conformance
        [{"name": "c.a[2].b[0].c", "val": 5}],
    ),
    (
        f"OBJECT_PAIRS_NESTED({NESTED}, {{'composites': TRUE}})",  # conformance
        [
            {"name": "a", "val": 1},
            {"name": "b", "val": 2},
            {"name": "c", "val": {"a": [{"b": 3}, {"b": 4}, {"b": [{"c": 5}]}]}},
            {"name": "c.a", "val": [{"b": 3}, {"b": 4}, {"b": [{"c": 5}]}]},
            {"name": "c.a[0]", "val": {"b": 3}},
            {"name": "c.a[0].b", "val": 3},
            {"name": "c.a[1]", "val": {"b": 4}},
            {"name": "c.a[1].b", "val": 4},
            {"name": "c.a[2]", "val": {"b": [{"c": 5}]}},
            {"name": "c.a[2].b", "val": [{"c": 5}]},
            {"name": "c.a[2].b[0]", "val": {"c": 5}},
            {"name": "c.a[2].b[0].c", "val": 5},
        ],
    ),
    (
        "OBJECT_PAIRS_NESTED({'a': {'b': 'x'}}, {'types': TRUE})",
        [{"name": "a.b", "type": "string"}],
    ),
    ("OBJECT_FIELD(address, 'geo.lat')", 37.3),
    ("OBJECT_FIELD(address, '`GEO`i.lat')", 37.3),
    ("OBJECT_FIELD(address, '`GEO`.lat')", N),  # case matters without the trailing i
    ("OBJECT_FIELD({'r': [{'x y': 1}, {'x y': 2}]}, 'r[1].`x y`')", 2),
    ("OBJECT_FIELD({'r': [1, 2]}, 'r[-1]')", 2),
    ("OBJECT_FIELD({'r': [1, 2]}, 'r[2]')", N),
    ("OBJECT_FIELD(address, 'nope')", N),
    ("OBJECT_FIELD(address, 'geo..lat')", N),
    ("OBJECT_FIELD(address, 3)", N),
    # PAIRS: the documented examples
    ("PAIRS('N1QL')", N),
    ("PAIRS(4)", N),
    ("PAIRS([1, 2, 3])", []),
    ("PAIRS({'name': 3})", [["name", 3]]),
    (
        "PAIRS({'name': [1, 2, 3]})",
        [["name", [1, 2, 3]], ["name", 1], ["name", 2], ["name", 3]],
    ),
    (
        "PAIRS({'r': [{'b': 1}, {'c': 2}], 'a': {'x': 0}})",
        [
            ["a", {"x": 0}],
            ["x", 0],
            ["r", [{"b": 1}, {"c": 2}]],
            ["r", {"b": 1}],
            ["r", {"c": 2}],
            ["b", 1],
            ["c", 2],
        ],
    ),
]


def test_object_functions() -> None:
    check_table(OBJECT_FUNCTIONS)

"""Object functions (N1QL's OBJECT_*).

Registered into the shared registry on import (see ``functions_num``). As N1QL: names come
back in collation order (OBJECT_NAMES, OBJECT_PAIRS, OBJECT_VALUES and the nested forms), a
non-object argument gives NULL and a MISSING one MISSING. A nested field's path is written
with SQL++'s own operators (``c.a[2].b``); a name that is not a plain word is back-quoted
(``reviews[0].`Check in / front desk```), so OBJECT_FIELD can read every path OBJECT_PATHS
reports. Path patterns are RE2, as REGEXP_CONTAINS.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from shardex.core.values import MISSING

from .functions import _fn, _int_arg
from .functions_array import _eq_key
from .functions_str import _regex
from .ops import RANK_ARRAY, RANK_OBJECT, type_name, type_rank

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_$-]+")


def _is_object(v: Any) -> bool:
    return type(v) is dict or type_rank(v) == RANK_OBJECT


def _is_array(v: Any) -> bool:
    return type(v) is list or type_rank(v) == RANK_ARRAY


def _items(obj: Any) -> list[tuple[str, Any]]:
    return sorted(obj.items())


# -- whole-object functions ------------------------------------------------------------------


@_fn("OBJECT_LENGTH", 1)
def _length(obj: Any) -> Any:
    return len(obj) if _is_object(obj) else None


@_fn("OBJECT_NAMES", 1)
def _names(obj: Any) -> Any:
    return sorted(obj) if _is_object(obj) else None


def _options(options: Any) -> dict[str, Any] | None:
    """An options argument: absent is no options; anything but an object is NULL."""
    if options is MISSING:
        return {}
    return dict(options) if _is_object(options) else None


@_fn("OBJECT_PAIRS", 1, 2, "OBJECT_OUTER_PAIRS")
def _pairs(obj: Any, options: Any = MISSING) -> Any:
    opts = _options(options)
    if not _is_object(obj) or opts is None:
        return None
    if opts.get("types") is True:
        return [{"name": k, "type": type_name(v)} for k, v in _items(obj)]
    return [{"name": k, "val": v} for k, v in _items(obj)]


@_fn("OBJECT_VALUES", 1, -1, "OBJECT_OUTER_VALUES")
def _values(obj: Any) -> Any:
    return [v for _, v in _items(obj)] if _is_object(obj) else None


def _inner(v: Any) -> Any:
    """A value as the INNER forms see it: an array (as ``a[*]`` collates) loses its NULL
    entries, objects that lacked the name, and a single survivor stands alone."""
    if not _is_array(v):
        return v
    kept = [x for x in v if x is not None]
    return kept[0] if len(kept) == 1 else kept


@_fn("OBJECT_INNER_PAIRS", 1)
def _inner_pairs(obj: Any) -> Any:
    if not _is_object(obj):
        return None
    return [{"name": k, "val": _inner(v)} for k, v in _items(obj) if v is not None]


@_fn("OBJECT_INNER_VALUES", 1)
def _inner_values(obj: Any) -> Any:
    return [_inner(v) for _, v in _items(obj) if v is not None] if _is_object(obj) else None


@_fn("OBJECT_TYPES", 1)
def _types(obj: Any) -> Any:
    return {k: type_name(v) for k, v in obj.items()} if _is_object(obj) else None


def _types_nested(v: Any) -> Any:
    if _is_object(v):
        return {k: _types_nested(x) for k, x in v.items()}
    if _is_array(v):
        return [_types_nested(x) for x in v]
    return type_name(v)


@_fn("OBJECT_TYPES_NESTED", 1)
def _object_types_nested(obj: Any) -> Any:
    return _types_nested(obj) if _is_object(obj) else None


@_fn("OBJECT_UNWRAP", 1)
def _unwrap(obj: Any) -> Any:
    if _is_object(obj) and len(obj) == 1:
        return next(iter(obj.values()))
    return None


def _field_pairs(v: Any, out: list[list[Any]]) -> list[list[Any]]:
    """PAIRS' walk: each field as [name, value], an array field's elements as [name,
    element] too, then the fields nested below (in objects and in array elements)."""
    if _is_object(v):
        for k, x in _items(v):
            out.append([k, x])
            if _is_array(x):
                out.extend([k, e] for e in x)
            _field_pairs(x, out)
    elif _is_array(v):
        for e in v:
            _field_pairs(e, out)
    return out


@_fn("PAIRS", 1)
def _all_pairs(v: Any) -> Any:
    """[name, value] of every field at any depth (an array of scalars has none: [])."""
    return _field_pairs(v, []) if _is_object(v) or _is_array(v) else None


@_fn("OBJECT_CONCAT", 2, None)
def _concat(*objects: Any) -> Any:
    """Later objects' values win for a name several objects have."""
    if not all(_is_object(o) for o in objects):
        return None
    out: dict[str, Any] = {}
    for o in objects:
        out.update(o)
    return out


# -- editing ---------------------------------------------------------------------------------


@_fn("OBJECT_ADD", 3, propagate=False)
def _add(obj: Any, name: Any, value: Any) -> Any:
    """A new name only: one the object has already gives NULL; a MISSING name or value, or
    a NULL name, leaves the object as it is."""
    if obj is MISSING:
        return MISSING
    if not _is_object(obj):
        return None
    if name is MISSING or value is MISSING or name is None:
        return obj
    if type(name) is not str or name in obj:
        return None
    return {**obj, name: value}


@_fn("OBJECT_PUT", 3, propagate=False)
def _put(obj: Any, name: Any, value: Any) -> Any:
    """Add or replace ``name``; a MISSING value removes it."""
    if obj is MISSING or name is MISSING:
        return MISSING
    if not _is_object(obj) or type(name) is not str:
        return None
    out = dict(obj)
    if value is MISSING:
        out.pop(name, None)
    else:
        out[name] = value
    return out


@_fn("OBJECT_REMOVE", 2, None)
def _remove(obj: Any, *names: Any) -> Any:
    if not _is_object(obj) or not all(type(n) is str for n in names):
        return None
    drop = set(names)
    return {k: v for k, v in obj.items() if k not in drop}


@_fn("OBJECT_RENAME", 3)
def _rename(obj: Any, old: Any, new: Any) -> Any:
    """``old`` renamed ``new`` (replacing a field already named ``new``)."""
    if not _is_object(obj) or type(old) is not str or type(new) is not str:
        return None
    if old not in obj:
        return dict(obj)
    return {(new if k == old else k): v for k, v in obj.items() if k != new or k == old}


@_fn("OBJECT_REPLACE", 3)
def _replace(obj: Any, old: Any, new: Any) -> Any:
    """Every top-level value equal to ``old`` (SQL++ equality) replaced by ``new``."""
    if not _is_object(obj):
        return None
    target = _eq_key(old)
    return {k: (new if target is not None and _eq_key(v) == target else v) for k, v in obj.items()}


# -- nested fields: paths --------------------------------------------------------------------


def _step_name(name: str) -> str:
    if _PLAIN_NAME.fullmatch(name):
        return name
    return "`" + name.replace("`", "``") + "`"


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any, bool]]:
    """Every object field and array element below ``value``: (path, value, whether it is a
    leaf: neither an object nor an array, or an empty one)."""
    if _is_object(value):
        children = [((f"{path}." if path else "") + _step_name(k), v) for k, v in _items(value)]
    elif _is_array(value):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return
    for child_path, v in children:
        leaf = not ((_is_object(v) or _is_array(v)) and len(v) > 0)
        yield child_path, v, leaf
        yield from _walk(v, child_path)


def _field_paths(value: Any, path: str, subscripts: bool) -> list[tuple[str, str, bool]]:
    """The paths of the object fields below ``value`` (array elements are steps, not fields
    of their own): (path, field name, whether no field lies below it)."""
    out: list[tuple[str, str, bool]] = []
    if _is_object(value):
        for k, v in _items(value):
            p = (f"{path}." if path else "") + _step_name(k)
            below = _field_paths(v, p, subscripts)
            out.append((p, k, not below))
            out.extend(below)
    elif _is_array(value):
        for i, v in enumerate(value):
            out.extend(_field_paths(v, f"{path}[{i if subscripts else '*'}]", subscripts))
    return out


def _flag(opts: dict[str, Any], name: str, default: bool) -> bool:
    v = opts.get(name, default)
    return v if type(v) is bool else default


def _matcher(opts: dict[str, Any]) -> Callable[[str], bool] | None:
    """The ``pattern`` option as a search predicate (absent: everything matches)."""
    pattern = opts.get("pattern")
    if pattern is None:
        return lambda s: True
    if type(pattern) is not str:
        return None
    rx = _regex(pattern)
    return lambda s: rx.search(s) is not None


def _picking(obj: Any, options: Any) -> tuple[dict[str, Any], Callable[[str], bool]] | None:
    """An object's options and its path matcher; None (the function's NULL) for a
    non-object, bad options or a bad pattern."""
    opts = _options(options)
    if not _is_object(obj) or opts is None:
        return None
    match = _matcher(opts)
    return None if match is None else (opts, match)


@_fn("OBJECT_PATHS", 1, 2)
def _paths(obj: Any, options: Any = MISSING) -> Any:
    picked = _picking(obj, options)
    if picked is None:
        return None
    opts, match = picked
    composites = _flag(opts, "composites", True)
    subscripts = _flag(opts, "arraysubscript", True)
    on_field = opts.get("patternspace") == "field"
    out = []
    for path, name, deepest in _field_paths(obj, "", subscripts):
        if (composites or deepest) and match(name if on_field else path):
            out.append(path)
    if _flag(opts, "unique", True):
        out = list(dict.fromkeys(out))
    return sorted(out)


@_fn("OBJECT_PAIRS_NESTED", 1, 2)
def _pairs_nested(obj: Any, options: Any = MISSING) -> Any:
    picked = _picking(obj, options)
    if picked is None:
        return None
    opts, match = picked
    composites = _flag(opts, "composites", False)
    types = _flag(opts, "types", False)
    out = [
        {"name": path, "type": type_name(v)} if types else {"name": path, "val": v}
        for path, v, leaf in _walk(obj, "")
        if (composites or leaf) and match(path)
    ]
    return sorted(out, key=lambda pair: pair["name"])


_PATH_STEP = re.compile(
    r"""\s*(?:
        (?P<dot>\.)?\s*(?:
            (?P<word>[A-Za-z_$][A-Za-z0-9_$-]*)
          | `(?P<quoted>(?:[^`]|``)*)`(?P<ci>i)?
        )
      | \[\s*(?P<index>-?\d+)\s*\]
    )""",
    re.VERBOSE,
)


def parse_field_path(text: str) -> list[tuple[str, Any]] | None:
    """``a.b[1].`c d`i`` as steps: ("field", name), ("field_ci", name), ("index", n); None
    when the text is not such a path."""
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        m = _PATH_STEP.match(text, pos)
        if m is None or m.end() == pos or (steps and m["index"] is None and not m["dot"]):
            return None
        if not steps and m["dot"]:
            return None
        if m["index"] is not None:
            steps.append(("index", int(m["index"])))
        elif m["word"] is not None:
            steps.append(("field", m["word"]))
        else:
            name = m["quoted"].replace("``", "`")
            steps.append(("field_ci" if m["ci"] else "field", name))
        pos = m.end()
    return steps or None


@_fn("OBJECT_FIELD", 2)
def _field(obj: Any, path: Any) -> Any:
    """The value at a nested field path (``"reviews[1].ratings.Overall"``); NULL when the
    path does not lead anywhere."""
    if not _is_object(obj) or type(path) is not str:
        return None
    steps = parse_field_path(path.strip())
    if steps is None:
        return None
    v = obj
    for kind, step in steps:
        if kind == "index":
            i = _int_arg(step)
            if not _is_array(v) or i is None or not -len(v) <= i < len(v):
                return None
            v = v[i]
        elif not _is_object(v):
            return None
        elif kind == "field":
            if step not in v:
                return None
            v = v[step]
        else:
            folded = step.casefold()
            hit = next((k for k in sorted(v) if k.casefold() == folded), None)
            if hit is None:
                return None
            v = v[hit]
    return v

"""Every registered message type, and one valid instance of each (for tests that send the
whole message union over a real connection)."""

from __future__ import annotations

import enum
import importlib
import pkgutil
from typing import Any

import msgspec
from msgspec import inspect as mi

import shardex
from shardex.net.messages import Message, registered_messages

# Packages that define no message and import Spark or the CLI: not needed for the union.
_SKIP = ("shardex.pipeline", "shardex.demo", "shardex.cli", "shardex.testing")


def all_messages() -> dict[str, type[Message]]:
    """Tag -> class of every message shardex defines (not the tests' own), after importing
    every module that may define one."""
    for mod in pkgutil.walk_packages(shardex.__path__, "shardex."):
        if not mod.name.startswith(_SKIP):
            importlib.import_module(mod.name)
    return {t: c for t, c in registered_messages().items() if c.__module__.startswith("shardex.")}


def sample(cls: type[Message]) -> Message:
    """An instance of ``cls`` with every required field filled by a small valid value."""
    value = _value(mi.type_info(cls))
    assert isinstance(value, cls)
    return value


def _value(t: mi.Type) -> Any:
    if isinstance(t, mi.StructType):
        return t.cls(**{f.name: _value(f.type) for f in t.fields if f.required})
    if isinstance(t, mi.UnionType):
        none = [x for x in t.types if isinstance(x, mi.NoneType)]
        return None if none else _value(t.types[0])
    if isinstance(t, mi.TupleType):
        return tuple(_value(x) for x in t.item_types)
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.EnumType):
        return next(iter(t.cls)) if issubclass(t.cls, enum.Enum) else None
    if isinstance(t, mi.IntType):
        return max(t.ge or 0, (t.gt or 0) + 1 if t.gt is not None else 0, 1)
    simple: dict[type, Any] = {
        mi.StrType: "x",
        mi.FloatType: 1.0,
        mi.BoolType: False,
        mi.BytesType: b"",
        mi.NoneType: None,
        mi.AnyType: None,
        mi.ListType: [],
        mi.VarTupleType: (),
        mi.SetType: set(),
        mi.FrozenSetType: frozenset(),
        mi.DictType: {},
        mi.RawType: msgspec.Raw(b"\xc0"),
    }
    for kind, v in simple.items():
        if isinstance(t, kind):
            return v
    raise TypeError(f"no sample for {t!r}")

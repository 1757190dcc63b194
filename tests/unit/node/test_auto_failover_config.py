"""The node config's ``auto_failover*`` keys: defaults, overrides and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardex.errors import ConfigError
from shardex.node.config import load_config

SECRET = "0123456789abcdef0123"


def load(tmp_path: Path, **values: Any) -> Any:
    return load_config(None, {"name": "n1", "data_dir": str(tmp_path), "secret": SECRET, **values})


def test_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    assert cfg.auto_failover is True
    assert cfg.auto_failover_timeout == 5.0 and cfg.auto_failover_max_count == 1


def test_overrides_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "node.toml"
    f.write_text(
        'name = "n1"\nsecret = "0123456789abcdef0123"\ndata_dir = "d"\n'
        "auto_failover = false\nauto_failover_timeout = 10\nauto_failover_max_count = 2\n"
    )
    cfg = load_config(f)
    assert cfg.auto_failover is False
    assert cfg.auto_failover_timeout == 10.0 and cfg.auto_failover_max_count == 2


@pytest.mark.parametrize(
    ("values", "key", "text"),
    [
        (
            {"auto_failover_timeout": 1.5, "failure_timeout": 1.0},
            "auto_failover_timeout",
            "minimum 2",
        ),
        (
            {"auto_failover_timeout": 3.0},
            "auto_failover_timeout",
            "must exceed failure_timeout (3 s)",
        ),
        ({"auto_failover_timeout": 4.0, "failure_timeout": 4.0}, "auto_failover_timeout", "exceed"),
        ({"auto_failover_timeout": "soon"}, "auto_failover_timeout", "not a number"),
        ({"auto_failover_max_count": 0}, "auto_failover_max_count", "out of range"),
        ({"auto_failover": "maybe"}, "auto_failover", "not a boolean"),
    ],
)
def test_bad_values_name_the_key_the_value_and_a_hint(
    tmp_path: Path, values: dict[str, Any], key: str, text: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, **values)
    assert e.value.details["key"] == key and text in e.value.message
    assert repr(values[key]) in e.value.message or str(values[key]) in e.value.message
    assert e.value.details["hint"]


def test_a_timeout_above_failure_timeout_is_fine(tmp_path: Path) -> None:
    cfg = load(tmp_path, auto_failover_timeout=2.0, failure_timeout=1.5)
    assert cfg.auto_failover_timeout == 2.0

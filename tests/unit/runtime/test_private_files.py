"""Owner-only data dirs and secrets: created 0700, refused when others may read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardex.errors import ConfigError
from shardex.runtime.files import make_private_dir, require_private


def test_make_private_dir_creates_owner_only(tmp_path: Path) -> None:
    d = tmp_path / "a" / "data"
    make_private_dir(d)
    assert d.stat().st_mode & 0o777 == 0o700
    require_private(d, "data_dir")  # accepted as created


@pytest.mark.parametrize("mode", [0o750, 0o705, 0o755, 0o770])
def test_group_or_world_accessible_dir_is_refused(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "data"
    make_private_dir(d)
    d.chmod(mode)
    with pytest.raises(ConfigError) as info:
        require_private(d, "data_dir")
    e = info.value
    assert e.details == {
        "key": "data_dir",
        "value": str(d),
        "mode": f"{mode:04o}",
        "hint": f"chmod 700 {d}",
    }
    assert str(d) in e.message and f"{mode:04o}" in e.message


def test_missing_path_is_left_to_its_reader(tmp_path: Path) -> None:
    require_private(tmp_path / "absent", "secret_file")  # no error: the reader reports it

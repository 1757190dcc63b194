"""Names are checked against the whole string: ``$`` also matches before a final newline, so a
``re.match(r"^...$")`` check let ``"ks\\n"`` through as a keyspace name."""

from __future__ import annotations

import pytest

from shardex.api.index_ddl import check_index_name
from shardex.api.keyspaces import check_keyspace_name
from shardex.errors import ShardexError
from shardex.meta import partitioning

SUFFIXES = ["\n", "\r\n", " ", "\t"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_keyspace_name_with_trailing_whitespace_is_refused(suffix: str) -> None:
    assert check_keyspace_name("ks") == "ks"
    with pytest.raises(ShardexError, match="invalid keyspace name") as info:
        check_keyspace_name("ks" + suffix)
    assert "hint" in info.value.details


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_engine_keyspace_name_with_trailing_whitespace_is_refused(suffix: str) -> None:
    assert partitioning.check_keyspace_name("ks") == "ks"
    with pytest.raises(ShardexError):
        partitioning.check_keyspace_name("ks" + suffix)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_index_name_with_trailing_whitespace_is_refused(suffix: str) -> None:
    assert check_index_name("by_age") == "by_age"
    with pytest.raises(ShardexError, match="invalid index name") as info:
        check_index_name("by_age" + suffix)
    assert "hint" in info.value.details

"""Which errors of a document call are ``fail`` (nothing written) and which ``info``."""

from __future__ import annotations

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.testing.history import CAS_MISMATCH
from shardex.testing.outcomes import is_refusal, write_outcome


def err(code: ErrorCode, **details: object) -> ShardexError:
    return ShardexError("x", code=code, details=dict(details))


@pytest.mark.parametrize(
    "code",
    [ErrorCode.NOT_MY_PARTITION, ErrorCode.NODE_FAILED_OVER, ErrorCode.DURABILITY_IMPOSSIBLE],
)
def test_refusals_are_fail(code: ErrorCode) -> None:
    assert write_outcome(err(code)) == ("fail", code.value)


def test_no_lease_is_fail_other_unavailable_is_info() -> None:
    assert write_outcome(err(ErrorCode.NODE_UNAVAILABLE, reason="no_lease"))[0] == "fail"
    assert write_outcome(err(ErrorCode.NODE_UNAVAILABLE))[0] == "info"
    assert not is_refusal(err(ErrorCode.NODE_UNAVAILABLE, reason="no_master"))


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.TIMEOUT,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.DURABILITY_AMBIGUOUS,
        ErrorCode.INTERNAL,
    ],
)
def test_unknown_outcomes_are_info(code: ErrorCode) -> None:
    assert write_outcome(err(code)) == ("info", code.value)


@pytest.mark.parametrize(
    "code", [ErrorCode.CAS_MISMATCH, ErrorCode.DOC_EXISTS, ErrorCode.DOC_NOT_FOUND]
)
def test_a_conditional_write_that_did_not_match(code: ErrorCode) -> None:
    assert write_outcome(err(code), conditional=True) == ("fail", CAS_MISMATCH)
    assert write_outcome(err(code))[0] == "info"  # unconditional: unexpected, so unknown

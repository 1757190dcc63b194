"""Where a diverged replica copy's history and its active's part (``replica_rollback``)."""

from __future__ import annotations

from shardex.api.records import FailoverEntry as E
from shardex.data.replica_rollback import branch_point

COPY_LOG = [E(7, 100), E(5, 40), E(1, 0)]  # newest first; the copy is at seqno 130


def test_the_active_left_the_shared_branch_first() -> None:
    assert branch_point(COPY_LOG, 130, [E(9, 90), E(5, 40), E(1, 0)]) == (90, 1)


def test_the_copy_left_the_shared_branch_first() -> None:
    assert branch_point(COPY_LOG, 130, [E(9, 120), E(5, 40), E(1, 0)]) == (100, 1)


def test_a_copy_on_the_active_branch_shares_all_of_it() -> None:
    assert branch_point(COPY_LOG, 130, [E(7, 100), E(5, 40), E(1, 0)]) == (130, 0)


def test_an_older_shared_branch() -> None:
    assert branch_point(COPY_LOG, 130, [E(9, 20), E(1, 0)]) == (20, 2)


def test_no_shared_branch() -> None:
    assert branch_point(COPY_LOG, 130, [E(3, 0)]) is None

"""A request_plus scan's high-seqno round to the data nodes it does not read
(``ClusterView.shared_partial_high_seqnos``): a lone scan's round is sent at once,
without a task, and reads this node's own partitions while its requests are out; scans
asking while a round is out share the next one, which starts after every one of them
arrived (scan-request flow step 9) once the round ahead is answered, or after ``CHAIN_WAIT``.

n1 (this node) owns partitions 0 and 2, read in-process; n2 owns 1 and 3 and answers
through ``_ask``, replaced here by futures the tests answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardex.api.data import HighSeqnosReply
from shardex.core.timestamp import Timestamp
from shardex.errors import NodeUnavailable
from shardex.scan import cluster_view
from shardex.scan.cluster_view import ClusterView
from shardex.scan.scan_ts import covers_seqnos
from tests.integration.scan.test_scan_request_plus import _view
from tests.integration.scan_env import KS, NODES, _until

pytestmark = pytest.mark.timeout(30)

Entries = dict[int, tuple[int, int]]


def owner(p: int) -> str:
    return NODES[p % 2]


class Asks:
    """``view``'s requests to other nodes, held until the test answers them; ``events``
    records the order of requests sent and local reads."""

    def __init__(self, view: ClusterView, local: Entries) -> None:
        self.sent: list[tuple[str, list[int], asyncio.Future[Any]]] = []
        self.events: list[str] = []

        def ask(node: str, keyspace: str, parts: list[int]) -> asyncio.Future[Any]:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self.sent.append((node, parts, fut))
            self.events.append(f"ask {node}")
            return fut

        def read(keyspace: str, parts: list[int]) -> Entries:
            self.events.append("local")
            return {p: local[p] for p in parts if p in local}

        view._ask = ask  # type: ignore[method-assign]
        view.local_seqnos = read

    def answer(self, i: int, seqno: int) -> None:
        _, parts, fut = self.sent[i]
        fut.set_result(HighSeqnosReply(entries={p: (seqno, 7) for p in parts}))


async def setup() -> tuple[ClusterView, Asks, Entries, dict[str, list[int]]]:
    local: Entries = {0: (10, 7), 2: (10, 7)}
    view = _view(owner, local)
    asks = Asks(view, local)
    return view, asks, local, await view.data_owners(KS)


async def test_a_lone_scans_round_is_sent_at_once_and_reads_here_meanwhile() -> None:
    view, asks, _, owners = await setup()
    tasks = asyncio.all_tasks()
    got = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    # Sent in this call, before the local read, and no task was made for it.
    assert asks.events == ["ask n2", "local"] and asks.sent[0][1] == [1, 3]
    assert asyncio.all_tasks() == tasks and not got.done()
    asks.answer(0, 20)
    assert await got == {0: (10, 7), 2: (10, 7), 1: (20, 7), 3: (20, 7)}
    await view.pool.close()


async def test_scans_asking_while_a_round_is_out_share_the_next_one_after_it() -> None:
    view, asks, local, owners = await setup()
    first = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    b = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    local[0] = (11, 7)  # a write acknowledged after the first round read, before c arrived
    c = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(asks.sent) == 1  # b and c wait for the round ahead
    asks.answer(0, 20)
    assert (await first)[0] == (10, 7)
    await _until(lambda: len(asks.sent) == 2)
    # One round for both, started after both asked: it sees what c must see.
    asks.answer(1, 21)
    assert await b == await c == {0: (11, 7), 2: (10, 7), 1: (21, 7), 3: (21, 7)}
    # With nothing out, a round starts at once again.
    d = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    assert len(asks.sent) == 3
    asks.answer(2, 22)
    assert (await d)[1] == (22, 7)
    await view.pool.close()


async def test_other_skipped_nodes_make_another_round() -> None:
    view, asks, _, owners = await setup()
    view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    other = view.shared_partial_high_seqnos(KS, skip=["n9"], owners=owners)
    assert len(asks.sent) == 2  # not chained behind the first: another key
    asks.answer(1, 30)
    assert (await other)[3] == (30, 7)
    asks.answer(0, 30)
    await view.pool.close()


async def test_a_scan_giving_up_leaves_the_shared_round_to_the_others() -> None:
    view, asks, _, owners = await setup()
    first = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    a = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    b = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    a.cancel()
    first.cancel()  # the lone scan gives up too: the next round may start
    await _until(lambda: len(asks.sent) == 2)
    asks.answer(1, 40)
    assert (await b)[1] == (40, 7)
    await view.pool.close()


async def test_a_round_waits_for_a_hung_round_ahead_only_a_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_view, "CHAIN_WAIT", 0.05)
    view, asks, _, owners = await setup()
    hung = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    later = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    await _until(lambda: len(asks.sent) == 2)  # after CHAIN_WAIT, round 0 still unanswered
    asks.answer(1, 50)
    assert (await later)[1] == (50, 7)
    assert not hung.done()
    asks.answer(0, 1)  # late: the round ahead ends; nothing starts twice
    assert (await hung)[1] == (1, 7)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(asks.sent) == 2
    await view.pool.close()


async def test_a_failed_request_leaves_its_partitions_to_be_asked_again() -> None:
    view, asks, _, owners = await setup()
    got = view.shared_partial_high_seqnos(KS, skip=(), owners=owners)
    asks.sent[0][2].set_exception(NodeUnavailable("n2 is down"))
    assert await got == {0: (10, 7), 2: (10, 7)}  # high_seqnos(known=...) completes it
    await view.pool.close()


async def test_an_unreachable_owner_fails_only_its_own_request() -> None:
    local: Entries = {0: (10, 7), 2: (10, 7)}
    view = _view(owner, local)  # n2 is not a member: its address cannot be found
    owners = await view.data_owners(KS)
    assert await view.shared_partial_high_seqnos(KS, skip=(), owners=owners) == local
    await view.pool.close()


def _snap(s: int) -> Timestamp:
    return Timestamp({0: (s, 7), 1: (s, 9), 2: (s, 5)})


@pytest.mark.parametrize("with_snapshot", [True, False])
def test_the_coverage_check_is_the_timestamp_rule_with_or_without_the_snapshot(
    with_snapshot: bool,
) -> None:
    ts = _snap(3)
    snap = ts if with_snapshot else None
    shuffled = {2: (3, 5), 0: (3, 7), 1: (3, 9)}  # as the answers arrive: any order
    assert covers_seqnos(ts.packed(), shuffled, snap)  # caught up
    assert covers_seqnos(ts.packed(), _snap(2).to_wire(), snap)  # ahead: the full rule
    assert covers_seqnos(ts.packed(), {**shuffled, 3: (0, 1)}, snap)  # nothing seen there
    assert not covers_seqnos(ts.packed(), _snap(4).to_wire(), snap)  # behind
    assert not covers_seqnos(ts.packed(), {**shuffled, 1: (3, 8)}, snap)  # another branch
    assert not covers_seqnos(ts.packed(), {**shuffled, 3: (1, 1)}, snap)  # unseen write
    assert not covers_seqnos(None, shuffled, snap)  # the tips: no TS to cover anything


def test_a_snapshot_other_than_the_ts_read_is_not_trusted() -> None:
    # The slices were read at 2 (e.g. pinned after the local read at 4): the check must be
    # of what was read, not of the newer snapshot this node happened to see.
    assert not covers_seqnos(_snap(2).packed(), _snap(3).to_wire(), _snap(4))
    assert covers_seqnos(_snap(4).packed(), _snap(3).to_wire(), _snap(2))


async def test_gathered_seqnos_are_completed_without_changing_a_shared_answer() -> None:
    view, asks, _, _ = await setup()
    shared: Entries = {1: (20, 7), 3: (20, 7)}  # a round's answer: n1's partitions missing
    got = await view.high_seqnos_wire(KS, known=shared)
    assert got == {0: (10, 7), 1: (20, 7), 2: (10, 7), 3: (20, 7)}
    assert shared == {1: (20, 7), 3: (20, 7)}  # another scan may hold it
    complete = dict(got)
    assert await view.high_seqnos_wire(KS, known=complete) is complete  # nothing to ask
    assert asks.sent == []
    await view.pool.close()

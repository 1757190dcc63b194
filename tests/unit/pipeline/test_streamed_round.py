"""``StreamedRound`` (``pipeline/rounds/streamed.py``): the batch's groups are sent one behind
(the newest held back for the round's last message), filtered as the batch filters its whole
list (rows already applied left out), routed by the batch's views; what was sent is a prefix
of the batch's filtered rows, so ``rest`` is exactly what the round still sends; ``begin``
runs once, before the first send, and never for a batch that sent nothing."""

from __future__ import annotations

from typing import Any

from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import BROADCAST, ERROR, UPSERT
from shardex.pipeline.project.router import IndexRoute
from shardex.pipeline.rounds.between import not_applied
from shardex.pipeline.rounds.streamed import StreamedRound

UUID = 7
ROUTES = {"a": IndexRoute("a", 2, ("n1", "n2"), moving=False)}


class _Sender:
    def __init__(self) -> None:
        self.sent: list[dict[str, list[Any]]] = []

    def send(self, by_node: dict[str, list[Any]]) -> None:
        self.sent.append(by_node)


def _row(part: int, seqno: int, ip: int = 0, kind: str = UPSERT) -> tuple[Any, ...]:
    return ("a", ip, kind, b"k%d" % seqno, f"d{part}-{seqno}", part, seqno)


def _stream(applied: dict[int, int]) -> tuple[StreamedRound, _Sender, list[str]]:
    sender = _Sender()
    calls: list[str] = []
    ts = Timestamp({p: (s, UUID) for p, s in applied.items()})
    stream = StreamedRound(
        sender,  # type: ignore[arg-type]
        ROUTES,
        {"a": ts},
        lambda: calls.append("begin"),
        dropped=False,
    )
    return stream, sender, calls


def test_groups_go_one_behind_and_rest_is_what_the_round_still_sends() -> None:
    stream, sender, calls = _stream({0: 2})
    g1 = [_row(0, 1), _row(0, 2), _row(0, 3, ip=1)]  # seqnos 1-2 of partition 0 applied
    g2 = [_row(1, 1), _row(1, 2, kind=ERROR, ip=BROADCAST), _row(0, 4)]
    g3 = [_row(1, 3, ip=1)]
    stream.offer(g1)
    assert sender.sent == [] and calls == [] and not stream.started  # held back
    stream.offer(g2)
    assert calls == ["begin"] and stream.started
    assert sender.sent == [{"n2": [_row(0, 3, ip=1)]}]  # applied rows left out
    stream.offer(g3)
    assert calls == ["begin"]  # once
    # The error row is counted as handled but goes nowhere.
    assert sender.sent[1] == {"n1": [_row(1, 1), _row(0, 4)]}
    rows = not_applied(g1 + g2 + g3, stream.applied)
    assert stream.rest(rows) == [_row(1, 3, ip=1)]  # the held group, for the round
    assert stream.key_versions == 3 and stream.groups == 2


def test_a_batch_of_one_group_sends_nothing_early() -> None:
    stream, sender, calls = _stream({})
    stream.offer([_row(0, 1), _row(1, 1)])
    assert sender.sent == [] and calls == [] and not stream.started
    assert stream.rest([_row(0, 1), _row(1, 1)]) == [_row(0, 1), _row(1, 1)]


def test_groups_with_nothing_to_send_do_not_begin_the_round() -> None:
    stream, sender, calls = _stream({0: 5})
    stream.offer([_row(0, 1), _row(0, 2)])  # applied already
    stream.offer([_row(0, 6)])
    assert sender.sent == [] and calls == [] and not stream.started
    assert stream.rest(not_applied([_row(0, 1), _row(0, 2), _row(0, 6)], stream.applied)) == [
        _row(0, 6)
    ]

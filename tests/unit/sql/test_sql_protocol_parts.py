"""The SQL protocol's parts on their own: plan validation, batch encoding and splitting,
the inbox's stream checks and grants, the outbox's stop-and-resume on credits."""

from __future__ import annotations

import asyncio

import msgspec
import pyarrow as pa
import pytest

from shardex.errors import ConfigError, ErrorCode, ShardexError
from shardex.net.messages import Envelope, Kind, decode_frame, encode_frame
from shardex.sql.protocol import (
    MIN_WINDOW,
    ExchangeMeter,
    FragmentSpec,
    ProtocolConfig,
    QueryBatch,
    QueryExecute,
    QueryId,
    QueryPlan,
)
from shardex.sql.protocol.batches import decode_batch, encode_batch, split_to_fit
from shardex.sql.protocol.flow import Inbox, Outbox
from shardex.sql.protocol.plan_layout import layout_plan

Q = QueryId("m1", "1-abc")


def frag(
    fid: int, members: list[str], inputs=(), output=None, kind="k", exchange="gather"
) -> FragmentSpec:  # type: ignore[no-untyped-def]
    return FragmentSpec(
        fragment_id=fid,
        kind=kind,
        members=members,
        inputs=list(inputs),
        output=output,
        exchange=exchange,
    )


def rows(n: int, pad: int = 0) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array(range(n), pa.int64()), "p": ["x" * pad] * n})


# --- plans -------------------------------------------------------------------------------


def test_a_good_plan_lays_out_its_edges() -> None:
    plan = QueryPlan(
        fragments=[
            frag(0, ["m1"], inputs=[1]),
            frag(1, ["m2"], inputs=[2], output=1),
            frag(2, ["m3", "m1"], output=2),
        ]
    )
    layout = layout_plan(plan, "m1")
    assert layout.participants == ("m1", "m2", "m3")
    assert layout.edges[2].senders == ("m3", "m1") and layout.edges[2].receiver == "m2"
    assert layout.root.fragment_id == 0


def test_broadcast_and_hash_edges_reach_every_member_of_their_reader() -> None:
    plan = QueryPlan(
        fragments=[
            frag(0, ["m1"], inputs=[1]),
            frag(1, ["m2", "m3"], inputs=[2, 3], output=1),
            frag(2, ["m2", "m3"], output=2, exchange="hash"),
            frag(3, ["m3"], output=3, exchange="broadcast"),
        ]
    )
    layout = layout_plan(plan, "m1")
    assert layout.edges[2].receivers == ("m2", "m3") and layout.edges[2].exchange == "hash"
    assert layout.edges[3].senders == ("m3",) and layout.edges[3].exchange == "broadcast"
    assert layout.edges[1].receivers == ("m1",)


BAD_PLANS = {
    "unknown exchange": [frag(0, ["m1"], inputs=[1]), frag(1, ["m2"], output=1, exchange="x")],
    "no fragments": [],
    "two roots": [frag(0, ["m1"]), frag(1, ["m1"])],
    "root elsewhere": [frag(0, ["m2"], inputs=[1]), frag(1, ["m3"], output=1)],
    "duplicate id": [frag(0, ["m1"], inputs=[1]), frag(0, ["m2"], output=1)],
    "reader on two members": [
        frag(0, ["m1"], inputs=[1]),
        frag(1, ["m2", "m3"], inputs=[2], output=1),
        frag(2, ["m3"], output=2),
    ],
    "dangling edge": [frag(0, ["m1"], inputs=[1, 5]), frag(1, ["m2"], output=1)],
    "two writers": [
        frag(0, ["m1"], inputs=[1]),
        frag(1, ["m2"], output=1),
        frag(2, ["m3"], output=1),
    ],
    "cycle": [
        frag(0, ["m1"]),
        frag(1, ["m2"], inputs=[2], output=3),
        frag(2, ["m3"], inputs=[3], output=2),
    ],
    "member twice": [frag(0, ["m1"], inputs=[1]), frag(1, ["m2", "m2"], output=1)],
}


@pytest.mark.parametrize("name", sorted(BAD_PLANS))
def test_bad_plans_are_refused_with_a_hint(name: str) -> None:
    with pytest.raises(ShardexError) as err:
        layout_plan(QueryPlan(fragments=BAD_PLANS[name]), "m1")
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "value" in err.value.details and err.value.details["hint"]


def test_messages_round_trip_on_the_wire() -> None:
    plan = QueryPlan(fragments=[frag(0, ["m1"], inputs=[1]), frag(1, ["m2"], output=1)])
    execute = QueryExecute(
        query_id=Q,
        participants=["m1", "m2"],
        plan=plan,
        timeout=5.0,
        window=8192,
        parameters={"x": 1},
    )
    batch = QueryBatch(query_id=Q, edge_id=1, sender="m2", seq=0, data=encode_batch(rows(3)))
    for msg in (execute, batch):
        env = decode_frame(encode_frame(Envelope(Kind.ONEWAY, 0, msg)))
        assert env.body == msg
    assert {Q: 1}[msgspec.msgpack.decode(msgspec.msgpack.encode(Q), type=QueryId)] == 1


def test_a_window_below_the_minimum_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        ProtocolConfig(window=100)
    assert err.value.details["value"] == 100
    with pytest.raises(ConfigError):
        ProtocolConfig(check_interval=0)


# --- batches -----------------------------------------------------------------------------


def test_split_to_fit_keeps_rows_in_order_within_the_limit() -> None:
    batch = rows(500, pad=20)
    pieces = split_to_fit(batch, 2048)
    assert len(pieces) > 1 and all(len(p) <= 2048 for p in pieces)
    back = pa.Table.from_batches([decode_batch(p) for p in pieces])
    assert back.column("i").to_pylist() == list(range(500))


def test_a_row_larger_than_the_limit_is_refused() -> None:
    with pytest.raises(ShardexError) as err:
        split_to_fit(rows(1, pad=5000), 2048)
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.details["window"] == 2048


def test_garbage_is_not_a_batch() -> None:
    with pytest.raises(ShardexError) as err:
        decode_batch(b"not arrow")
    assert err.value.code is ErrorCode.PROTOCOL_ERROR


# --- inbox and outbox --------------------------------------------------------------------


def make_inbox(grants: list[tuple[str, int]], window: int = MIN_WINDOW) -> Inbox:
    return Inbox(
        query_id=Q,
        edge_id=1,
        receiver="m1",
        senders=("m2", "m3"),
        window=window,
        grant=lambda s, limit: grants.append((s, limit)),
        meter=ExchangeMeter(),
    )


def batch_msg(seq: int, data: bytes, sender: str = "m2", last: bool = False) -> QueryBatch:
    return QueryBatch(query_id=Q, edge_id=1, sender=sender, seq=seq, data=data, last=last)


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("unknown sender", "not a sender"),
        ("gap", "was expected"),
        ("after last", "after the stream's last"),
        ("over credits", "exceeded its credits"),
    ],
)
def test_the_inbox_refuses_what_a_stream_cannot_carry(case: str, expect: str) -> None:
    inbox = make_inbox([])
    data = encode_batch(rows(10))
    with pytest.raises(ShardexError) as err:
        if case == "unknown sender":
            inbox.on_batch(batch_msg(0, data, sender="m9"))
        elif case == "gap":
            inbox.on_batch(batch_msg(0, data))
            inbox.on_batch(batch_msg(2, data))
        elif case == "after last":
            inbox.on_batch(batch_msg(0, b"", last=True))
            inbox.on_batch(batch_msg(1, data))
        else:
            for seq in range(MIN_WINDOW // len(data) + 1):
                inbox.on_batch(batch_msg(seq, data))
    assert err.value.code is ErrorCode.PROTOCOL_ERROR and expect in err.value.message


async def test_the_inbox_grants_as_its_consumer_drains() -> None:
    grants: list[tuple[str, int]] = []
    inbox = make_inbox(grants)
    data = encode_batch(rows(20))
    n = (MIN_WINDOW // 2) // len(data) + 1  # just over half a window
    for seq in range(n):
        inbox.on_batch(batch_msg(seq, data))
    assert grants == []  # nothing consumed, nothing granted
    it = inbox.batches()
    for _ in range(n - 1):
        await anext(it)
    assert grants == []  # less than half a window consumed
    await anext(it)
    assert grants == [("m2", n * len(data) + MIN_WINDOW)]  # consumed + window, cumulative
    inbox.on_batch(batch_msg(n, b"", last=True))
    inbox.on_batch(batch_msg(0, b"", sender="m3", last=True))
    assert [b async for b in it] == [] and inbox.complete
    assert len(grants) == 1  # nothing is granted to a finished stream


async def test_the_outbox_stops_at_zero_credits_and_resumes_on_flow_control() -> None:
    sent: list[QueryBatch] = []

    async def send(member: str, msg) -> None:  # type: ignore[no-untyped-def]
        sent.append(msg)

    meter = ExchangeMeter()
    outbox = Outbox(
        query_id=Q,
        edge_id=1,
        sender="m2",
        receiver="m1",
        window=MIN_WINDOW,
        send=send,
        meter=meter,
    )
    batch = rows(40, pad=10)
    task = asyncio.create_task(outbox.put(pa.concat_batches([batch] * 10)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()  # blocked: the window is spent
    assert outbox.sent_bytes <= MIN_WINDOW < outbox.sent_bytes + MIN_WINDOW
    stalled_at = len(sent)
    outbox.on_flow_control(outbox.sent_bytes + MIN_WINDOW)
    outbox.on_flow_control(10)  # an old, lower limit changes nothing
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(sent) > stalled_at
    while not task.done():
        outbox.on_flow_control(outbox.sent_bytes + MIN_WINDOW)
        await asyncio.sleep(0)
    await outbox.finish()
    assert sent[-1].last and [m.seq for m in sent] == list(range(len(sent)))
    (st,) = meter.streams.values()
    assert st.stalls > 0 and st.max_sender_bound <= MIN_WINDOW


async def test_the_membership_directory_reads_the_member_list_and_the_detector() -> None:
    from shardex.manager.membership import Membership
    from shardex.meta.member_list import MemberInfo
    from shardex.net import TcpTransport
    from shardex.sql.protocol import MembershipDirectory

    m = Membership(
        transport=TcpTransport(),
        secret="directory-test-secret",
        member_id="id-1",
        name="n1",
        address="127.0.0.1:7001",
        services=("manager", "query"),
    )
    other = MemberInfo(member_id="id-2", name="n2", address="127.0.0.1:7002", services=("query",))
    m._merge([other], "test")  # as a join would
    directory = MembershipDirectory(lambda: m)
    assert directory.address_of("id-2") == "127.0.0.1:7002"
    assert directory.address_of("id-9") is None
    assert not directory.is_down("id-1")  # itself
    assert directory.is_down("id-2")  # a manager never heard from it: down on the evidence
    m._heard("id-2")
    assert not directory.is_down("id-2")
    assert MembershipDirectory(lambda: None).address_of("id-2") is None

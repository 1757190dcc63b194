"""Members running ``QueryService`` on the simulator, small fragments, plans and controls.

Every member is a host of a ``SimCluster`` with an ``RpcServer`` and a ``QueryService`` that
share one ``ExchangeMeter`` (so bytes in flight are measured exactly, sender to consumer)
and one ``SimDirectory`` (the membership stand-in: the test says when the failure detector
marks a member down). ``Interceptor`` holds or drops chosen messages before they leave a
member, which is how the scenarios force the specification's message orders.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sql_protocol_checkers import check_flow_control, check_state_freed

from shardex.errors import ErrorCode, ShardexError
from shardex.net.messages import Message
from shardex.net.rpc import RpcServer
from shardex.sim import ClusterNode, Simulation, run_simulation
from shardex.sql.protocol import (
    ExchangeMeter,
    FragmentContext,
    FragmentRegistry,
    FragmentSpec,
    ProtocolConfig,
    QueryPlan,
    QueryResult,
    QueryService,
)

SECRET = "sql-protocol-sim-secret"

# Short intervals: virtual time is free, and cleanup paths should run within a scenario.
SIM_CONFIG = ProtocolConfig(
    window=8192,
    timeout=30.0,
    check_interval=0.5,
    check_timeout=1.0,
    tombstone_ttl=3.0,
    result_capacity=2,
    connect_timeout=1.0,
)


class SimDirectory:
    """Addresses of the members and the failure detector's verdicts, set by the test:
    ``down`` as every member sees it, ``suspected`` (observer, member) as one member alone
    sees it (a wrong suspicion: the member is up)."""

    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}
        self.down: dict[str, bool] = {}
        self.suspected: set[tuple[str, str]] = set()

    def address_of(self, member_id: str) -> str | None:
        return self.addresses.get(member_id)

    def is_down(self, member_id: str) -> bool:
        return self.down.get(member_id, False)

    def seen_by(self, observer: str) -> ObserverDirectory:
        return ObserverDirectory(self, observer)


@dataclass
class ObserverDirectory:
    """One member's view of ``SimDirectory``: its own suspicions on top of the common one."""

    directory: SimDirectory
    observer: str

    def address_of(self, member_id: str) -> str | None:
        return self.directory.address_of(member_id)

    def is_down(self, member_id: str) -> bool:
        suspected = (self.observer, member_id) in self.directory.suspected
        return suspected or self.directory.is_down(member_id)


@dataclass
class _Rule:
    match: Callable[[str, str, Message], bool]
    drop: bool
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hits: int = 0


class Interceptor:
    """Rules on (source, destination, message): hold a message until released, or drop it."""

    def __init__(self) -> None:
        self.rules: list[_Rule] = []

    def hold(self, match: Callable[[str, str, Message], bool]) -> _Rule:
        rule = _Rule(match, drop=False)
        self.rules.append(rule)
        return rule

    def drop(self, match: Callable[[str, str, Message], bool]) -> _Rule:
        rule = _Rule(match, drop=True)
        self.rules.append(rule)
        return rule

    def hook(self, src: str) -> Callable[[str, Message], Any]:
        async def before_send(dst: str, msg: Message) -> bool:
            for rule in self.rules:
                if rule.match(src, dst, msg):
                    rule.hits += 1
                    if rule.drop:
                        return False
                    await rule.release.wait()
            return True

        return before_send


def message(kind: type[Message], src: str | None = None, dst: str | None = None) -> Any:
    """A rule matcher: messages of ``kind`` from ``src`` to ``dst`` (None = any)."""

    def match(s: str, d: str, msg: Message) -> bool:
        return isinstance(msg, kind) and src in (None, s) and dst in (None, d)

    return match


# --- fragments -----------------------------------------------------------------------------


def emitted_rows(member: str, instance: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    n, pad = args["rows"], args.get("pad", 0)
    return [{"src": member, "i": instance * n + j, "pad": "x" * pad} for j in range(n)]


def build_fragments(gates: dict[str, asyncio.Event]) -> FragmentRegistry:
    """Test fragments. ``emit``: ``rows`` rows per instance in batches of ``batch_rows``; it
    may wait for a gate first, fail (or end cancelled) on some members after some batches,
    or hang."""

    async def emit(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        args, me = ctx.args, ctx.member_id
        if "gate" in args:
            await gates.setdefault(args["gate"], asyncio.Event()).wait()
        if me in args.get("hang_on", []):
            await asyncio.Event().wait()
        n, pad, step = args["rows"], "x" * args.get("pad", 0), args.get("batch_rows", 50)
        base = ctx.instance * n  # the same rows as emitted_rows, built column-wise (cheaper)
        for k, start in enumerate(range(0, n, step)):
            if me in args.get("fail_on", []) and k == args.get("fail_after", 0):
                raise ShardexError(f"emit failed on {me}", code=ErrorCode.EXPRESSION_EVAL)
            if me in args.get("cancel_on", []) and k == args.get("fail_after", 0):
                raise asyncio.CancelledError  # a stray cancel from something it awaited
            count = min(step, n - start)
            batch = pa.record_batch(
                {
                    "src": pa.array([me] * count, pa.string()),
                    "i": pa.array(range(base + start, base + start + count), pa.int64()),
                    "pad": pa.array([pad] * count, pa.string()),
                }
            )
            if ctx.fragment.exchange != "hash":
                yield batch
                continue
            # A hash exchange: row i goes to the reader member at position i % partitions,
            # or i % ``parts`` (fewer: the other readers get no row, only the stream's end).
            mod = args.get("parts") or ctx.partitions
            parts = pa.array([i % mod for i in batch.column("i").to_pylist()])
            for p in range(ctx.partitions):
                yield p, batch.filter(pc.equal(parts, p))

    async def collect(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        delay = ctx.args.get("delay", 0.0)
        async for batch in ctx.input():
            if delay:
                await asyncio.sleep(delay)  # a slow consumer (virtual time): backpressure
            yield batch

    async def keep_multiples(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        mod = ctx.args["mod"]
        async for batch in ctx.input():
            keep = [i % mod == 0 for i in batch.column("i").to_pylist()]
            yield batch.filter(pa.array(keep))

    async def total(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        count = acc = 0
        async for batch in ctx.input():
            count += batch.num_rows
            acc += sum(batch.column("i").to_pylist())
        yield pa.RecordBatch.from_pylist([{"count": count, "total": acc}])

    async def tag(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        """Its input with the member that read each row (``at``)."""
        async for batch in ctx.input():
            yield batch.append_column("at", pa.array([ctx.member_id] * batch.num_rows))

    async def semi_join(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        """Two inputs: every ``i`` of the ``build`` edge, held, then the ``probe`` edge's
        rows whose ``i`` is among them, tagged with the member that joined them. ``limit``:
        stop after that many rows, the probe edge left unread (a LIMIT's top without ORDER
        BY); ``sorted``: every row read, then the first ``limit`` by ``i`` (a sort's top)."""
        a = ctx.args
        limit, in_order = a.get("limit"), a.get("sorted", False)
        build: set[int] = set()
        async for batch in ctx.inputs[a["build"]]:
            build.update(batch.column("i").to_pylist())
        found: list[pa.RecordBatch] = []
        sent = 0
        async for batch in ctx.inputs[a["probe"]]:
            keep = pa.array([i in build for i in batch.column("i").to_pylist()])
            out = batch.filter(keep)
            out = out.append_column("at", pa.array([ctx.member_id] * out.num_rows, pa.string()))
            if in_order:
                found.append(out)
                continue
            if limit is not None:
                out = out.slice(0, limit - sent)
            sent += out.num_rows
            yield out
            if limit is not None and sent >= limit:
                return
        if in_order and found:
            table = pa.Table.from_batches(found).sort_by("i").slice(0, limit)
            for out in table.to_batches(max_chunksize=a.get("out_rows", 50)):
                yield out

    async def runs(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        """Its one input edge read sender by sender (``by_sender``), all senders at once,
        a batch from each in turn: each row tagged with the run it came in (``run``)."""
        assert ctx.by_sender is not None
        (edge,) = ctx.inputs
        its = list(enumerate(ctx.by_sender(edge)))
        while its:
            for run, it in list(its):
                batch = await anext(it, None)
                if batch is None:
                    its.remove((run, it))
                else:
                    yield batch.append_column("run", pa.array([run] * batch.num_rows))

    async def merge(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        """Sorted runs, one per sender of its one edge (``by_sender``), merged by ``i``, at
        most ``limit`` rows (an ORDER BY ... LIMIT's root): the first batch of every run is
        read in turn before any row leaves."""
        assert ctx.by_sender is not None
        (edge,) = ctx.inputs
        runs = ctx.by_sender(edge)
        limit, delay = ctx.args.get("limit"), ctx.args.get("delay", 0.0)
        heads: list[list[dict[str, Any]]] = []
        for it in runs:
            batch = await anext(it, None)
            heads.append([] if batch is None else batch.to_pylist())
        sent = 0
        while limit is None or sent < limit:
            live = [k for k, rows in enumerate(heads) if rows]
            if not live:
                return
            k = min(live, key=lambda k: heads[k][0]["i"])
            row = heads[k].pop(0)
            if not heads[k]:
                batch = await anext(runs[k], None)
                heads[k] = [] if batch is None else batch.to_pylist()
            sent += 1
            if delay:
                await asyncio.sleep(delay)
            yield pa.RecordBatch.from_pylist([row])

    async def take(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        left, delay = ctx.args["limit"], ctx.args.get("delay", 0.0)
        async for batch in ctx.input():
            if delay:
                await asyncio.sleep(delay)
            yield batch.slice(0, left)
            left -= min(left, batch.num_rows)
            if left == 0:
                return

    return FragmentRegistry(
        {
            "emit": emit,
            "collect": collect,
            "keep_multiples": keep_multiples,
            "sum": total,
            "take": take,
            "tag": tag,
            "semi_join": semi_join,
            "runs": runs,
            "merge": merge,
        }
    )


# --- plans ---------------------------------------------------------------------------------


def gather_plan(
    root: str, leaves: list[str], *, root_kind: str = "collect", root_args: Any = None, **emit: Any
) -> QueryPlan:
    """Two fragments: ``emit`` on every leaf -> edge 1 -> ``root_kind`` on the initiator."""
    return QueryPlan(
        fragments=[
            FragmentSpec(
                fragment_id=0, kind=root_kind, members=[root], inputs=[1], args=root_args or {}
            ),
            FragmentSpec(fragment_id=1, kind="emit", members=leaves, output=1, args=emit),
        ]
    )


def chain_plan(root: str, middle: str, leaves: list[str], *, mod: int, **emit: Any) -> QueryPlan:
    """Three fragments: ``emit`` on the leaves -> ``keep_multiples`` on ``middle`` -> root."""
    return QueryPlan(
        fragments=[
            FragmentSpec(fragment_id=0, kind="collect", members=[root], inputs=[1]),
            FragmentSpec(
                fragment_id=1,
                kind="keep_multiples",
                members=[middle],
                inputs=[2],
                output=1,
                args={"mod": mod},
            ),
            FragmentSpec(fragment_id=2, kind="emit", members=leaves, output=2, args=emit),
        ]
    )


def partition_plan(root: str, readers: list[str], leaves: list[str], **emit: Any) -> QueryPlan:
    """``emit`` on the leaves -> hash exchange (row i to reader i % len(readers)) -> ``tag``
    on every reader -> gather -> ``collect`` on the initiator."""
    return QueryPlan(
        fragments=[
            FragmentSpec(fragment_id=0, kind="collect", members=[root], inputs=[1]),
            FragmentSpec(fragment_id=1, kind="tag", members=readers, inputs=[2], output=1),
            FragmentSpec(
                fragment_id=2, kind="emit", members=leaves, output=2, exchange="hash", args=emit
            ),
        ]
    )


def join_plan(
    root: str,
    joiners: list[str],
    build: list[str],
    probe: list[str],
    *,
    build_rows: int,
    build_exchange: str = "broadcast",
    root_kind: str = "collect",
    root_args: dict[str, Any] | None = None,
    join_args: dict[str, Any] | None = None,
    **emit: Any,
) -> QueryPlan:
    """A fragment with two inputs on several members: ``emit`` on ``build`` broadcast (or
    ``build_exchange="hash"``: partitioned as the probe side is) to every joiner (edge 3),
    ``emit`` on ``probe`` hash-partitioned among them (edge 2), ``semi_join`` on the joiners
    (``join_args``) -> gather -> ``root_kind`` on the initiator."""
    return QueryPlan(
        fragments=[
            FragmentSpec(
                fragment_id=0,
                kind=root_kind,
                members=[root],
                inputs=[1],
                args=root_args or {},
            ),
            FragmentSpec(
                fragment_id=1,
                kind="semi_join",
                members=joiners,
                inputs=[2, 3],
                output=1,
                args={"build": 3, "probe": 2, **(join_args or {})},
            ),
            FragmentSpec(
                fragment_id=2, kind="emit", members=probe, output=2, exchange="hash", args=emit
            ),
            FragmentSpec(
                fragment_id=3,
                kind="emit",
                members=build,
                output=3,
                exchange=build_exchange,
                args={**emit, "rows": build_rows},
            ),
        ]
    )


def expected_gather(leaves: list[str], **emit: Any) -> list[dict[str, Any]]:
    return [row for k, m in enumerate(leaves) for row in emitted_rows(m, k, emit)]


# --- the harness ---------------------------------------------------------------------------


class Harness:
    """Members of one simulation run and handles on their live services."""

    def __init__(self, sim: Simulation, config: ProtocolConfig = SIM_CONFIG) -> None:
        self.sim = sim
        self.config = config
        self.directory = SimDirectory()
        self.meter = ExchangeMeter()
        self.interceptor = Interceptor()
        self.gates: dict[str, asyncio.Event] = {}
        self.fragments = build_fragments(self.gates)
        self.services: dict[str, QueryService] = {}  # live members only
        self.every_service: list[QueryService] = []  # every incarnation (message counts)

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def _main(self, host: str) -> Callable[[ClusterNode], Any]:
        async def main(node: ClusterNode) -> None:
            svc = QueryService(
                member_id=host,
                transport=node.transport,
                secret=SECRET,
                directory=self.directory.seen_by(host),
                fragments=self.fragments,
                config=self.config,
                meter=self.meter,
                before_send=self.interceptor.hook(host),
            )
            server = RpcServer(node.transport, SECRET, name=host)
            svc.install(server)
            address = await server.start(node.listen_address)
            self.directory.addresses[host] = address
            await svc.start()
            self.services[host] = svc
            self.every_service.append(svc)
            node.serving(address)
            try:
                await asyncio.Event().wait()
            finally:
                await svc.stop()
                await server.stop()

        return main

    async def start(self, *hosts: str) -> None:
        for host in hosts:
            self.sim.cluster.add(host, self._main(host))
        await self.sim.cluster.start(*hosts)
        for host in hosts:
            await self.sim.cluster[host].wait_serving()

    async def crash(self, host: str, *, power_off: bool = False) -> None:
        self.services.pop(host, None)
        await self.sim.cluster.crash(host, power_off=power_off)

    async def restart(self, host: str) -> None:
        await self.sim.cluster.restart(host)
        await self.sim.cluster[host].wait_serving()
        self.directory.down[host] = False

    async def until(self, pred: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait (virtual time, 1 ms steps) for ``pred``; fail the scenario after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not pred():
            if loop.time() > deadline:
                raise AssertionError(f"condition not reached within {timeout}s of virtual time")
            await asyncio.sleep(0.001)

    async def settle(self) -> None:
        """Let cleanup run its course: past the check interval and the tombstone TTL."""
        await asyncio.sleep(self.config.tombstone_ttl + 2 * self.config.check_interval + 1.0)

    async def finish(self) -> None:
        """The checks every scenario ends with: flow control held, all state freed."""
        check_flow_control(self.meter)
        await self.settle()
        check_state_freed(self.services, tombstones=True)
        await self.sim.cluster.stop_all()
        self.sim.cluster.check()


def run_scenario(scenario: Callable[[Harness], Any], seed: int) -> None:
    """One scenario on a fresh simulation of seed ``seed``, ended by ``Harness.finish``."""

    async def main(sim: Simulation) -> None:
        h = Harness(sim)
        await scenario(h)
        await h.finish()

    run_simulation(main, seed)


async def drain_disturbed(
    result: QueryResult, disturb: Callable[[], Any]
) -> tuple[list[dict[str, Any]], ShardexError | None]:
    """The rows of ``result`` read while ``disturb()`` runs beside them, and the query's
    error (None: it ended well); returns once both are done."""
    disturbance = asyncio.get_running_loop().create_task(disturb())
    rows: list[dict[str, Any]] = []
    error: ShardexError | None = None
    try:
        async for row in result.rows():
            rows.append(row)
    except ShardexError as e:
        error = e
    await disturbance
    return rows, error


def each_seed(run: Callable[[int], dict[str, Any]], seeds: list[int]) -> Iterator[dict[str, Any]]:
    """``run(seed)``'s outcome for each seed; a failure names its seed (to replay it)."""
    for seed in seeds:
        try:
            out = run(seed)
        except BaseException as e:
            e.add_note(f"SHARDEX_SIM_SEED={seed}")
            raise
        yield out


async def drain(result: QueryResult) -> list[dict[str, Any]]:
    return await result.all_rows()


async def drain_error(result: QueryResult) -> ShardexError:
    """Iterate a result that must fail; return its error."""
    try:
        rows = await result.all_rows()
    except ShardexError as e:
        return e
    raise AssertionError(f"the query succeeded with {len(rows)} rows; it had to fail")

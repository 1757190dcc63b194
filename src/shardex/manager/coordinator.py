"""The replicated coordinator: one master among the manager nodes runs every metadata op.

Protocol (``index-ddl-flow.md``, made to survive its failure notes; the reasoning is in
``docs/decisions/0023-coordinator-majority-commit.md``; the engine is ``replication.py``,
voter rules
``replica.py``):

* **Voters** are the committed voter set of the state (``StateContext.voters``, changed one
  manager at a time by a majority commit: ``meta/voter_set.py``); a manager the member list
  knows but the set does not never counts. A node acts as
  master only while its membership view shows a *majority* of them up: for 3 managers that is
  the DDL flow's own assumption ("no automatic failover when more than one node is down"), made
  a rule, and it keeps the minority side of a partition from acting.
* **Master choice** is deterministic: the leader of the newest term this node knows of, if
  that node is up in its view, else the up manager with the smallest name. The chosen node
  runs a promotion; everyone else forwards ops to it.
* **Promotion** (DDL flow step 5): take a new term ``epoch`` above every term seen, get a promise
  from a majority (``StateGather``; a voter that promised a term refuses anything older from
  then on), take the gathered state with the highest ``(epoch, cas)``, commit it again under
  the new term (this re-synchronises every replica), run the recovery hooks, then serve ops.
* **Commit** (DDL flow steps 2-7): ``cas`` + 1, persist locally, replicate the whole state to ALL
  voters in parallel. A voter that does not answer is retried until it answers, membership
  reports it down, or ``commit_timeout`` passes. The commit succeeds when a majority
  (the master included) holds it; otherwise it fails with NODE_UNAVAILABLE
  (``reason="commit_failed"``, outcome unknown: a later master may still continue from it)
  and the master steps down and re-promotes before running anything else.
* **Catch-up**: the master pushes its state to every up voter whose acknowledged version is
  behind (a returning node, one that timed out): a node that rejoins with an older state, or
  with a change an old master never committed, ends up with the master's.
* **Ops** are serialized on the master (one lock), run in tasks of their own (a client that
  hangs up does not cancel a half-done op), and deduplicated by ``request_id``: the reply is
  stored in the state by the op's final commit and returned again for a repeated id.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import msgspec

from shardex.api.coordinator import (
    OpForward,
    StateGather,
    StateGatherReply,
    StateReplicate,
    StateReplicateReply,
    StateReply,
    StateRequest,
)
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.membership import Membership
from shardex.manager.replication import CoordinatorTiming, ReplicationGroup, majority, unavailable
from shardex.meta.state import (
    KeyspaceMeta,
    StateContext,
    StateStore,
    record_reply,
    select_sections,
    stored_reply,
)
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.messages import Envelope, Kind, Message, decode_frame, encode_frame
from shardex.net.transport import Transport

__all__ = [
    "ChangeCallback",
    "Coordinator",
    "CoordinatorTiming",
    "KeyspaceMeta",
    "Op",
    "OpContext",
    "RecoveryHook",
    "StateContext",
    "StateReply",
    "StateRequest",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Op = Callable[[Any, "OpContext"], Awaitable[Message]]
ChangeCallback = Callable[[StateContext], Awaitable[None] | None]
RecoveryHook = Callable[["OpContext"], Awaitable[None]]

# NODE_UNAVAILABLE reasons after which an op certainly did not run: always safe to retry.
_NOT_RUN = frozenset({"not_master", "no_master"})
# Failures after which an op may or may not have run: retried only under a request id.
_MAYBE_RUN = frozenset({"commit_failed", "deposed"})


class OpContext:
    """What an op sees while it runs on the master (also given to recovery hooks)."""

    def __init__(self, coordinator: Coordinator, request_id: str | None, epoch: int) -> None:
        self._c = coordinator
        self.request_id = request_id
        self.epoch = epoch
        self.committed = False
        self.reply_recorded = False

    @property
    def state(self) -> StateContext:
        """The current committed state (after this op's own commits)."""
        return self._c.state

    @property
    def pool(self) -> ConnectionPool:
        return self._c.pool

    @property
    def voter_names(self) -> list[str]:
        """The managers that count towards a majority, as this node's state has them
        (``StateContext.voters``; ``meta/voter_set.py``)."""
        return sorted(self._group.voter_set())

    @property
    def membership(self) -> Membership:
        return self._c.membership

    @property
    def node_name(self) -> str:
        return self._c.name

    def new_id(self) -> str:
        """A fresh unique id (uuid hex; seeded under the simulator)."""
        return self._c.new_id()

    async def commit(
        self, new_state: StateContext, *, reply: Message | None = None
    ) -> StateContext:
        """Commit ``new_state`` (derived from ``self.state``): ``cas`` + 1 (more after a
        failover), persisted here, replicated to all voters, held by a majority. Returns the
        committed state. Pass the op's ``reply`` with its last commit so that a retried
        request id returns it, atomically with the effect. Raises CAS_MISMATCH if
        ``new_state`` was not built on the current state, NODE_UNAVAILABLE if the commit
        cannot be made (``details["reason"]``)."""
        if reply is not None and self.request_id is not None:
            new_state = record_reply(new_state, self.request_id, reply)
            self.reply_recorded = True
        current = self._c.state
        if new_state.cas != current.cas:
            raise ShardexError(
                f"state was built on cas {new_state.cas}, current is {current.cas}",
                code=ErrorCode.CAS_MISMATCH,
                details={"expected": current.cas, "got": new_state.cas},
            )
        state = await self._c._group.commit(new_state, self.epoch)
        self.committed = True
        return state


class Coordinator:
    """The coordinator of one manager node (master or replica; the role changes at runtime)."""

    def __init__(
        self,
        *,
        transport: Transport,
        secret: str,
        name: str,
        store: StateStore,
        timing: CoordinatorTiming | None = None,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.name = name
        self.timing = timing or CoordinatorTiming()
        self.pool = ConnectionPool(
            transport, secret, name=name, connect_timeout=self.timing.attempt_timeout
        )
        self._id_factory = id_factory or (lambda: uuid.uuid4().hex)
        self._ops: dict[type[Message], Op] = {}
        self._change_cbs: list[ChangeCallback] = []
        self._commit_cbs: list[ChangeCallback] = []
        self._recovery: list[RecoveryHook] = []
        self._server: RpcServer | None = None
        self._notices: asyncio.Queue[Awaitable[None]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: dict[asyncio.Task[Any], None] = {}  # ops and pushes, in creation order
        self._group = ReplicationGroup(
            name=name,
            store=store,
            pool=self.pool,
            timing=self.timing,
            applied=lambda s: self._notify(self._change_cbs, s),
            committed=lambda s: self._notify(self._commit_cbs, s),
            recover=self._run_recovery,
            spawn=self._spawn,
        )

    # -- registration (before or after start) --

    def register_op(self, msg_type: type[Message], op: Op) -> None:
        """Route ``msg_type`` on this node: run on the master, serialized, deduplicated."""
        if msg_type in self._ops:
            raise ValueError(f"an op is already registered for {msg_type.__name__}")
        self._ops[msg_type] = op
        if self._server is not None:
            self._server.route(msg_type, self._on_op)

    def on_change(self, callback: ChangeCallback) -> None:
        """Called after every local apply (master commit or replica apply), in order. A plain
        function runs at once; a coroutine runs in a background task, one at a time. A
        replica applies a state before it is committed, so a callback may see a state that
        a failover later replaces (by a newer one: versions only grow)."""
        self._change_cbs.append(callback)

    def on_commit(self, callback: ChangeCallback) -> None:
        """Called on the master after a commit succeeded (a majority holds the state)."""
        self._commit_cbs.append(callback)

    def register_recovery(self, hook: RecoveryHook) -> None:
        """Run by a newly promoted master after the resync, before serving ops. Must be
        idempotent: if it raises, the promotion is abandoned and retried later."""
        self._recovery.append(hook)

    # -- properties --

    @property
    def state(self) -> StateContext:
        """This node's latest committed or replicated copy."""
        return self._group.state

    @property
    def committed_state(self) -> StateContext | None:
        """On the master: the state of its last successful commit."""
        return self._group.committed if self._group.serving else None

    @property
    def is_master(self) -> bool:
        return self._group.serving

    @property
    def epoch(self) -> int | None:
        """The master's term, on the master."""
        return self._group.my_epoch if self._group.serving else None

    @property
    def master_name(self) -> str | None:
        """The master as this node sees it; ``None`` while there is none (or it is us and
        the promotion has not finished)."""
        return self._group.master_name

    @property
    def voter_names(self) -> list[str]:
        """The managers that count towards a majority, as this node's state has them
        (``StateContext.voters``; ``meta/voter_set.py``)."""
        return sorted(self._group.voter_set())

    @property
    def membership(self) -> Membership:
        if self._group.membership is None:
            raise RuntimeError("coordinator not started")
        return self._group.membership

    def new_id(self) -> str:
        return self._id_factory()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in a task this coordinator cancels when it stops (background work an
        op starts, e.g. a rebalance)."""
        return self._spawn(coro)

    async def exclusive(self, epoch: int, fn: Callable[[OpContext], Awaitable[T]]) -> T:
        """Run ``fn`` as an op of master term ``epoch``: under the op lock, so its reads and
        commits never interleave with ops; NODE_UNAVAILABLE (``deposed``) if this node is no
        longer master of that term. For long work started by an op (a rebalance) that
        commits between node calls but must not hold the op lock throughout."""
        group = self._group
        async with group.op_lock:
            if not group.serving or group.my_epoch != epoch:
                raise unavailable(
                    f"{self.name} is no longer master of term {epoch}",
                    "deposed",
                    node=self.name,
                    epoch=epoch,
                )
            return await fn(OpContext(self, None, epoch))

    # -- lifecycle --

    def install(self, server: RpcServer) -> None:
        self._server = server
        server.route(StateGather, self._on_gather)
        server.route(StateReplicate, self._on_replicate)
        server.route(OpForward, self._on_forward)
        server.route(StateRequest, self._on_state_request)
        for msg_type in self._ops:
            server.route(msg_type, self._on_op)

    async def start(self, membership: Membership) -> None:
        self._group.membership = membership
        rep = self._group.replica
        log.info(
            "coordinator %s: loaded epoch %d cas %d (promised term %d to %s)",
            self.name,
            rep.state.epoch,
            rep.state.cas,
            rep.promised_epoch,
            rep.leader,
        )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._group.role_loop(), name="coordinator-role"))
        self._tasks.append(loop.create_task(self._notice_loop(), name="coordinator-notices"))

    async def stop(self) -> None:
        self._group.step_down("node stopping", logging.INFO)
        tasks = [*self._tasks, *self._spawned]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        while not self._notices.empty():
            pending = self._notices.get_nowait()
            if inspect.iscoroutine(pending):
                pending.close()
        await self.pool.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._spawned[task] = None
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._spawned.pop(task, None)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that gave up must not cause a warning

    # -- notifications and recovery --

    def _notify(self, callbacks: list[ChangeCallback], state: StateContext) -> None:
        for cb in callbacks:
            try:
                result = cb(state)
            except Exception:
                log.exception("coordinator callback %r failed", cb)
                continue
            if inspect.isawaitable(result):
                self._notices.put_nowait(result)

    async def _notice_loop(self) -> None:
        while True:
            pending = await self._notices.get()
            try:
                await pending
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("coordinator callback failed")

    async def _run_recovery(self, epoch: int) -> None:
        ctx = OpContext(self, None, epoch)
        for hook in self._recovery:
            await hook(ctx)

    # -- voter handlers --

    async def _on_gather(self, msg: StateGather, conn: Connection) -> StateGatherReply:
        return self._group.on_gather(msg)

    async def _on_replicate(self, msg: StateReplicate, conn: Connection) -> StateReplicateReply:
        return self._group.on_replicate(msg)

    # -- ops --

    async def _on_op(self, msg: Message, conn: Connection) -> Message:
        return await self.submit(msg)

    async def submit(self, msg: Message) -> Message:
        """Run a registered op (or a fresh ``StateRequest``) on the master, wherever it is,
        and return its reply. Waits up to ``op_timeout`` for a master during a failover.
        An attempt whose outcome is unknown (connection lost, commit failed) is retried only
        when the message carries a ``request_id``; otherwise the error is raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timing.op_timeout
        request_id = getattr(msg, "request_id", None) or None  # "" means no id
        while True:
            try:
                if self._group.serving:
                    if isinstance(msg, StateRequest):
                        return self._state_reply(msg)
                    return await self._run_local(msg)
                master = self._group.master_name
                if master is None:
                    raise self._no_master()
                return await self._forward(master, msg, deadline)
            except ShardexError as e:
                reason = e.details.get("reason")
                certain = e.code is ErrorCode.NODE_UNAVAILABLE and reason in _NOT_RUN
                ambiguous = (
                    e.code in (ErrorCode.CONNECTION_CLOSED, ErrorCode.TIMEOUT)
                    or reason in _MAYBE_RUN
                )
                if not (certain or (ambiguous and request_id is not None)):
                    raise
                if loop.time() + self.timing.retry_interval >= deadline:
                    raise
                log.debug("op %s re-routed: %s", type(msg).__name__, e)
            await asyncio.sleep(self.timing.retry_interval)

    def _no_master(self) -> NodeUnavailable:
        voters = [m.name for m in self._group.voters()]
        up = self._group.up_voters()
        return unavailable(
            f"no coordinator master: {len(up)} of {len(voters)} manager nodes up in the view "
            f"of {self.name}; a majority ({majority(len(voters))}) is needed and a promotion "
            "must finish",
            "no_master",
            node=self.name,
            managers=voters,
            up=up,
        )

    async def _forward(self, master: str, msg: Message, deadline: float) -> Message:
        address = self._group.address(master)
        if address is None:
            raise self._no_master()
        loop = asyncio.get_running_loop()
        try:
            conn = await self.pool.get(address, max(0.0, deadline - loop.time()))
        except ShardexError as e:
            # Not even connected: the op certainly did not run there.
            raise unavailable(f"master {master} unreachable: {e.message}", "not_master") from e
        frame = encode_frame(Envelope(Kind.REQUEST, 0, msg))
        return await conn.request(
            OpForward(frame=frame, origin=self.name), max(0.0, deadline - loop.time())
        )

    def _not_master(self) -> NodeUnavailable:
        return unavailable(
            f"{self.name} is not the coordinator master",
            "not_master",
            node=self.name,
            master=self._group.master_name,
        )

    async def _on_forward(self, msg: OpForward, conn: Connection) -> Message:
        inner = decode_frame(msg.frame).body
        if not self._group.serving:
            raise self._not_master()
        if isinstance(inner, StateRequest):
            return self._state_reply(inner)
        if type(inner) not in self._ops:
            raise ShardexError(
                f"{self.name} has no op for {type(inner).__name__}",
                code=ErrorCode.UNKNOWN_MESSAGE,
                details={"type": type(inner).__name__},
            )
        return await self._run_local(inner)

    async def _run_local(self, msg: Message) -> Message:
        # Own task, shielded: a caller that times out or hangs up must not cancel an op
        # between two commits.
        return await asyncio.shield(self._spawn(self._execute(msg)))

    async def _execute(self, msg: Message) -> Message:
        group = self._group
        async with group.op_lock:
            epoch = group.my_epoch
            if not group.serving or epoch is None:
                raise self._not_master()
            request_id = getattr(msg, "request_id", None) or None  # "" means no id
            cached = stored_reply(self.state, request_id)
            if cached is not None:
                return cached
            ctx = OpContext(self, request_id, epoch)
            reply = await self._ops[type(msg)](msg, ctx)
            if not isinstance(reply, Message):
                raise TypeError(f"op for {type(msg).__name__} returned {reply!r}")
            if request_id is not None and ctx.committed and not ctx.reply_recorded:
                await group.commit(record_reply(self.state, request_id, reply), epoch)
            return reply

    # -- reads --

    async def _on_state_request(self, msg: StateRequest, conn: Connection) -> StateReply:
        if msg.fresh and not self._group.serving:
            reply = await self.submit(msg)
            if not isinstance(reply, StateReply):
                raise ShardexError(f"unexpected reply {reply!r}", code=ErrorCode.INTERNAL)
        else:
            reply = self._state_reply(msg)
        principal = conn.principal
        if principal is not None and not principal.is_node and reply.state.users:
            # Users' keys are for nodes only: with a StoredKey and one observed login, a
            # reader could log in as that user.
            state = msgspec.structs.replace(reply.state, users={})
            reply = msgspec.structs.replace(reply, state=state)
        return reply

    def _state_reply(self, msg: StateRequest) -> StateReply:
        state = self.state
        if msg.fresh and self._group.committed is not None:
            state = self._group.committed
        return StateReply(
            node=self.name,
            master=self._group.master_name,
            is_master=self._group.serving,
            state=select_sections(state, msg.sections),
        )

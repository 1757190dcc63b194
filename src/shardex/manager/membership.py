"""Cluster membership: who is in the cluster, and who is alive.

Two separate things, deliberately:

* The member list (who belongs) is replicated state. Each entry is owned by its member and
  carries an ``incarnation`` that only that member bumps (when its address or services
  change). Lists merge by member id, higher incarnation wins, so merging is commutative,
  associative and idempotent: any order of joins, pushes and heartbeat exchanges converges.
  The membership ``version`` is the sum of incarnations, which every change increases and
  which is equal on nodes holding equal lists; a ``digest`` of the content detects lists that
  differ with equal versions (two joins through two seeds at once). A member is removed
  (``remove``, by the coordinator master at the end of ``shardex rebalance --eject``) by a
  tombstone: its entry with ``removed`` set, which outranks every other entry of that member,
  so gossip, a stale persisted list or the member itself restarting never bring it back. The
  tombstone stays in the gossiped list; ``members`` (what everything else reads) leaves it
  out. A removed node accepts its tombstone and stops joining; it may run on, holding
  nothing, until the operator stops it. A node that should come back joins anew, under a
  new member id (a wiped data dir), and may reuse the name.
* Liveness (up / down) is local observation, not replicated: every node heartbeats every
  member running the manager service; a manager-service node marks a member down when it has
  not heard from it for ``failure_timeout`` and up at the next heartbeat. Until the
  coordinator protocol exists, every manager keeps its own view.

Failure-detection bound: a member that dies at time t sent its last heartbeat no earlier than
``t - heartbeat_interval``, so every live manager reports it down by
``t + failure_timeout + heartbeat_interval`` (plus one network delay); we state and test
``failure_timeout + 2 * heartbeat_interval``. A member that comes back is up as soon as one
heartbeat arrives (within one heartbeat interval plus its join).

All timing uses the running loop's clock, and all I/O goes through a ``Transport``, so this
module runs unchanged under the simulator's virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import msgspec

from shardex.api.membership import (
    Heartbeat,
    HeartbeatAck,
    JoinReply,
    JoinRequest,
    MemberListPush,
    MembersReply,
    MembersRequest,
)
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.member_list import (
    DOWN,
    UNKNOWN,
    UP,
    MemberInfo,
    MemberStore,
    MemberView,
    MemoryMemberStore,
    list_digest,
    list_version,
    merge_members,
    self_entry,
)
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.transport import Transport

__all__ = [
    "DOWN",
    "UNKNOWN",
    "UP",
    "Heartbeat",
    "HeartbeatAck",
    "JoinReply",
    "JoinRequest",
    "MemberInfo",
    "MemberListPush",
    "MemberStore",
    "MemberView",
    "MembersReply",
    "MembersRequest",
    "Membership",
    "MemoryMemberStore",
    "list_digest",
    "list_version",
    "merge_members",
    "self_entry",
]

log = logging.getLogger(__name__)

# Join failures that mean "not reachable now" (retry quietly), as opposed to a refusal.
_TRANSIENT = frozenset(
    {
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.TIMEOUT,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.UNKNOWN_MESSAGE,  # a peer between bind and route registration
    }
)


# --- the service -----------------------------------------------------------------------


class Membership:
    """Member list, joins, heartbeats and the local failure detector of one node."""

    def __init__(
        self,
        *,
        transport: Transport,
        secret: str,
        member_id: str,
        name: str,
        address: str,
        services: Iterable[str],
        seeds: Iterable[str] = (),
        heartbeat_interval: float = 0.5,
        failure_timeout: float = 3.0,
        store: MemberStore | None = None,
        join_timeout: float = 2.0,
        group: str = "",
    ) -> None:
        self._store = store or MemoryMemberStore()
        persisted = self._store.load() or []
        me = self_entry(member_id, name, address, services, persisted, group)
        self.me = me
        self.heartbeat_interval = heartbeat_interval
        self.failure_timeout = failure_timeout
        self.seeds = [s for s in seeds if s != me.address]
        self.join_timeout = join_timeout
        self._pool = ConnectionPool(transport, secret, name=me.name)
        self._members: dict[str, MemberInfo] = merge_members({}, persisted)
        self._members[me.member_id] = me
        self._digest: str | None = None
        self._sorted: list[MemberInfo] | None = None  # ``_entries``
        self._last_heard: dict[str, float] = {}
        self._peer_digest: dict[str, str] = {}  # member id -> digest it reported last
        self._observed: dict[str, str] = {}  # member id -> state last logged
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._joined = asyncio.Event()  # set once (re)joined or when founding
        self._started_at = 0.0
        if persisted != list(self._members.values()):
            self._persist()

    # -- public API --

    @property
    def is_manager(self) -> bool:
        return "manager" in self.me.services

    @property
    def members(self) -> list[MemberInfo]:
        """The members of the cluster (tombstones left out), in name order (a new list)."""
        return [m for m in self._entries() if not m.removed]

    def _entries(self) -> list[MemberInfo]:
        """Every entry, tombstones included: what is gossiped and persisted. Sorted once
        per list change (asked for by every SQL statement and scan that routes)."""
        if self._sorted is None:
            self._sorted = sorted(self._members.values(), key=lambda m: (m.name, m.member_id))
        return self._sorted

    def _changed(self) -> None:
        """``_members`` changed: what is derived from it is made again when next asked."""
        self._digest = None
        self._sorted = None

    @property
    def removed(self) -> bool:
        """This node was removed from the cluster (it holds nothing and serves nothing)."""
        return self.me.removed

    def remove(self, name: str) -> MemberInfo:
        """Remove member ``name`` from the cluster: its tombstone, pushed to every member and
        to the removed one (so that it learns it). The caller (the coordinator master) has
        made sure the member holds nothing. Returns the tombstone; BAD_REQUEST for this node
        itself or a name that is not a member."""
        if name == self.me.name:
            raise ShardexError(
                f"{name} cannot remove itself from the cluster",
                code=ErrorCode.BAD_REQUEST,
                details={"node": name, "hint": "remove it through another manager"},
            )
        entry = next((m for m in self.members if m.name == name), None)
        if entry is None:
            raise ShardexError(
                f"{name!r} is not a cluster member",
                code=ErrorCode.BAD_REQUEST,
                details={"node": name, "members": [m.name for m in self.members]},
            )
        tombstone = msgspec.structs.replace(entry, removed=True, incarnation=entry.incarnation + 1)
        self._members[entry.member_id] = tombstone
        self._changed()
        self._last_heard.pop(entry.member_id, None)
        log.warning("removed %s (%s) from the cluster", name, entry.member_id)
        self._persist()
        self._push_to_all(exclude=set(), also=[tombstone])
        return tombstone

    @property
    def version(self) -> int:
        return list_version(self._members.values())

    @property
    def digest(self) -> str:
        # Asked for on every heartbeat sent and received: computed once per list change.
        if self._digest is None:
            self._digest = list_digest(self._members.values())
        return self._digest

    @property
    def joined(self) -> asyncio.Event:
        return self._joined

    def install(self, server: RpcServer) -> None:
        server.route(JoinRequest, self._on_join)
        server.route(MemberListPush, self._on_push)
        server.route(Heartbeat, self._on_heartbeat)
        server.route(MembersRequest, self._on_members)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started_at = loop.time()
        if self.me.removed:
            log.error(
                "%s was removed from the cluster (ejected): it holds nothing and serves "
                "nothing; stop it, or wipe its data dir to join as a new node",
                self.me.name,
            )
            self._joined.set()
        elif self.seeds:
            self._tasks.append(loop.create_task(self._join_loop(), name="membership-join"))
        else:
            # Founding (or restarting without a seed): the persisted list is our cluster;
            # heartbeats and digest exchange re-establish contact with everyone in it.
            self._joined.set()
        self._tasks.append(loop.create_task(self._heartbeat_loop(), name="membership-hb"))
        self._tasks.append(loop.create_task(self._sweep_loop(), name="membership-sweep"))

    async def stop(self) -> None:
        tasks = self._tasks + list(self._inflight.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._inflight.clear()
        await self._pool.close()

    def state_of(self, member_id: str, now: float) -> tuple[str, float | None]:
        """(state, seconds since last heard) as this node observes it."""
        if member_id == self.me.member_id:
            return UP, 0.0
        heard = self._last_heard.get(member_id)
        age = None if heard is None else max(0.0, now - heard)
        member = self._members.get(member_id)
        if not self.is_manager and member is not None and "manager" not in member.services:
            return UNKNOWN, age  # nobody heartbeats a non-manager, so we cannot tell
        if age is not None and age <= self.failure_timeout:
            return UP, age
        # Never heard counts as down: a view says "up" only on evidence.
        return DOWN, age

    def view(self) -> MembersReply:
        now = asyncio.get_running_loop().time()
        rows = []
        for m in self.members:
            state, age = self.state_of(m.member_id, now)
            rows.append(
                MemberView(
                    member_id=m.member_id,
                    name=m.name,
                    address=m.address,
                    services=m.services,
                    incarnation=m.incarnation,
                    state=state,
                    last_heartbeat_age=None if age is None else round(age, 3),
                    group=m.group,
                )
            )
        return MembersReply(
            observer=self.me.name,
            observer_id=self.me.member_id,
            observer_is_manager=self.is_manager,
            version=self.version,
            digest=self.digest,
            heartbeat_interval=self.heartbeat_interval,
            failure_timeout=self.failure_timeout,
            members=rows,
        )

    # -- merging --

    def _merge(self, incoming: Iterable[MemberInfo], source: str) -> bool:
        """Merge a received list; persist and log if anything changed. Returns changed."""
        before = self.digest
        merged = merge_members(self._members, incoming)
        mine = merged.get(self.me.member_id)
        if mine is not None and mine.removed and not self.me.removed:
            # Removed by the master (ejected): accept it, never out-rank a tombstone.
            log.error(
                "%s was removed from the cluster (ejected): it holds nothing and serves "
                "nothing; stop it",
                self.me.name,
            )
            self.me = mine
        elif mine != self.me:
            # Someone holds a stale or foreign entry for us: ours is authoritative, and it
            # must out-rank theirs so the correction spreads.
            assert mine is not None
            if mine.sort_key() > self.me.sort_key():
                self.me = msgspec.structs.replace(self.me, incarnation=mine.incarnation + 1)
            merged[self.me.member_id] = self.me
        self._members = merged
        self._changed()
        if self.digest == before:
            return False
        log.info(
            "member list changed (from %s): version %d, %d members: %s",
            source,
            self.version,
            len(self.members),
            ", ".join(f"{m.name}@{m.address}" for m in self.members),
        )
        self._persist()
        return True

    def _persist(self) -> None:
        try:
            self._store.save(self._entries())
        except Exception:
            # A full disk must not stop failure detection; the list is re-learnt at rejoin.
            log.exception("could not persist the member list")

    def majority_heard(self, within: float) -> bool:
        """Whether a majority of the member list's managers (this node counted when it is
        one) were heard from in the last ``within`` seconds: the lease a data node needs to
        keep serving copies a failover could replace (``DataService``). A node cut off from
        the majority stops before that majority can fail it over, since auto-failover waits
        longer than the failure timeout."""
        managers = [m for m in self.members if "manager" in m.services]
        if not managers:
            return True  # no managers known yet (starting): nothing can fail us over
        now = asyncio.get_running_loop().time()
        heard = 0
        for m in managers:
            if m.member_id == self.me.member_id:
                heard += 1
                continue
            last = self._last_heard.get(m.member_id)
            if last is not None and now - last <= within:
                heard += 1
        return heard * 2 > len(managers)

    def _heard(self, member_id: str) -> None:
        self._last_heard[member_id] = asyncio.get_running_loop().time()

    # -- handlers --

    async def _on_join(self, msg: JoinRequest, conn: Connection) -> JoinReply:
        joiner = msg.member
        known = self._members.get(joiner.member_id)
        if joiner.removed or (known is not None and known.removed):
            raise ShardexError(
                f"{joiner.name} ({joiner.member_id}) was removed from the cluster",
                code=ErrorCode.BAD_REQUEST,
                details={
                    "name": joiner.name,
                    "member_id": joiner.member_id,
                    "hint": "wipe that node's data dir to join it again as a new node",
                },
            )
        if not self.is_manager:
            managers = [m.address for m in self.members if "manager" in m.services]
            raise ShardexError(
                f"{self.me.name} does not run the manager service; join through a manager",
                code=ErrorCode.BAD_REQUEST,
                details={"managers": managers},
            )
        for m in self.members:
            if m.name == joiner.name and m.member_id != joiner.member_id:
                # A second identity under a known name is almost always a wiped data dir;
                # two entries would leave a ghost "down" member forever, so refuse loudly.
                raise ShardexError(
                    f"node name {joiner.name!r} already belongs to member {m.member_id}",
                    code=ErrorCode.BAD_REQUEST,
                    details={
                        "name": joiner.name,
                        "member_id": m.member_id,
                        "hint": "restore that node's data dir (node.json) or use a new name",
                    },
                )
        self._heard(joiner.member_id)
        changed = self._merge([joiner], f"join of {joiner.name}")
        log.info(
            "%s %s (%s) at %s",
            "admitted" if changed else "re-join (no change) of",
            joiner.name,
            joiner.member_id,
            joiner.address,
        )
        if changed:
            self._push_to_all(exclude={joiner.member_id})
        return JoinReply(version=self.version, digest=self.digest, members=self._entries())

    async def _on_push(self, msg: MemberListPush, conn: Connection) -> None:
        self._merge(msg.members, "push")

    async def _on_heartbeat(self, msg: Heartbeat, conn: Connection) -> HeartbeatAck:
        self._heard(msg.member_id)
        if msg.members:
            self._merge(msg.members, f"heartbeat of {msg.name}")
        digest = self.digest
        return HeartbeatAck(
            member_id=self.me.member_id,
            name=self.me.name,
            version=self.version,
            digest=digest,
            members=self._entries() if digest != msg.digest else None,
        )

    async def _on_members(self, msg: MembersRequest, conn: Connection) -> MembersReply:
        return self.view()

    # -- background loops --

    def _push_to_all(self, exclude: set[str], also: Iterable[MemberInfo] = ()) -> None:
        """Push the list to every member (and to ``also``: a member just removed)."""
        msg = MemberListPush(version=self.version, digest=self.digest, members=self._entries())
        loop = asyncio.get_running_loop()
        for m in [*self.members, *also]:
            if m.member_id == self.me.member_id or m.member_id in exclude:
                continue
            task = loop.create_task(self._push_one(m, msg))
            self._tasks.append(task)
            task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    async def _push_one(self, member: MemberInfo, msg: MemberListPush) -> None:
        try:
            await self._pool.request(member.address, msg, timeout=self.join_timeout)
        except ShardexError as e:
            # Not fatal: the member catches up through the digest on its next heartbeat.
            log.debug("push of member list to %s failed: %s", member.name, e)

    async def _join_loop(self) -> None:
        """Join through each seed address (then any persisted member) until one admits us.

        Re-joining is idempotent, so a restarted node simply does it again."""
        delay = min(0.2, self.heartbeat_interval)
        attempt = 0
        redirects: list[str] = []  # managers named by a non-manager seed
        last_refusal = ""
        while True:
            known = [m.address for m in self.members if m.member_id != self.me.member_id]
            for address in dict.fromkeys(self.seeds + redirects + known):
                attempt += 1
                try:
                    reply = await self._pool.request(
                        address, JoinRequest(member=self.me), timeout=self.join_timeout
                    )
                except ShardexError as e:
                    if e.code in _TRANSIENT:
                        # Seeds often start a moment after us: say so only now and then.
                        lvl = logging.WARNING if attempt % 10 == 0 else logging.DEBUG
                        log.log(lvl, "join through %s failed (attempt %d): %s", address, attempt, e)
                    elif str(e) != last_refusal:
                        # Refusals (wrong secret, name taken) need an operator: log each once.
                        last_refusal = str(e)
                        hint = e.details.get("hint", "")
                        log.error("join through %s refused: %s %s", address, e, hint)
                    managers = e.details.get("managers")
                    if isinstance(managers, list):
                        redirects = [a for a in managers if isinstance(a, str)]
                    continue
                if not isinstance(reply, JoinReply):
                    log.warning("unexpected join reply from %s: %r", address, reply)
                    continue
                self._merge(reply.members, f"join reply from {address}")
                log.info(
                    "joined the cluster through %s: version %d, %d members",
                    address,
                    self.version,
                    len(self._members),
                )
                self._joined.set()
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _heartbeat_targets(self) -> list[MemberInfo]:
        return [
            m for m in self.members if m.member_id != self.me.member_id and "manager" in m.services
        ]

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            for m in self._heartbeat_targets():
                # One heartbeat in flight per target: a hung peer must not pile up requests,
                # nor delay the heartbeats every other manager needs from us.
                if m.member_id not in self._inflight:
                    task = loop.create_task(self._beat(m))
                    self._inflight[m.member_id] = task
                    task.add_done_callback(
                        lambda _t, mid=m.member_id: self._inflight.pop(mid, None)
                    )
            # Fixed-rate schedule: processing time does not stretch the interval; after a
            # stall (suspended process) resume from now instead of firing a burst.
            next_tick = max(next_tick + self.heartbeat_interval, loop.time())
            await asyncio.sleep(max(0.0, next_tick - loop.time()))

    async def _beat(self, target: MemberInfo) -> None:
        digest = self.digest
        include = self._peer_digest.get(target.member_id, digest) != digest
        msg = Heartbeat(
            member_id=self.me.member_id,
            name=self.me.name,
            version=self.version,
            digest=digest,
            members=self._entries() if include else None,
        )
        try:
            ack = await self._pool.request(target.address, msg, timeout=2 * self.heartbeat_interval)
        except ShardexError as e:
            log.debug("heartbeat to %s failed: %s", target.name, e)
            return
        if not isinstance(ack, HeartbeatAck):
            return
        self._heard(ack.member_id)
        if ack.members:
            self._merge(ack.members, f"heartbeat ack of {ack.name}")
        self._peer_digest[ack.member_id] = ack.digest

    async def _sweep_loop(self) -> None:
        """Log up/down transitions; the view itself computes state at query time, so the
        detection bound does not depend on this loop's period."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heartbeat_interval / 2)
            if not self.is_manager:
                continue
            now = loop.time()
            # A just-started manager has heard nobody yet: give members one timeout before
            # logging them down, to keep restarts from spraying false alarms into the log.
            if now - self._started_at < self.failure_timeout:
                continue
            for m in self.members:
                state, age = self.state_of(m.member_id, now)
                if self._observed.get(m.member_id) != state:
                    if m.member_id in self._observed or state != UP:
                        log.log(
                            logging.WARNING if state == DOWN else logging.INFO,
                            "member %s (%s) at %s is %s (last heard %s)",
                            m.name,
                            m.member_id,
                            m.address,
                            state.upper(),
                            "never" if age is None else f"{age:.1f}s ago",
                        )
                    self._observed[m.member_id] = state

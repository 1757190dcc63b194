"""An asyncio event loop whose clock is virtual.

``BaseEventLoop._run_once`` asks its selector to wait ``timeout`` seconds, the delay to the
next timer. Our selector never has I/O to report; instead of sleeping it moves the virtual clock
to that timer, so ``asyncio.sleep``, ``wait_for``, ``timeout`` and ``call_later`` all run in
virtual time and an hour of heartbeats costs milliseconds. Everything that would bring real
I/O, threads or wall time into the loop raises ``SimulationError``: any of them would make a run
depend on the machine instead of on the seed.

The loop also knows which simulated host every task belongs to (a context variable set by the
cluster and inherited by child tasks), so crashing a host can cancel all of its tasks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# asyncio's reports of an exception nobody retrieved, made when the task or future is
# garbage-collected
_UNRETRIEVED = ("Task exception was never retrieved", "Future exception was never retrieved")

# The simulated host a task belongs to; child tasks inherit it through their copied context.
current_host: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shardex_sim_host", default=None
)


class SimulationError(Exception):
    """The simulation itself went wrong (misuse, forbidden I/O, a crash in a callback)."""


class SimulationStalled(SimulationError):
    """Nothing is ready and no timer is pending, yet the main coroutine has not finished."""


class SimulationTimeLimit(SimulationError):
    """Virtual time or the step budget ran out (a livelock or a run that never ends)."""


class _VirtualSelector:
    """Stands in for the selector: reports no I/O and advances virtual time instead."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        loop = self._loop
        loop._steps += 1
        if loop._failure is not None:
            # A callback failed: stop here, at the failure, not at some later point.
            raise SimulationError(f"callback failed: {loop._failure!r}") from loop._failure
        if loop._max_steps is not None and loop._steps > loop._max_steps:
            raise SimulationTimeLimit(
                f"more than {loop._max_steps} loop steps at virtual time {loop._now:.6f}s "
                "(livelock: callbacks keep rescheduling without time passing?)"
            )
        if timeout is None:
            raise SimulationStalled(
                f"simulation stalled at virtual time {loop._now:.6f}s: nothing is ready and "
                f"no timer is pending.\n{loop.describe_tasks()}"
            )
        if timeout > 0:
            scheduled = loop._scheduled
            # Jump exactly to the head timer (the loop computed timeout from it) rather than
            # adding a float delta, so the timer is due with no rounding surprise.
            target = loop._now + timeout
            if scheduled and scheduled[0]._when <= target + 1e-9:
                target = max(target, scheduled[0]._when)
            if loop._max_time is not None and target > loop._max_time:
                raise SimulationTimeLimit(
                    f"virtual time limit {loop._max_time}s reached\n{loop.describe_tasks()}"
                )
            loop._now = target
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """Deterministic event loop on virtual time. Run one per simulation, in one thread."""

    def __init__(
        self,
        *,
        start_time: float = 0.0,
        max_time: float | None = None,
        max_steps: int | None = None,
    ) -> None:
        super().__init__()
        self._now = float(start_time)
        self._max_time = max_time
        self._max_steps = max_steps
        self._steps = 0
        self._selector = _VirtualSelector(self)
        # Fixed instead of the machine's monotonic resolution, which differs between hosts.
        self._clock_resolution = 1e-9
        self._thread_id_owner: int | None = None
        self._failure: BaseException | None = None
        self.unretrieved: list[str] = []
        # Live tasks in creation order (dicts keep insertion order; sets of tasks would iterate
        # by memory address and break replay).
        self._tasks: dict[asyncio.Task[Any], str | None] = {}
        self._host_tasks: dict[str, dict[asyncio.Task[Any], None]] = {}
        self._dead_hosts: dict[str, None] = {}

    # ---- clock -------------------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    @property
    def steps(self) -> int:
        return self._steps

    # ---- BaseEventLoop hooks -------------------------------------------------------------------

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def run_forever(self) -> None:
        self._thread_id_owner = threading.get_ident()
        super().run_forever()

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any, context=None):  # type: ignore[no-untyped-def, override]
        # Another thread would inject events at wall-clock moments; only the loop's own thread
        # may use this (some libraries call it from inside the loop).
        if self._thread_id_owner is not None and threading.get_ident() != self._thread_id_owner:
            raise SimulationError("call_soon_threadsafe from another thread in a simulation")
        return self.call_soon(callback, *args, context=context)

    # ---- tasks and hosts -----------------------------------------------------------------------

    def create_task(self, coro, *, name=None, context=None):  # type: ignore[no-untyped-def]
        task = super().create_task(coro, name=name, context=context)
        host = context.get(current_host) if context is not None else current_host.get()
        self._tasks[task] = host
        if host is not None:
            self._host_tasks.setdefault(host, {})[task] = None
            if host in self._dead_hosts:
                # A crashed host's finally-blocks may try to spawn work; it never runs.
                task.cancel(f"host {host} is down")
        task.add_done_callback(self._forget_task)
        return task

    def _forget_task(self, task: asyncio.Task[Any]) -> None:
        host = self._tasks.pop(task, None)
        if host is not None:
            self._host_tasks.get(host, {}).pop(task, None)

    def live_tasks(self) -> list[asyncio.Task[Any]]:
        """Unfinished tasks in creation order."""
        return [t for t in self._tasks if not t.done()]

    def host_tasks(self, host: str) -> list[asyncio.Task[Any]]:
        return [t for t in self._host_tasks.get(host, {}) if not t.done()]

    def kill_host(self, host: str) -> int:
        """Cancel every task of ``host`` (creation order) and any it spawns until revived."""
        self._dead_hosts[host] = None
        tasks = self.host_tasks(host)
        for task in tasks:
            task.cancel(f"host {host} crashed")
        return len(tasks)

    def revive_host(self, host: str) -> None:
        self._dead_hosts.pop(host, None)

    def describe_tasks(self, limit: int = 20) -> str:
        """Where each live task waits: the first thing to read when a simulation stalls."""
        lines = []
        for task in self.live_tasks()[:limit]:
            coro = task.get_coro()
            where = ""
            frames = task.get_stack(limit=1)
            if frames:
                f = frames[-1]
                where = f" at {f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}"
            qual = getattr(coro, "__qualname__", repr(coro))
            lines.append(f"  task host={self._tasks.get(task)} {qual}{where}")
        more = len(self.live_tasks()) - limit
        if more > 0:
            lines.append(f"  ... and {more} more")
        return "live tasks:\n" + "\n".join(lines) if lines else "no live tasks"

    # ---- errors --------------------------------------------------------------------------------

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        if message.startswith(_UNRETRIEVED) or exc is None:
            # Reported at garbage collection, i.e. at a moment that is not part of the
            # simulated history (for a task or a plain future alike): note it, never let it
            # change the run.
            self.unretrieved.append(f"{message}: {exc!r}")
            log.debug("sim: %s %r", message, exc)
            return
        if self._failure is None:
            self._failure = exc

    # ---- forbidden: anything that leaves the process or the thread ------------------------------

    def _forbidden(self, what: str) -> NoReturn:
        raise SimulationError(
            f"{what} is not allowed inside a simulation: it would make the run depend on the "
            "machine instead of the seed (use the SimTransport / virtual clock)"
        )

    def run_in_executor(self, executor, func, *args):  # type: ignore[no-untyped-def]
        self._forbidden("run_in_executor (threads)")

    def set_default_executor(self, executor):  # type: ignore[no-untyped-def]
        self._forbidden("set_default_executor")

    async def shutdown_default_executor(self, *args: Any) -> None:
        return None

    async def getaddrinfo(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("getaddrinfo (real DNS)")

    async def getnameinfo(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("getnameinfo (real DNS)")

    async def create_connection(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("create_connection (real TCP)")

    async def create_server(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("create_server (real TCP)")

    async def create_unix_connection(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("create_unix_connection")

    async def create_unix_server(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("create_unix_server")

    async def create_datagram_endpoint(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("create_datagram_endpoint (real UDP)")

    async def connect_accepted_socket(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("connect_accepted_socket")

    async def sock_connect(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sock_connect")

    async def sock_accept(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sock_accept")

    async def sock_recv(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sock_recv")

    async def sock_sendall(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sock_sendall")

    async def sock_recv_into(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sock_recv_into")

    async def sock_sendfile(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sock_sendfile")

    async def sendfile(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("sendfile")

    async def start_tls(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("start_tls")

    async def subprocess_exec(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("subprocess_exec")

    async def subprocess_shell(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("subprocess_shell")

    async def connect_read_pipe(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("connect_read_pipe")

    async def connect_write_pipe(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        self._forbidden("connect_write_pipe")

    def add_reader(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._forbidden("add_reader (real file descriptors)")

    def add_writer(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._forbidden("add_writer (real file descriptors)")

    def add_signal_handler(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._forbidden("add_signal_handler")


def run_on_sim_loop(
    main: Callable[[], Coroutine[Any, Any, T]],
    *,
    start_time: float = 0.0,
    max_time: float | None = None,
    max_steps: int | None = None,
) -> T:
    """Create a ``SimLoop``, run ``main()`` to completion, cancel leftovers, close the loop.

    Leftover tasks are cancelled in creation order (``asyncio.Runner`` would walk a WeakSet,
    whose order follows memory addresses), so even teardown is reproducible.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise SimulationError("run_on_sim_loop called from inside a running event loop")
    # Not installed as the thread's current loop: coroutines find it as the running loop, and
    # leaving the policy alone keeps pytest-asyncio's loops untouched.
    loop = SimLoop(start_time=start_time, max_time=max_time, max_steps=max_steps)
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            _cancel_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _cancel_leftovers(loop: SimLoop) -> None:
    tasks = loop.live_tasks()
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    # Teardown is not part of the simulated history: lift the limits so it can finish, and
    # drop a failure that has already been reported.
    loop._max_time = None
    loop._max_steps = None
    loop._failure = None
    try:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    except SimulationStalled:
        # A task that swallows cancellation and waits forever; nothing more can be done.
        log.warning("sim teardown: %s", loop.describe_tasks())

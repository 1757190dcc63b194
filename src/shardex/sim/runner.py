"""One simulation run: a seed, the RNGs derived from it, the network, the cluster, the loop."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shardex.sim.cluster import SimCluster
from shardex.sim.loop import SimLoop, run_on_sim_loop
from shardex.sim.network import FaultConfig, SimNetwork
from shardex.sim.testing import replay_hint

T = TypeVar("T")

# A day of virtual time: far beyond any scenario, small enough to stop a run that never ends.
DEFAULT_MAX_TIME = 24 * 3600.0


class Simulation:
    """Everything one seeded run needs. Build it, then ``run(main)``; ``main(sim)`` is async.

    Randomness comes from named streams derived from the seed (``fork_rng``): the network and
    the scenario draw from different streams, so a scenario that makes one more random choice
    does not shift every latency in the network.
    """

    def __init__(
        self,
        seed: int,
        config: FaultConfig | None = None,
        *,
        max_time: float | None = DEFAULT_MAX_TIME,
        max_steps: int | None = None,
        start_time: float = 0.0,
        port: int = 7000,
    ) -> None:
        self.seed = seed
        self.rng = self.fork_rng("scenario")
        self.network = SimNetwork(self.fork_rng("network"), config)
        self.cluster = SimCluster(self.network, port=port)
        self._max_time = max_time
        self._max_steps = max_steps
        self._start_time = start_time
        self.loop: SimLoop | None = None
        self.elapsed = 0.0
        self._ran = False

    def fork_rng(self, name: str) -> random.Random:
        """An independent generator for ``name``; string seeds hash with SHA-512, not hash()."""
        return random.Random(f"shardex-sim/{self.seed}/{name}")

    @property
    def config(self) -> FaultConfig:
        return self.network.config

    @property
    def trace(self):  # type: ignore[no-untyped-def]
        return self.network.trace

    def run(self, main: Callable[[Simulation], Awaitable[T]]) -> T:
        """Run ``main(self)`` on a fresh virtual-time loop; on failure say how to replay."""
        if self._ran:
            raise RuntimeError("a Simulation runs once; build a new one to replay the seed")
        self._ran = True

        async def wrapper() -> T:
            import asyncio

            loop = asyncio.get_running_loop()
            assert isinstance(loop, SimLoop)
            self.loop = loop
            try:
                return await main(self)
            finally:
                self.elapsed = loop.time() - self._start_time

        try:
            return run_on_sim_loop(
                wrapper,
                start_time=self._start_time,
                max_time=self._max_time,
                max_steps=self._max_steps,
            )
        except BaseException as exc:
            note = self.failure_note()
            print(note)  # pytest shows captured output of a failing test
            if hasattr(exc, "add_note"):
                exc.add_note(note)
            raise

    def failure_note(self, tail: int = 30) -> str:
        return (
            f"seed={self.seed}\n"
            f"replay: {replay_hint(self.seed)}\n"
            f"virtual time {self.elapsed:.6f}s, {len(self.trace)} network events, "
            f"trace digest {self.trace.digest[:16]}\n"
            f"last {tail} events:\n{self.trace.tail(tail)}"
        )


def run_simulation(
    main: Callable[[Simulation], Awaitable[T]],
    seed: int,
    config: FaultConfig | None = None,
    **kwargs: Any,
) -> T:
    """``Simulation(seed, config, **kwargs).run(main)``."""
    return Simulation(seed, config, **kwargs).run(main)


def assert_deterministic(
    main: Callable[[Simulation], Awaitable[Any]],
    seed: int,
    config: Callable[[], FaultConfig | None] = lambda: None,
    *,
    runs: int = 2,
    **kwargs: Any,
) -> str:
    """Run ``seed`` ``runs`` times in this process and demand identical traces; return the digest.

    Object addresses differ between runs even in one process, so this catches most hidden
    nondeterminism (iterating a set of tasks or connections, ``id()``, the wall clock). On a
    mismatch it names the first event where the runs diverge. ``config`` is a factory: a
    ``FaultConfig`` is mutable and must not be shared between runs.
    """
    sims = []
    for _ in range(runs):
        sim = Simulation(seed, config(), **kwargs)
        sim.run(main)
        sims.append(sim)
    first = sims[0]
    for other in sims[1:]:
        if other.trace.digest == first.trace.digest:
            continue
        a, b = first.trace.events, other.trace.events
        index = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if index is None:
            where = f"one trace is a prefix of the other ({len(a)} vs {len(b)} events kept)"
        else:
            context = "\n".join(e.format() for e in a[max(0, index - 5) : index])
            where = (
                f"first divergence at kept event {index}:\n{context}\n"
                f"  run 1: {a[index].format()}\n  run 2: {b[index].format()}"
            )
        raise AssertionError(
            f"seed={seed} is not deterministic: trace digests differ between runs in one "
            f"process.\n{where}"
        )
    return first.trace.digest

"""Nodes as coroutine factories, started, crashed and restarted by a test.

``SimCluster`` runs every node on one ``SimNetwork``: each node's tasks carry its host name, so
``crash`` cancels all of them (and everything they spawn) and aborts its comms, like ``kill -9``.
``TcpCluster`` runs the same node mains over real TCP on loopback in this process, so one
scenario can run in both modes; its crash only cancels the main task (whose ``finally`` must
stop its servers), which is the best a single process can do.

A node main is ``async def main(node) -> None``. ``node.disk`` is a dict that survives crash and
restart (what the node had made durable); everything else of the node dies with it.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

from shardex.net.transport import Transport
from shardex.sim.loop import current_host
from shardex.sim.network import SimNetwork

NodeMain = Callable[["ClusterNode"], Awaitable[Any]]


class ClusterNode:
    """One simulated process: a host name, its transport and its durable state."""

    def __init__(self, host: str, transport: Transport, main: NodeMain, listen_address: str):
        self.host = host
        self.transport = transport
        self.main = main
        # Where the node should listen. After the first bind it is the bound address, so a
        # restart binds the same port (port 0 would move the node under its clients).
        self.listen_address = listen_address
        self.disk: dict[str, Any] = {}
        self.incarnation = 0
        self.alive = False  # started and not crashed (its main may have returned already)
        self.task: asyncio.Task[Any] | None = None
        self._serving: asyncio.Future[str] | None = None
        self.address: str | None = None

    def __repr__(self) -> str:
        return f"<ClusterNode {self.host} #{self.incarnation} {'up' if self.up else 'down'}>"

    @property
    def up(self) -> bool:
        return self.alive

    def serving(self, address: str) -> None:
        """Called by the node's main once it listens on ``address``."""
        self.address = address
        self.listen_address = address
        if self._serving is not None and not self._serving.done():
            self._serving.set_result(address)

    async def wait_serving(self) -> str:
        """The address the node listens on, once its main has called ``serving``."""
        if self.address is not None and self.alive:
            return self.address
        if self._serving is None or self._serving.done():
            self._serving = asyncio.get_running_loop().create_future()
        return await self._serving

    async def wait(self) -> Any:
        """The result of the node's main (re-raises its exception)."""
        if self.task is None:
            raise RuntimeError(f"node {self.host} was never started")
        return await self.task


class _Cluster(abc.ABC):
    def __init__(self) -> None:
        self.nodes: dict[str, ClusterNode] = {}
        self.failures: list[tuple[str, BaseException]] = []

    @abc.abstractmethod
    def _new_node(self, host: str, main: NodeMain) -> ClusterNode: ...

    def add(self, host: str, main: NodeMain) -> ClusterNode:
        if host in self.nodes:
            raise ValueError(f"node {host} already exists")
        node = self._new_node(host, main)
        self.nodes[host] = node
        return node

    def __getitem__(self, host: str) -> ClusterNode:
        return self.nodes[host]

    def _spawn(self, node: ClusterNode) -> None:
        node.alive = True
        node.incarnation += 1
        node.address = None
        if node._serving is not None and node._serving.done():
            node._serving = None
        ctx = contextvars.copy_context()
        ctx.run(current_host.set, node.host)
        node.task = asyncio.get_running_loop().create_task(
            node.main(node), name=f"node {node.host} #{node.incarnation}", context=ctx
        )
        node.task.add_done_callback(lambda t, n=node: self._on_exit(n, t))

    def _on_exit(self, node: ClusterNode, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self.failures.append((node.host, exc))
        if node._serving is not None and not node._serving.done():
            node._serving.set_exception(exc)
        self._report(node, exc)

    def _report(self, node: ClusterNode, exc: BaseException) -> None:  # noqa: B027
        """Optional hook (the simulator traces the failure); ``failures`` already holds it."""

    def check(self) -> None:
        """Raise the first exception a node's main died of (a bug, not a crash)."""
        if self.failures:
            host, exc = self.failures[0]
            raise AssertionError(f"node {host} failed: {exc!r}") from exc

    async def start(self, *hosts: str) -> None:
        """Start the given nodes (all not running when none given), in the order added."""
        for host in hosts or tuple(self.nodes):
            node = self.nodes[host]
            if not node.up:
                self._spawn(node)

    async def stop_all(self) -> None:
        for node in self.nodes.values():
            await self.crash(node.host)

    @abc.abstractmethod
    async def crash(self, host: str) -> None: ...

    async def restart(self, host: str) -> None:
        node = self.nodes[host]
        if node.alive:
            await self.crash(host)
        self._spawn(node)


class SimCluster(_Cluster):
    """Nodes on a ``SimNetwork``; each listens on ``host:port`` (``port`` by default)."""

    def __init__(
        self, network: SimNetwork, *, port: int = 7000, fail_on_node_error: bool = True
    ) -> None:
        super().__init__()
        self.network = network
        self.port = port
        self.fail_on_node_error = fail_on_node_error

    def _report(self, node: ClusterNode, exc: BaseException) -> None:
        if self.fail_on_node_error:
            # A node main dying of an exception is a bug: stop the simulation right here.
            self.network.loop.call_exception_handler(
                {"message": f"node {node.host} main failed", "exception": exc}
            )

    def _new_node(self, host: str, main: NodeMain) -> ClusterNode:
        return ClusterNode(host, self.network.transport(host), main, f"{host}:{self.port}")

    async def crash(self, host: str, *, power_off: bool = False) -> None:
        """Abort the node's comms, drop its listeners, cancel all its tasks."""
        self.network.crash(host, power_off=power_off)
        node = self.nodes.get(host)
        if node is not None:
            node.alive = False
        if node is not None and node.task is not None:
            # Let the cancellations land so the node is really gone when this returns.
            await asyncio.wait([node.task])

    async def restart(self, host: str) -> None:
        node = self.nodes[host]
        if self.network.is_up(host):
            await self.crash(host)
        self.network.restart(host)
        self._spawn(node)

    def partition(self, side_a: list[str], side_b: list[str] | None = None) -> None:
        self.network.partition(side_a, side_b)

    def heal(self) -> None:
        self.network.heal()


class TcpCluster(_Cluster):
    """The same node mains over real TCP on 127.0.0.1 (for the real-mode run of a scenario)."""

    def __init__(self, *, host_ip: str = "127.0.0.1") -> None:
        super().__init__()
        self.host_ip = host_ip

    def _new_node(self, host: str, main: NodeMain) -> ClusterNode:
        from shardex.net.tcp import TcpTransport

        return ClusterNode(host, TcpTransport(), main, f"{self.host_ip}:0")

    async def crash(self, host: str) -> None:
        """Cancel the node's main task and wait for it (its ``finally`` stops its servers)."""
        node = self.nodes[host]
        node.alive = False
        if node.task is not None and not node.task.done():
            node.task.cancel()
            await asyncio.wait([node.task])

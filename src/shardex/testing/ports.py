"""Free loopback ports for local clusters started by tests and benchmarks.

A cluster's nodes take ports P, P+1, ... and their HTTP ports P+offset, ...; the ranges are
chosen below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``,
32768-60999 by default): a port there can be taken by any outgoing connection between the
check here and the node's bind, which made cluster starts fail now and then.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

from shardex.meta.cluster_dir import HTTP_PORT_OFFSET

LOWEST = 20_000
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections (32768 if unknown)."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def ports_free(ports: Sequence[int]) -> bool:
    """Whether every port in ``ports`` can be bound on 127.0.0.1 right now."""
    socks: list[socket.socket] = []
    try:
        for p in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_base_port(nodes: int, http_offset: int = HTTP_PORT_OFFSET, seed: int | None = None) -> int:
    """A base port P with P..P+nodes-1 and P+http_offset.. free now, all below the
    ephemeral range."""
    rng = random.Random(seed)
    top = ephemeral_low() - http_offset - nodes
    if top <= LOWEST:
        raise RuntimeError(f"no port range below the ephemeral ports ({ephemeral_low()})")
    for _ in range(200):
        base = rng.randrange(LOWEST, top)
        wanted = [base + k for k in range(nodes)] + [base + http_offset + k for k in range(nodes)]
        if ports_free(wanted):
            return base
    raise RuntimeError("found no free range of ports for the cluster")

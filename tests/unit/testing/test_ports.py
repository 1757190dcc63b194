"""``testing/ports.py``: cluster port ranges stay below the kernel's ephemeral ports."""

from __future__ import annotations

import socket

from shardex.testing.ports import ephemeral_low, free_base_port, ports_free


def test_the_range_and_its_http_ports_lie_below_the_ephemeral_ports() -> None:
    for seed in range(20):
        base = free_base_port(4, 1000, seed=seed)
        assert base >= 20_000 and base + 1000 + 4 <= ephemeral_low()
        assert ports_free([base + k for k in range(4)] + [base + 1000 + k for k in range(4)])


def test_a_bound_port_is_not_free() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not ports_free([s.getsockname()[1]])

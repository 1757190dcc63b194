"""Fixtures of the multi-host tests: hosts (network namespaces on a bridge) and shardex nodes
on them. Every fixture tears down in a finalizer, so a failed test leaves nothing behind."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The node and client helpers of the real-process cluster tests (wait_for, proc_env, the
# writers that check acknowledged writes) are imported as tests/cluster's own modules are.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))

from shardex.testing.hosts.netns import Hosts, require_netns
from shardex.testing.hosts.nodes import NodesOnHosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    require_netns()
    with Hosts(3) as h:
        yield h


@pytest.fixture(scope="module")
def nodes(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodesOnHosts]:
    n = NodesOnHosts(hosts, tmp_path_factory.mktemp("hosts"))
    n.start_all()
    try:
        n.wait_formed()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(n.logs())) from None
    yield n

"""``bench.diagnostics.pipeline_cpu``'s sampling and attribution, and the OS thread names it
relies on."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest
from bench.diagnostics.pipeline_cpu import (
    CpuSampler,
    Roles,
    Series,
    budget,
    node_thread,
    read_threads,
)

from shardex.runtime.thread_names import OS_NAME_MAX, name_os_thread, os_thread_namer

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")


def _comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def test_pool_threads_carry_their_os_name() -> None:
    def own_comm() -> str:
        return _comm(threading.get_native_id())

    with concurrent.futures.ThreadPoolExecutor(2, initializer=os_thread_namer("data-io")) as ex:
        names = {ex.submit(own_comm).result() for _ in range(4)}
    assert names == {"data-io"}


def test_os_names_are_cut_to_the_kernel_limit_and_must_not_be_empty() -> None:
    seen: list[str] = []

    def run() -> None:
        assert name_os_thread("x" * 40)
        seen.append(_comm(threading.get_native_id()))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == ["x" * OS_NAME_MAX]
    with pytest.raises(ValueError):
        os_thread_namer("")


def test_series_interpolates_and_counts_late_threads_from_zero() -> None:
    s = Series(1, 2, "t", [(10.0, 100, 10), (12.0, 300, 30)])
    assert s.at(11.0) == 200
    assert s.at(11.0, 2) == 20
    assert s.at(9.0) == 100 and s.at(13.0) == 300
    late = Series(1, 3, "t", [(10.0, 100, 0)], born_after_start=True)
    assert late.at(9.0) == 0.0


def test_a_busy_thread_is_measured_and_attributed() -> None:
    """A thread named like a node's indexer pool, burning ~0.3 s of CPU inside the window,
    is counted under that group (this process stands in for a node)."""
    stop = threading.Event()

    def burn() -> None:
        name_os_thread("index-io")
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        stop.wait(5)

    me = os.getpid()
    sampler = CpuSampler(lambda: {me}, interval=0.05)
    sampler.start()
    a = time.time()
    t = threading.Thread(target=burn)
    t.start()
    time.sleep(0.05)
    deadline = time.monotonic() + 10
    tid = t.native_id
    assert tid is not None
    while time.monotonic() < deadline:  # until the burn is visible in /proc
        got = read_threads(me).get(tid)
        if got is not None and got[1] >= 0.28 * os.sysconf("SC_CLK_TCK"):
            break
        time.sleep(0.02)
    time.sleep(0.1)
    b = time.time()
    sampler.stop()
    stop.set()
    t.join()
    roles = Roles(nodes={me: "node1"})
    procs, threads, info = budget(sampler, roles, a, b, mutations=1000)
    by = {(r["process"], r["component"]): r["cpu s"] for r in threads}
    assert 0.2 <= by[("nodes (3)", "index-io")] <= 0.5
    assert procs[0]["component"] == "nodes (3)"
    assert info["mutations"] == 1000
    # the same CPU, per node: 0.2-0.5 s over 1,000 mutations
    assert set(info["index_io_us_per_mutation"]) == {"node1"}
    assert 200 <= info["index_io_us_per_mutation"]["node1"] <= 500


def test_node_threads_are_grouped_by_name() -> None:
    assert node_thread(7, 7, "python") == "event loop"
    assert node_thread(7, 8, "data-io") == "data-io"
    assert node_thread(7, 9, "rocksdb:low") == "rocksdb background"
    assert node_thread(7, 10, "python") == "other threads"

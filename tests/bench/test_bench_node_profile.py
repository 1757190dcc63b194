"""``bench/diagnostics/node_profile.py``: a process started inside ``node_profiling`` whose
command line
names ``shardex.cli.node`` profiles itself between the two signals; the environment is restored
afterwards, and other processes are left alone."""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
from pathlib import Path

from bench.diagnostics.node_profile import ENV_DIR, node_profiling

# "shardex.cli.node" appears in the command line (this -c text), as in a real node's.
SCRIPT = """\
import os, signal, time  # shardex.cli.node
def work():
    return sum(range(10000))
os.kill(os.getpid(), signal.SIGRTMIN + 3)
work()
os.kill(os.getpid(), signal.SIGRTMIN + 4)
print(os.getpid())
"""


def test_a_node_process_writes_its_profile_and_the_environment_is_restored(
    tmp_path: Path,
) -> None:
    before = dict(os.environ)
    with node_profiling(tmp_path):
        assert os.environ[ENV_DIR] == str(tmp_path.resolve())
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True
        )
        other = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
    assert dict(os.environ) == before
    stats = pstats.Stats(str(tmp_path / f"node-{out.stdout.strip()}.prof"))
    assert any(fn == "work" for (_, _, fn) in stats.stats)  # type: ignore[attr-defined]
    assert not (tmp_path / f"node-{other.stdout.strip()}.prof").exists()

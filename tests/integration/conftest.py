"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.integration.scan_env import Env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """The scan tests' two indexer nodes on loopback TCP (``scan_env.Env``), started, and
    stopped after the test. A module that needs the nodes set up otherwise before they start
    defines its own ``env``."""
    # Imported here: most unit tests never start these nodes.
    from tests.integration.scan_env import Env

    e = Env(tmp_path)
    await e.start()
    try:
        yield e
    finally:
        await e.stop()

"""A future whose exception nobody retrieved is reported when it is garbage-collected, a
moment outside the simulated history: the loop notes it and the run goes on, as for a task."""

from __future__ import annotations

import asyncio
import gc

from shardex.sim import SimLoop, run_on_sim_loop


def test_an_unretrieved_future_exception_is_noted_not_fatal() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        fut: asyncio.Future[None] = loop.create_future()
        fut.set_exception(ValueError("nobody looks"))
        del fut
        gc.collect()
        await asyncio.sleep(1.0)  # the run continues past the report
        return list(loop.unretrieved)

    noted = run_on_sim_loop(main)
    assert any("Future exception was never retrieved" in n for n in noted), noted

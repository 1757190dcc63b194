"""``shardex.net.loops``: which event loop real processes run on, and the switch back."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from shardex.net.loops import ENV_VAR, loop_kind, new_event_loop


def _run_on_new_loop() -> type:
    loop = new_event_loop()
    try:

        async def running() -> type:
            await asyncio.sleep(0)
            return type(asyncio.get_running_loop())

        return loop.run_until_complete(running())
    finally:
        loop.close()


def test_the_default_loop_is_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert loop_kind() == "uvloop"
    assert issubclass(_run_on_new_loop(), uvloop.Loop)


def test_the_environment_selects_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "asyncio")
    assert loop_kind() == "asyncio"
    kind = _run_on_new_loop()
    assert not issubclass(kind, uvloop.Loop) and issubclass(kind, asyncio.AbstractEventLoop)


def test_an_unknown_loop_name_is_an_error_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, "trio")
    with pytest.raises(ValueError, match=r"'trio'.*uvloop.*asyncio"):
        loop_kind()


def test_the_client_loop_thread_runs_on_the_selected_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardex.client.loop_thread import LoopThread

    for env, want_uv in (("uvloop", True), ("asyncio", False)):
        monkeypatch.setenv(ENV_VAR, env)
        t = LoopThread(f"test-{env}")
        try:
            assert isinstance(t.loop, uvloop.Loop) is want_uv
        finally:
            t.stop()

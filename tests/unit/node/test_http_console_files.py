"""The web console's files (``shardex/node/http/ui``) and their route: ``/ui`` served without
a login, by exact name only, with fitting content types; every module and stylesheet the
page loads exists and is shipped as package data; a refused request from the console
carries no ``WWW-Authenticate`` challenge (the browser would show its own login dialog)."""

from __future__ import annotations

import asyncio
import fnmatch
import http.client
import re
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardex.node.http import server as http_server
from shardex.node.http.server import CONSOLE_REQUEST, HttpServer
from shardex.node.http.static import StaticFiles

UI = Path(http_server.__file__).resolve().parent / "ui"
ROOT = Path(__file__).resolve().parents[3]


def test_files_by_exact_name_only() -> None:
    files = StaticFiles()
    for path in ("/ui", "/ui/", "/ui/index.html"):
        found = files.get(path)
        assert found is not None and found[1] == "text/html; charset=utf-8", path
        assert b"/ui/app.js" in found[0]
    js = files.get("/ui/app.js")
    assert js is not None and js[1] == "text/javascript; charset=utf-8"
    css = files.get("/ui/console.css")
    assert css is not None and css[1] == "text/css; charset=utf-8"
    for bad in (
        "/ui/../server.py",
        "/ui/..",
        "/ui/nope.js",
        "/ui/sub/app.js",
        "/ui/app.py",
        "/ui/.x.js",
    ):
        assert files.get(bad) is None, bad


def test_every_file_the_page_loads_exists_and_is_package_data() -> None:
    names = {p.name for p in UI.iterdir() if p.is_file()}
    wanted = set(re.findall(r'"/ui/([^"]+)"', (UI / "index.html").read_text()))
    for js in UI.glob("*.js"):
        wanted |= set(re.findall(r'from "\./([^"]+)"', js.read_text()))
    assert wanted <= names, sorted(wanted - names)
    assert {"app.js", "console.css", "page-query.js"} <= wanted
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = spec["tool"]["setuptools"]["package-data"]["shardex.node.http"]
    shipped = {n for n in names if any(fnmatch.fnmatch(f"ui/{n}", g) for g in globs)}
    assert shipped == names  # a file no glob names would be missing from a wheel


def _get(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.headers), r.read()
    finally:
        conn.close()


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    s = HttpServer(
        sql=None,  # type: ignore[arg-type]  # no statement runs here
        users=None,
        authorize=lambda p, m: None,
        node_name="n1",
        metrics=lambda: b"",
    )
    await s.start("127.0.0.1", 0)
    yield s
    await s.stop()


async def test_the_console_route(server: HttpServer) -> None:
    assert server.port is not None
    status, headers, body = await asyncio.to_thread(_get, server.port, "/ui/", {})
    assert (status, headers["Content-Type"]) == (200, "text/html; charset=utf-8")
    assert body == (UI / "index.html").read_bytes()
    status, _, _ = await asyncio.to_thread(_get, server.port, "/ui/missing.js", {})
    assert status == 404
    # the data is not: a refused login challenges curl, not the console
    status, headers, _ = await asyncio.to_thread(_get, server.port, "/metrics", {})
    assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="shardex"'
    console = {"X-Requested-With": CONSOLE_REQUEST}
    status, headers, _ = await asyncio.to_thread(_get, server.port, "/metrics", console)
    assert status == 401 and "WWW-Authenticate" not in headers

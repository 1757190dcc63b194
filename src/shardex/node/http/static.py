"""The web console's files (``ui/`` beside this module, shipped as package data) under
``/ui``: plain HTML, JavaScript modules and CSS, no build step.

They are served without a login: they hold no cluster data (the pages fetch everything
from ``/api``, ``/query/service``, ``/admin`` and ``/metrics`` with the user's
credentials). Only the directory's own files are served, by an exact name (no
subdirectories, no ``..``), read once and kept: the files do not change under a running node.
"""

from __future__ import annotations

import importlib.resources
import re
from typing import Final

__all__ = ["UI_PREFIX", "StaticFiles"]

UI_PREFIX: Final = "/ui"
INDEX: Final = "index.html"
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]*\.(html|js|css|svg)")
_TYPES: Final = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}


class StaticFiles:
    def __init__(self, package: str = "shardex.node.http", folder: str = "ui") -> None:
        self._root = importlib.resources.files(package).joinpath(folder)
        self._cache: dict[str, tuple[bytes, str]] = {}

    def get(self, path: str) -> tuple[bytes, str] | None:
        """(body, content type) of ``/ui``, ``/ui/`` (the console's page) or ``/ui/NAME``;
        None: no such file."""
        name = path[len(UI_PREFIX) :].lstrip("/") or INDEX
        found = self._cache.get(name)
        if found is not None:
            return found
        m = _NAME.fullmatch(name)
        if m is None:
            return None
        f = self._root.joinpath(name)
        if not f.is_file():
            return None
        found = self._cache[name] = (f.read_bytes(), _TYPES[m.group(1)])
        return found

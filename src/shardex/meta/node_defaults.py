"""What a node runs, where it listens and how fast membership notices a failure, unless its
config says otherwise; shared by node configs and the local cluster directory."""

from __future__ import annotations

ALL_SERVICES: tuple[str, ...] = ("data", "index", "query", "manager")


BIND_HOST = "127.0.0.1"  # the default bind (and advertised) host; the local cluster uses it


DEFAULT_HEARTBEAT_INTERVAL = 0.5


DEFAULT_FAILURE_TIMEOUT = 3.0


# A node's HTTP port (the query service) is its cluster port plus this, unless configured:
# its ports derive from its own port, and adding nodes later never renumbers anyone.
HTTP_PORT_OFFSET = 1000


# The expiry pager (``data/expiry_pager.py``): seconds between its walk's ticks, and how many
# document records one tick reads at most (each a decode: a tick's cost stays bounded).
DEFAULT_EXPIRY_PAGER_INTERVAL = 10.0


DEFAULT_EXPIRY_PAGER_BATCH = 10_000

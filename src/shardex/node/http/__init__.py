"""The node's HTTP services on its ``http_port``: the N1QL query service (``server.py``)."""

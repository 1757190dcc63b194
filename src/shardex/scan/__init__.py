"""Index scans: the scan coordinator, its wire messages, spans, merging and block streams.

See ``coordinator.py`` for the flow (``scan-request-flow.md``), ``messages.py`` for the wire
format and ``streams.py`` for credit-based block streams."""

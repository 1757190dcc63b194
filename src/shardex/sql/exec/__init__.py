"""Distributed SQL execution: statements, plans split into fragments, the query service and
its exchanges (``sql-execution-protocol.md``)."""

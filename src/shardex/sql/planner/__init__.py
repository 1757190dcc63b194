"""The SQL planner: which index serves a query, with which spans, covering or not."""

"""SQL++ breadth against PostgreSQL (``python -m bench.sql_breadth``): joins, UNNEST and ANY
over an array index, a correlated subquery and a window function on customers and their
orders (``data.py``, ``queries.py``), shardex's phase (``phases.py``) beside ``bench.sql``'s
PostgreSQL phase and client processes, run by ``run.py``."""

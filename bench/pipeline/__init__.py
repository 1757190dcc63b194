"""The index pipeline benchmark (``python -m bench.pipeline``): the initial build against
PostgreSQL CREATE INDEX (``build.py``), the drain of a backlog, freshness at a sustained write
rate and the floor of a micro-batch (``maintain.py``, ``stats.py``), run by ``run.py``."""

"""SQL against PostgreSQL (``python -m bench.sql``): the query mix and its PostgreSQL twins
(``queries.py``), the two systems' phases (``phases.py``) over concurrent client processes
(``clients.py``), run by ``run.py``."""

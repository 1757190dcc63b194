"""Index scans against PostgreSQL (``python -m bench.scan``): the 100-row queries
(``queries.py``), each system's set-up and large scans (``phases.py``, ``raw.py``), the
interleaved measurements (``rounds.py``, ``interleaved.py``) over concurrent client processes
(``clients.py``), run by ``run.py``."""

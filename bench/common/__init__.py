"""The set-up every benchmark shares: the runner that prints a table and writes JSON
(``runner.py``), a throwaway local cluster (``local_cluster.py``), a private PostgreSQL server
(``postgres.py``) and its synchronous standby (``pg_standby.py``), processes' CPU time
(``proc_cpu.py``), the documents and indexes (``dataset.py``), the in-process pipeline driver
(``driver.py``), the skeleton of the end-to-end benchmarks (``harness.py``) and, for
``bench.scan`` and ``bench.sql``, concurrent client processes (``clients.py``) and the pieces
of their phases (``phases.py``)."""

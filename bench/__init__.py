"""shardex benchmarks; results land in ``bench/results/``.

The headline set, one area each, every one with ``--quick``: ``python -m bench.data_service``,
``bench.pipeline``, ``bench.scan``, ``bench.sql``, ``bench.sql_breadth`` (joins, arrays,
subqueries and windows against PostgreSQL), ``bench.http`` (the N1QL query service against
the Python client and PostgreSQL) and ``bench.wire``; ``python -m bench
--quick`` (``make bench``) runs them all in turn. Their shared set-up is ``bench/common/``;
tools that find where the time goes are in ``bench/diagnostics/`` (see its README).
"""

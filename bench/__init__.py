"""shardex benchmarks; results land in ``bench/results/``.

The headline set, one area each, every one with ``--quick``: ``python -m bench.data_service``,
``bench.pipeline``, ``bench.scan``, ``bench.sql`` and ``bench.wire``; ``python -m bench
--quick`` (``make bench``) runs them all in turn. Their shared set-up is ``bench/common/``;
tools that find where the time goes are in ``bench/diagnostics/`` (see its README).
"""

"""shardex benchmarks: ``python -m bench.<name>``; results land in ``bench/results/``."""

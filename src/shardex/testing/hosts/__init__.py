"""Multi-host clusters on one machine: network namespaces on a bridge (``netns``), shardex
nodes on them (``nodes``) and a Spark standalone cluster (``spark``), for tests/hosts and the
benchmarks that need executors on another host than the nodes. Root only."""

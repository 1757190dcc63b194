"""In-process integration tests, one folder per package they test: real services over
loopback TCP (``127.0.0.1``), or a child process that is killed or inspected. Tests of a
cluster of ``shardex node`` processes are in ``tests/cluster``."""

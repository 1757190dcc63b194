"""Unit tests, one folder per package of ``shardex`` they test: in process, no sockets, no
child processes. Tests that use loopback TCP or start processes are in ``tests/integration``."""

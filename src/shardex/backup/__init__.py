"""Backup and restore (``shardex backup``): a repository of full and incremental backups of
keyspaces in an open format (Parquet files per data partition, JSON manifests).

* ``repo``: the repository's layout and manifests, opening it (a corrupt or foreign one is
  refused), writing and reading partition files;
* ``merge``: the pure rules that turn a chain of backups into each document's newest version;
* ``take``: ``create_backup``, reading every partition up to a recorded seqno vector through
  the change-stream readers the index pipeline's initial build uses;
* ``restore``: ``restore_backup`` into a running cluster of any shape, and ``verify``.

Imports go one way, down this list: ``take`` / ``restore``; ``merge``; ``repo``.
"""

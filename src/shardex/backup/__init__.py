"""Backup and restore (``shardex backup``): a repository of full and incremental backups of
keyspaces in an open format (Parquet files per data partition, JSON manifests).

* ``repo``: the repository's layout and manifests, opening it (a corrupt or foreign one is
  refused), writing and reading partition files;
* ``merge``: the pure rules that turn a chain of backups into each document's newest version;
* ``snapshot``: partitions' live documents as of given seqnos, read through the change-stream
  readers the index pipeline's initial build uses (with its fallbacks for a purged log or a
  branch change);
* ``take``: ``create_backup``, every partition up to a recorded seqno vector, full or
  incremental;
* ``restore``: ``restore_backup`` into a running cluster of any shape, and ``verify``.

Imports go one way: ``take`` / ``restore`` -> ``snapshot`` -> ``merge`` -> ``repo``.
"""

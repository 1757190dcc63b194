"""Data service: partitions, seqnos, change log, change streams, retention, migration.

The local engine is ``DataEngine`` (``engine.py``) over one RocksDB ``Store``; the node-side
RPC service is ``service.py``. What clients see of it (messages, records, errors, document
validation) is in ``shardex.api``, so a client never imports this package. The layout and
rules are in ``docs/decisions/`` (``0005-column-family-per-partition.md`` to
``0015-stream-credits.md``).
"""

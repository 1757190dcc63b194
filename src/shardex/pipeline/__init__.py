"""The index pipeline: Spark jobs that keep a keyspace's indexes up to date.

* ``project/``: the cores, pure functions: change records to key versions (``projector``,
  ``columnar``) and key versions to indexer nodes (``router``);
* ``source/``: the keyspace change streams as a PySpark data source, and the readers it
  shares with the driver (``read``, ``driver_read``);
* ``rounds/``: the stability rounds of the maintenance stream and what changes their timing
  (the round beside Spark's commit, the read-ahead, rounds between batches, streamed
  rounds, the drop before a round, rounds for index moves);
* here: the driver (``driver``, ``process``, ``session``), its jobs (``maintain`` with
  ``batch_steps``, ``build``, ``rollback``), what it knows of the indexes (``registry``)
  and its calls to indexers and the timekeeper (``indexers``).

Imports go one way, down this list: the jobs and the driver; ``rounds``; ``registry``;
``source``; ``indexers``; ``project``. The ``__init__`` files import nothing heavy (no
pyspark), so executors and indexer nodes import the cores cheaply:
``from shardex.pipeline.project.projector import project``.
"""

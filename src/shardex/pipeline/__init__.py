"""The index pipeline: projector and router cores (pure functions), and later the Spark jobs.

This package's ``__init__`` imports nothing heavy (no pyspark) so executors and indexer nodes
can import the cores cheaply: ``from shardex.pipeline.projector import project``.
"""

"""shardex: a distributed JSON document store with global secondary indexes and SQL."""

__version__ = "0.1.0"

"""Storage: a thin wrapper over RocksDB (rocksdict) with the operations the services need."""

from shardex.storage.rocks import Batch, ColumnFamily, SstWriter, Store, StoreSnapshot

__all__ = ["Batch", "ColumnFamily", "SstWriter", "Store", "StoreSnapshot"]

"""The keyspace change streams as a PySpark data source (``datasource.ShardexChangeSource``)
and the change readers it shares with the driver (``read``, ``ranges``, ``driver_read``),
which import no pyspark."""

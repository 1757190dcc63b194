"""``foreachBatch`` for a sink that never reads the micro-batch's DataFrame.

PySpark's ``DataStreamWriter.foreachBatch`` hands every batch to a ``ForeachBatchFunction``
whose ``call`` first builds a Python ``SparkSession`` around the batch's Java session and a
``DataFrame`` around the batch: ``jdf.sparkSession()``, two class look-ups through py4j's
``JVMView``, ``applyModifiableSettings`` with a Python dict converted to a Java map, and
later the ``JavaObject`` garbage messages. Each is a py4j round trip from the callback
thread while Spark's stream thread waits in ``addBatch``. The maintenance job reads
(start, end] itself (``driver_read``, or a batch read on the workers for large batches) and
never executes the streaming DataFrame, so it registers ``BatchIdCallback`` instead: the same
Java interface, the batch id alone. Measured in
``docs/decisions/0061-spark-per-batch-overhead.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql.utils import ForeachBatchFunction

if TYPE_CHECKING:
    from pyspark.sql.streaming import DataStreamWriter

__all__ = ["BatchIdCallback", "foreach_batch_id"]


class BatchIdCallback(ForeachBatchFunction):
    """The JVM's ``PythonForeachBatchFunction`` calling ``fn(batch_id)``; the batch's
    DataFrame stays a Java reference that is never touched."""

    def __init__(self, session: Any, fn: Callable[[int], None]) -> None:
        super().__init__(session, fn)
        self.batch_fn = fn

    def call(self, jdf: Any, batch_id: int) -> None:
        try:
            self.batch_fn(int(batch_id))
        except Exception as exc:
            # Kept like PySpark's wrapper does (the query's failure carries the text).
            self.error = exc
            raise


def foreach_batch_id(writer: DataStreamWriter, fn: Callable[[int], None]) -> DataStreamWriter:
    """``writer.foreachBatch`` for a function of the batch id only (see the module doc).
    Registered through the same helper PySpark uses, so the JVM side is unchanged: the batch
    is committed after ``fn`` returns and fails the query when it raises."""
    from py4j.java_gateway import java_import
    from pyspark.java_gateway import ensure_callback_server_started

    session = writer._spark
    gateway = session.sparkContext._gateway
    if gateway is None:  # pragma: no cover - a classic session always has one
        raise RuntimeError("foreach_batch_id needs a classic (py4j) SparkSession")
    java_import(gateway.jvm, "org.apache.spark.sql.execution.streaming.sources.*")
    callback = BatchIdCallback(session, fn)
    gateway.jvm.PythonForeachBatchHelper.callForeachBatch(writer._jwrite, callback)
    ensure_callback_server_started(gateway)
    return writer

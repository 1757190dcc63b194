"""Row batches on the wire: Arrow IPC stream bytes, one self-contained stream per batch.

The encoded length is what a batch costs in flow-control credits. A batch larger than the
window could never be sent, so ``split_to_fit`` cuts it by rows until every piece fits; a
single row larger than the window is an error (raise the window).
"""

from __future__ import annotations

import pyarrow as pa

from shardex.errors import ErrorCode, ShardexError

__all__ = ["decode_batch", "encode_batch", "split_to_fit"]


def encode_batch(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batch(data: bytes) -> pa.RecordBatch:
    """One batch from IPC bytes; raises ``PROTOCOL_ERROR`` on anything else."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
    except (pa.ArrowInvalid, OSError) as e:
        raise ShardexError(
            f"undecodable row batch: {e}",
            code=ErrorCode.PROTOCOL_ERROR,
            details={"size": len(data)},
        ) from None
    if len(batches) != 1:
        raise ShardexError(
            f"a row batch must hold exactly one Arrow batch, got {len(batches)}",
            code=ErrorCode.PROTOCOL_ERROR,
            details={"size": len(data), "batches": len(batches)},
        )
    return batches[0]


def split_to_fit(batch: pa.RecordBatch, limit: int) -> list[bytes]:
    """``batch`` encoded as one or more IPC payloads of at most ``limit`` bytes each, in row
    order. Halves the batch until pieces fit (encoding is cheap next to sending)."""
    data = encode_batch(batch)
    if len(data) <= limit:
        return [data]
    if batch.num_rows <= 1:
        raise ShardexError(
            f"one row encodes to {len(data)} bytes, more than the credit window of {limit}",
            code=ErrorCode.BAD_REQUEST,
            details={"value": len(data), "window": limit, "hint": "raise the query's window"},
        )
    half = batch.num_rows // 2
    return split_to_fit(batch.slice(0, half), limit) + split_to_fit(batch.slice(half), limit)

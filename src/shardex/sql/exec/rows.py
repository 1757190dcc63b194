"""Rows between fragments: Arrow record batches of ONE binary column, each cell a msgpack row.

Why not typed Arrow columns: SQL++ rows are schemaless JSON whose fields differ from row to
row, and the executor must keep MISSING apart from NULL, exact integers apart from floats,
and carry partial aggregate states (exact ``Fraction`` sums, distinct-value sets). A msgpack
cell per row keeps every value exact with one codec for all row shapes, while the batch is
still an Arrow IPC payload whose byte length is the flow-control credit (the protocol's
unit). Extension types:

* 1: MISSING (never a JSON value; group keys and MIN/MAX states can be MISSING);
* 2: ``SumState`` of SUM/AVG (exact int sum, float sum as numerator/denominator text, count);
* 3: an integer beyond 64 bits (JSON allows any; msgpack does not), as decimal text;
* 4: ``SquaresState`` of VARIANCE/STDDEV (count, then the exact sums as decimal text).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from fractions import Fraction
from typing import Any, Final

import msgspec
import pyarrow as pa

from shardex.core.values import MISSING
from shardex.sql.operators.aggregate import SquaresState, SumState

__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "cell_chunks",
    "cells_batch",
    "decode_rows",
    "encode_row",
    "pack_state",
    "rows_of",
    "to_batches",
]

BATCH_ROWS: Final = 512
BATCH_BYTES: Final = 256 * 1024  # a batch is cut here even below BATCH_ROWS
SCHEMA: Final = pa.schema([pa.field("r", pa.binary())])

_EXT_MISSING, _EXT_SUM, _EXT_BIGINT, _EXT_SQUARES = 1, 2, 3, 4


def pack_state(state: Any) -> Any:
    """An aggregate state ready for ``encode_row``: msgspec would encode a ``SumState``
    (a dataclass) as a plain dict before any hook sees it, losing its type."""
    if isinstance(state, SumState):
        f = state.floats
        body = [str(state.ints), str(f.numerator), str(f.denominator), state.count]
        return msgspec.msgpack.Ext(_EXT_SUM, _plain.encode([*body, state.saw_float]))
    if isinstance(state, SquaresState):
        fs, sq = state.floats, state.float_squares
        exact = (state.ints, state.int_squares, fs.numerator, fs.denominator)
        parts = [*map(str, exact), str(sq.numerator), str(sq.denominator)]
        return msgspec.msgpack.Ext(_EXT_SQUARES, _plain.encode([state.count, *parts]))
    return state


def _enc_hook(obj: Any) -> Any:
    if obj is MISSING:
        return msgspec.msgpack.Ext(_EXT_MISSING, b"")
    if isinstance(obj, _BigInt):
        return msgspec.msgpack.Ext(_EXT_BIGINT, obj.text.encode())
    # msgspec's enc_hook protocol: NotImplementedError means "not encodable" and becomes the
    # encoder's TypeError naming the type (rows hold JSON values, MISSING and big ints only).
    raise NotImplementedError(f"cannot ship {type(obj).__name__} between fragments")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _EXT_MISSING:
        return MISSING
    if code == _EXT_SUM:
        ints, num, den, count, saw_float = _plain_dec.decode(data)
        return SumState(int(ints), Fraction(int(num), int(den)), count, saw_float)
    if code == _EXT_SQUARES:
        count, ints, int_sq, num, den, sq_num, sq_den = _plain_dec.decode(data)
        floats, squares = Fraction(int(num), int(den)), Fraction(int(sq_num), int(sq_den))
        return SquaresState(count, int(ints), int(int_sq), floats, squares)
    if code == _EXT_BIGINT:
        return int(bytes(data).decode())
    raise msgspec.DecodeError(f"unknown row extension {code}")


class _BigInt:
    __slots__ = ("text",)

    def __init__(self, v: int) -> None:
        self.text = str(v)


def _wrap_big(v: Any) -> Any:
    """``v`` with integers beyond 64 bits wrapped (only after an encode overflowed)."""
    if type(v) is int and not -(2**63) <= v < 2**64:
        return _BigInt(v)
    if isinstance(v, dict):
        return {k: _wrap_big(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_wrap_big(x) for x in v]
    return v


_plain = msgspec.msgpack.Encoder()
_plain_dec = msgspec.msgpack.Decoder()
_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def encode_row(row: Any) -> bytes:
    try:
        return _encoder.encode(row)
    except OverflowError:
        return _encoder.encode(_wrap_big(row))


def decode_row(data: bytes) -> Any:
    return _decoder.decode(data)


def cell_chunks(rows: Iterable[Any]) -> Iterator[list[bytes]]:
    """Rows encoded, in lists of at most ``BATCH_ROWS`` cells / about ``BATCH_BYTES`` bytes:
    what a pipeline run in-process hands on (no Arrow batch to build and take apart)."""
    cells: list[bytes] = []
    size = 0
    for row in rows:
        cell = encode_row(row)
        cells.append(cell)
        size += len(cell)
        if len(cells) >= BATCH_ROWS or size >= BATCH_BYTES:
            yield cells
            cells, size = [], 0
    if cells:
        yield cells


def to_batches(rows: Iterable[Any]) -> Iterator[pa.RecordBatch]:
    """Rows as batches of at most ``BATCH_ROWS`` rows / about ``BATCH_BYTES`` bytes."""
    for cells in cell_chunks(rows):
        yield cells_batch(cells)


def cells_batch(cells: list[bytes]) -> pa.RecordBatch:
    """Rows encoded already, as one batch."""
    return pa.RecordBatch.from_arrays([pa.array(cells, pa.binary())], schema=SCHEMA)


def decode_rows(batch: pa.RecordBatch) -> list[Any]:
    column = batch.column(0)
    return [_decoder.decode(cell) for cell in column.to_pylist()]


async def rows_of(batches: AsyncIterator[pa.RecordBatch]) -> AsyncIterator[Any]:
    """The rows of an input edge, one at a time."""
    async for batch in batches:
        for row in decode_rows(batch):
            yield row

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Plans a partial read of a row-major matrix: which byte ranges of the stored value make up
``matrix[rows, columns]``, so that a caller can fetch them with ranged reads
(``get_into_ranges``) instead of the whole value. Served as ``mooncake._partial_read``.
"""

from __future__ import annotations

import operator
import sys
from typing import NamedTuple


class MatrixReadPlan(NamedTuple):
    """``shape``: the (rows, columns) of the selection; ``nbytes``: its size in bytes;
    ``ranges``: ``(source_offset, destination_offset, size)`` byte ranges that, copied in any
    order, fill the C-ordered selection (``()`` when it is empty), or None when more than the
    caller's ``max_ranges`` would be needed (read the whole value instead)."""

    shape: tuple
    nbytes: int
    ranges: tuple | None


def _check_rows(rows, row_count: int) -> None:
    if isinstance(rows, range):
        if rows.step <= 0:
            raise ValueError("a range of rows must step forward")
        edges = (rows[0], rows[-1]) if rows else ()
    elif isinstance(rows, tuple):
        edges = tuple(operator.index(row) for row in rows)
    else:
        raise TypeError(f"rows must be a range or a tuple of ints, not {type(rows).__name__}")
    for row in edges:
        if not 0 <= row < row_count:
            raise IndexError(f"row {row} is outside [0, {row_count})")


def _merge(ranges: list, source: int, destination: int, size: int) -> None:
    """Appends a range, extending the last one when both sides continue it."""
    if ranges:
        last_source, last_destination, last_size = ranges[-1]
        if last_source + last_size == source and last_destination + last_size == destination:
            ranges[-1] = (last_source, last_destination, last_size + size)
            return
    ranges.append((source, destination, size))


def plan_matrix_read(shape, itemsize: int, rows, columns: slice,
                     max_ranges: int) -> MatrixReadPlan:
    """Plans reading ``matrix[list(rows), columns]`` from a C-ordered matrix of ``shape`` with
    elements of ``itemsize`` bytes.

    REQUIRES: ``shape`` has two dimensions (ValueError), ``rows`` is a range with a positive step
    or a tuple of ints (ValueError / TypeError), every row lies inside the matrix (IndexError,
    negative rows included), ``columns`` is a slice of step 1 or None (ValueError), and the
    matrix's size in bytes fits a Py_ssize_t (OverflowError).
    """
    if len(shape) != 2:
        raise ValueError(f"a matrix read needs a 2-d shape, not {tuple(shape)}")
    row_count, column_count = (operator.index(extent) for extent in shape)
    itemsize = operator.index(itemsize)
    if row_count < 0 or column_count < 0 or itemsize <= 0:
        raise ValueError("shape must be non-negative and itemsize positive")
    if not isinstance(columns, slice):
        raise TypeError(f"columns must be a slice, not {type(columns).__name__}")
    _check_rows(rows, row_count)
    first, stop, step = columns.indices(column_count)
    if step != 1:
        raise ValueError("only column slices of step 1 can be planned")

    row_bytes = column_count * itemsize
    width = max(0, stop - first)
    out_shape = (len(rows), width)
    piece = width * itemsize
    nbytes = out_shape[0] * piece
    if row_count * row_bytes > sys.maxsize or nbytes > sys.maxsize:
        raise OverflowError("the matrix is larger than this platform can address")
    if nbytes == 0:
        return MatrixReadPlan(out_shape, 0, ())

    ranges: list = []
    for position, row in enumerate(rows):
        _merge(ranges, operator.index(row) * row_bytes + first * itemsize, position * piece,
               piece)
        if len(ranges) > max_ranges:
            return MatrixReadPlan(out_shape, nbytes, None)
    return MatrixReadPlan(out_shape, nbytes, tuple(ranges))


__all__ = ["MatrixReadPlan", "plan_matrix_read"]

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Reads of a selection along one dimension of a stored tensor: Mooncake's
``get_tensor_dim_selection_into``, mixed into MooncakeDistributedStore, and the selection
arithmetic that ``mooncake.remote_tensor_batch`` shares with it.

A stored tensor here is raw C-ordered elements (``shape``, ``dtype``) starting ``data_offset``
bytes into a value. A selection is a list of operations applied in turn to the indices of one
dimension, each given as ``(op, value)``, ``{"op": op, "value": value}`` or an object with
``op`` and ``value`` attributes:

* ``("select_idxs", indices)``: integer indices (negative ones count from the end) or a boolean
  mask as long as the dimension;
* ``("slice", (start, stop, step))``: a Python slice;
* ``("repeat", (times, interleave))``: every index ``times`` times in a row (interleave), or the
  whole sequence ``times`` times over;
* ``("cat", groups)``: the concatenation of several selections (each a list of operations) of
  the current indices.

The read fetches only the selected bytes, as ranged reads of the value, coalescing neighbours.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Mapping

from ._errors import ErrorCode

_log = logging.getLogger("larder.compat.mooncake")

_INVALID = int(ErrorCode.INVALID_PARAMS)

# Element sizes by Mooncake's dtype names (torch's, without the "torch." prefix).
DTYPE_BYTE_SIZES = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8,
}


def normalize_dtype_name(dtype) -> str:
    """"torch.int64", torch.int64, numpy.dtype("int64") and "INT64" all become "int64"."""
    name = str(dtype).lower()
    return name[len("torch."):] if name.startswith("torch.") else name


def dtype_byte_size(dtype) -> int:
    """The size of one element of ``dtype`` (a name or a torch / numpy dtype). ValueError for a
    dtype Mooncake's selection reads do not know."""
    size = DTYPE_BYTE_SIZES.get(normalize_dtype_name(dtype))
    if size is None:
        itemsize = getattr(dtype, "itemsize", None)  # a torch or numpy dtype not in the table
        if isinstance(itemsize, int) and itemsize > 0:
            return itemsize
        raise ValueError(f"unsupported dtype {dtype!r}")
    return size


def tensor_nbytes(shape, dtype) -> int:
    """The size in bytes of a tensor of ``shape`` and ``dtype``; ValueError for a negative
    extent or an unknown dtype."""
    extents = [operator.index(extent) for extent in shape]
    if any(extent < 0 for extent in extents):
        raise ValueError(f"shape {tuple(extents)} has a negative extent")
    return math.prod(extents) * dtype_byte_size(dtype)


def normalize_indices(index) -> list:
    """A plain list of ints or bools from a list, a tuple, a scalar, or anything with
    ``tolist()`` (numpy arrays, torch tensors)."""
    if hasattr(index, "detach"):  # a torch tensor, possibly on a device
        index = index.detach().cpu()
    if hasattr(index, "tolist"):
        index = index.tolist()
    if isinstance(index, (bool, int)):
        return [index]
    return list(index)


def selection_parts(selection) -> tuple:
    """``(op, value)`` of one selection in any of its three forms."""
    if isinstance(selection, Mapping):
        return str(selection["op"]), selection["value"]
    if hasattr(selection, "op") and hasattr(selection, "value"):
        return selection.op, selection.value
    op, value = selection
    return str(op), value


def _is_mask(indices: list) -> bool:
    return bool(indices) and all(isinstance(index, bool) for index in indices)


def _repeat_args(value) -> tuple:
    times, interleave = value
    times = operator.index(times)
    if times < 0:
        raise ValueError(f"repeat count {times} is negative")
    return times, bool(interleave)


def selected_length(length: int, selections) -> int:
    """The extent of a dimension of ``length`` after ``selections``, computed without listing
    the indices. IndexError for a mask of the wrong length, ValueError for a bad operation."""
    for selection in selections:
        op, value = selection_parts(selection)
        if op == "select_idxs":
            indices = normalize_indices(value)
            if _is_mask(indices):
                if len(indices) != length:
                    raise IndexError(f"a mask of {len(indices)} entries on a dimension of "
                                     f"{length}")
                length = sum(indices)
            else:
                length = len(indices)
        elif op == "slice":
            length = len(range(length)[slice(*value)])
        elif op == "repeat":
            length *= _repeat_args(value)[0]
        elif op == "cat":
            length = sum(selected_length(length, group) for group in value)
        else:
            raise ValueError(f"unknown selection operation {op!r}")
    return length


def selected_indices(length: int, selections) -> list:
    """The source indices, in output order, that ``selections`` pick from a dimension of
    ``length``. IndexError for an index outside the dimension or a mask of the wrong length."""
    current = list(range(length))
    for selection in selections:
        op, value = selection_parts(selection)
        if op == "select_idxs":
            indices = normalize_indices(value)
            if _is_mask(indices):
                if len(indices) != len(current):
                    raise IndexError(f"a mask of {len(indices)} entries on a dimension of "
                                     f"{len(current)}")
                current = [source for source, keep in zip(current, indices) if keep]
            else:
                # Python's list indexing: negative indices count from the end, others raise.
                current = [current[operator.index(index)] for index in indices]
        elif op == "slice":
            current = current[slice(*value)]
        elif op == "repeat":
            times, interleave = _repeat_args(value)
            current = ([source for source in current for _ in range(times)] if interleave
                       else current * times)
        elif op == "cat":
            current = [source for group in value for source in selected_indices_of(current, group)]
        else:
            raise ValueError(f"unknown selection operation {op!r}")
    return current


def selected_indices_of(current: list, selections) -> list:
    """``selected_indices`` applied to an already selected list of source indices."""
    return [current[position] for position in selected_indices(len(current), selections)]


def selection_output_shape(shape, selections, dim: int = 0) -> tuple:
    """``shape`` with dimension ``dim`` (negative: from the end) replaced by its extent after
    ``selections``. ValueError for an empty shape or a dimension out of range."""
    extents = tuple(operator.index(extent) for extent in shape)
    if not extents:
        raise ValueError("a selection needs a tensor of at least one dimension")
    axis = _axis(dim, len(extents))
    return (*extents[:axis], selected_length(extents[axis], selections), *extents[axis + 1:])


def _axis(dim, ndim: int) -> int:
    axis = operator.index(dim)
    axis = axis + ndim if axis < 0 else axis
    if not 0 <= axis < ndim:
        raise ValueError(f"dimension {dim} is outside a tensor of {ndim} dimensions")
    return axis


def plan_dim_selection(shape, itemsize: int, dim: int, selections, data_offset: int = 0):
    """``(nbytes, fragments)`` for reading the selection: fragments are ``(source offset in the
    value, destination offset in the output, size)``, coalesced where both sides continue the
    previous one. Raises ValueError / IndexError / TypeError for bad arguments."""
    extents = [operator.index(extent) for extent in shape]
    if not extents or any(extent < 0 for extent in extents):
        raise ValueError(f"shape {tuple(extents)} is empty or has a negative extent")
    data_offset = operator.index(data_offset)
    if data_offset < 0:
        raise ValueError(f"data_offset {data_offset} is negative")
    axis = _axis(dim, len(extents))
    sources = selected_indices(extents[axis], selections)
    outer = math.prod(extents[:axis])
    block = math.prod(extents[axis + 1:]) * itemsize  # bytes of one index of the dimension
    nbytes = outer * len(sources) * block
    fragments: list = []
    if nbytes == 0:
        return 0, fragments
    for o in range(outer):
        source_base = data_offset + o * extents[axis] * block
        destination_base = o * len(sources) * block
        for position, source in enumerate(sources):
            source_at = source_base + source * block
            destination_at = destination_base + position * block
            if fragments:
                last_source, last_destination, last_size = fragments[-1]
                if (last_source + last_size == source_at
                        and last_destination + last_size == destination_at):
                    fragments[-1] = (last_source, last_destination, last_size + block)
                    continue
            fragments.append((source_at, destination_at, block))
    return nbytes, fragments


class TensorSelectionMethods:
    """``get_tensor_dim_selection_into``, mixed into MooncakeDistributedStore.

    REQUIRES: ``self`` provides ``get_into_ranges`` with Mooncake's return conventions.
    """

    def get_tensor_dim_selection_into(self, key, buffer_ptr, size, shape, dtype, dim,
                                      selections, data_offset=0) -> int:
        """Reads the elements that ``selections`` pick along dimension ``dim`` of the tensor
        stored as raw C-ordered elements of ``shape`` and ``dtype`` (a Mooncake dtype name) at
        byte ``data_offset`` of ``key``'s value, into registered memory at ``buffer_ptr``, in C
        order. Returns the bytes written (the selection's size; 0 for an empty one, without a
        read), or a negative code: INVALID_PARAMS for bad arguments or a ``size`` smaller than
        the selection, OBJECT_NOT_FOUND for a missing key, or the failed ranged read's code."""
        try:
            nbytes, fragments = plan_dim_selection(shape, dtype_byte_size(dtype), dim,
                                                   selections, data_offset)
            size = operator.index(size)
        except (TypeError, ValueError, IndexError, KeyError) as e:
            _log.warning("get_tensor_dim_selection_into %r: %s", key, e)
            return _INVALID
        if size < nbytes:
            _log.warning("get_tensor_dim_selection_into %r: the selection is %d bytes, the "
                         "buffer %r", key, nbytes, size)
            return _INVALID
        if nbytes == 0:
            return 0
        destinations = [[[fragment[1] for fragment in fragments]]]
        sources = [[[fragment[0] for fragment in fragments]]]
        sizes = [[[fragment[2] for fragment in fragments]]]
        results = self.get_into_ranges([buffer_ptr], [[key]], destinations, sources, sizes)
        codes = results[0][0] if results and results[0] else [_INVALID]
        for code, expected in zip(codes, sizes[0][0]):
            if code < 0:
                return code
            if code != expected:  # the value ends before the tensor does
                _log.warning("get_tensor_dim_selection_into %r: the value is shorter than "
                             "shape %s of %s at offset %d", key, list(shape), dtype, data_offset)
                return _INVALID
        return nbytes


__all__ = [
    "DTYPE_BYTE_SIZES",
    "TensorSelectionMethods",
    "dtype_byte_size",
    "normalize_dtype_name",
    "normalize_indices",
    "plan_dim_selection",
    "selected_indices",
    "selected_length",
    "selection_output_shape",
    "selection_parts",
    "tensor_nbytes",
]

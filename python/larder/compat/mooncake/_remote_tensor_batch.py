# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Remote tensor batches: Mooncake's ``mooncake.remote_tensor_batch``, served by Larder.

A RemoteTensorBatch names tensors already in the store (TensorFieldRef: key, shape, dtype, byte
offset in the value) and records, without reading anything, the selections a data pipeline
applies to their batch dimension (index / mask selection, slices, repeats, concatenation). A
RemoteTensorBatchMaterializer then reads each field's selection into memory through the store's
``get_tensor_dim_selection_into``, which fetches only the selected bytes.

All classes are immutable metadata except the buffer regions; none holds a store connection.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from ._tensor_selection import (
    DTYPE_BYTE_SIZES,
    dtype_byte_size,
    normalize_dtype_name,
    normalize_indices,
    selected_length,
    selection_output_shape,
    tensor_nbytes,
)

# The largest selection a materializer reads into one buffer (64 GiB), checked before allocating.
MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES = 64 * 1024 * 1024 * 1024


@dataclass(frozen=True)
class TensorFieldRef:
    """One stored tensor: raw C-ordered elements of ``shape`` and ``dtype`` (a Mooncake dtype
    name or a torch dtype) starting ``data_offset`` bytes into the value of ``key``."""

    key: str
    shape: tuple
    dtype: Any
    data_offset: int = 0

    @classmethod
    def from_tensor(cls, key: str, tensor, data_offset: int = 0) -> TensorFieldRef:
        """The reference for ``tensor`` (anything with ``shape`` and ``dtype``) stored under
        ``key``."""
        return cls(key, tuple(int(extent) for extent in tensor.shape),
                   normalize_dtype_name(tensor.dtype), data_offset)

    def nbytes(self) -> int:
        """The size of the whole stored tensor, in bytes."""
        return tensor_nbytes(self.shape, self.dtype)


@dataclass(frozen=True)
class TensorDimSelection:
    """One recorded operation on a dimension's indices (see ``_tensor_selection``): ``op`` is
    "select_idxs", "slice", "repeat" or "cat"; ``value`` its argument (for "cat", a tuple of
    groups, each a tuple of TensorDimSelection)."""

    op: str
    value: Any

    @staticmethod
    def select_idxs(index) -> TensorDimSelection:
        """Integer indices or a boolean mask (a list, a numpy array or a torch tensor)."""
        return TensorDimSelection("select_idxs", normalize_indices(index))

    @staticmethod
    def slice(start: Optional[int] = None, end: Optional[int] = None,
              step: Optional[int] = None) -> TensorDimSelection:
        """The Python slice ``start:end:step``."""
        return TensorDimSelection("slice", (start, end, step))

    @staticmethod
    def repeat(times: int = 2, interleave: bool = True) -> TensorDimSelection:
        """Every index ``times`` times in a row (``interleave``) or the whole run ``times``
        times over."""
        return TensorDimSelection("repeat", (times, interleave))

    @staticmethod
    def cat(selection_groups) -> TensorDimSelection:
        """The concatenation of several selections of the same indices."""
        return TensorDimSelection("cat", tuple(tuple(group) for group in selection_groups))

    def as_tuple(self) -> tuple:
        """``(op, value)`` as the store's ``get_tensor_dim_selection_into`` takes it (plain
        tuples all the way down for "cat")."""
        if self.op == "cat":
            return self.op, tuple(tuple(selection.as_tuple() for selection in group)
                                  for group in self.value)
        return self.op, self.value


@dataclass(frozen=True)
class TensorReadRequest:
    """One field to materialize: its reference, the dimension the selections apply to, and the
    selections in order. ``device`` is recorded for the caller; reads land in host memory."""

    name: str
    ref: TensorFieldRef
    dim: int = 0
    selections: tuple = ()
    device: Any = None

    def output_shape(self) -> tuple:
        """The shape of the materialized selection."""
        return selection_output_shape(self.ref.shape, self.selections, self.dim)

    def output_nbytes(self) -> int:
        """The size of the materialized selection, in bytes."""
        return tensor_nbytes(self.output_shape(), self.ref.dtype)

    def store_selections(self) -> list:
        """The selections as ``get_tensor_dim_selection_into`` takes them."""
        return [selection.as_tuple() for selection in self.selections]


@dataclass(frozen=True)
class RemoteTensorBatch:
    """Stored fields that share a batch dimension (``dim``) of ``batch_size`` rows after the
    recorded ``selections``. Every operation returns a new batch; nothing is read."""

    fields: Mapping
    batch_size: int
    dim: int = 0
    selections: tuple = ()
    device: Any = None

    def __len__(self) -> int:
        return self.batch_size

    def keys(self) -> list:
        """The field names, in insertion order."""
        return list(self.fields)

    def clone(self) -> RemoteTensorBatch:
        return replace(self, fields=dict(self.fields), selections=tuple(self.selections))

    def to(self, device) -> RemoteTensorBatch:
        """The same batch, to be materialized for ``device``."""
        return replace(self, device=device)

    def select_fields(self, fields: Optional[Sequence[str]]) -> RemoteTensorBatch:
        """Only the named fields (all of them for None); KeyError for an unknown name."""
        if fields is None:
            return self.clone()
        return replace(self, fields={name: self.fields[name] for name in fields})

    def select_indices(self, index) -> RemoteTensorBatch:
        """Rows picked by integer indices or a boolean mask (IndexError for a mask whose length
        is not the batch size)."""
        return self._then(TensorDimSelection.select_idxs(index))

    def slice(self, start: Optional[int], end: Optional[int],
              step: Optional[int]) -> RemoteTensorBatch:
        """Rows ``start:end:step``."""
        return self._then(TensorDimSelection.slice(start, end, step))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> RemoteTensorBatch:
        """Every row ``repeat_times`` times (ValueError when negative)."""
        if repeat_times < 0:
            raise ValueError(f"repeat_times {repeat_times} is negative")
        return self._then(TensorDimSelection.repeat(repeat_times, interleave))

    def union(self, rhs: RemoteTensorBatch) -> RemoteTensorBatch:
        """Both batches' fields; ValueError unless the batch metadata matches and no field name
        is in both."""
        if (self.batch_size, self.dim, tuple(self.selections)) != \
                (rhs.batch_size, rhs.dim, tuple(rhs.selections)):
            raise ValueError("union of remote batches with different sizes or selections")
        shared = sorted(set(self.fields) & set(rhs.fields))
        if shared:
            raise ValueError(f"union of remote batches that both have fields {shared}")
        return replace(self, fields={**self.fields, **rhs.fields})

    @staticmethod
    def cat(batches: Sequence[RemoteTensorBatch]) -> RemoteTensorBatch:
        """The rows of every batch in turn; they must have the same fields, dim and device
        (ValueError otherwise, or for no batches)."""
        if not batches:
            raise ValueError("cat of no remote batches")
        first = batches[0]
        for batch in batches[1:]:
            if (dict(batch.fields), batch.dim, batch.device) != \
                    (dict(first.fields), first.dim, first.device):
                raise ValueError("cat of remote batches with different fields, dim or device")
        group = TensorDimSelection.cat([batch.selections for batch in batches])
        return replace(first, batch_size=sum(len(batch) for batch in batches),
                       selections=(group,))

    def read_requests(self, fields: Optional[Sequence[str]] = None) -> list:
        """One TensorReadRequest per field named (all for None)."""
        names = self.keys() if fields is None else list(fields)
        return [TensorReadRequest(name, self.fields[name], self.dim, tuple(self.selections),
                                  self.device) for name in names]

    def _then(self, selection: TensorDimSelection) -> RemoteTensorBatch:
        return replace(self, batch_size=selected_length(self.batch_size, [selection]),
                       selections=(*self.selections, selection))


@dataclass
class WritableBufferRegion:
    """The address and size of a writable Python buffer, kept exported (so it can neither move
    nor be resized) until ``close``. ``buffer`` stays valid after ``close``."""

    buffer: Any
    view: memoryview
    c_buffer: Any
    ptr: int
    size: int
    closed: bool = False

    def close(self) -> None:
        """Releases the export; calling it again does nothing."""
        if self.closed:
            return
        self.c_buffer = None  # the ctypes array holds an export of the view: drop it first
        self.view.release()
        self.closed = True

    def __enter__(self) -> WritableBufferRegion:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def writable_buffer_region(buffer) -> WritableBufferRegion:
    """A region over ``buffer`` (anything exporting a writable C-contiguous buffer). ValueError
    for a read-only buffer; TypeError / ValueError from the buffer protocol otherwise."""
    source = memoryview(buffer)
    try:
        if source.readonly:
            raise ValueError("the buffer is read-only")
        view = source if source.format == "B" and source.ndim == 1 else source.cast("B")
    except BaseException:
        source.release()
        raise
    if view is not source:
        source.release()  # the cast view holds its own export
    try:
        c_buffer = (ctypes.c_ubyte * view.nbytes).from_buffer(view)
    except BaseException:
        view.release()
        raise
    return WritableBufferRegion(buffer, view, c_buffer, ctypes.addressof(c_buffer), view.nbytes)


class BytearrayBufferAllocator:
    """Allocates materializer output as bytearrays."""

    def allocate(self, size: int) -> WritableBufferRegion:
        return writable_buffer_region(bytearray(size))


def _checked_nbytes(request: TensorReadRequest) -> int:
    nbytes = request.output_nbytes()
    if nbytes > MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES:
        raise ValueError(f"field {request.name!r} selects {nbytes} bytes, more than "
                         f"{MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES}")
    return nbytes


class RemoteTensorBatchMaterializer:
    """Reads remote batches through ``store`` (a MooncakeDistributedStore, or anything with
    its ``register_buffer``, ``unregister_buffer`` and ``get_tensor_dim_selection_into``).
    Each read registers the output buffer for the duration of the call. Failures raise
    RuntimeError (a store code) or ValueError (a selection too large, a buffer too small)."""

    def __init__(self, store, buffer_allocator=None) -> None:
        self.store = store
        self.buffer_allocator = buffer_allocator or BytearrayBufferAllocator()

    def materialize_buffers(self, remote_batch: RemoteTensorBatch,
                            fields: Optional[Sequence[str]] = None) -> dict:
        """``{name: (buffer, shape, dtype)}`` for the named fields (all for None), each read
        into a buffer from the allocator. Sizes are checked before anything is allocated."""
        requests = remote_batch.read_requests(fields)
        sizes = [_checked_nbytes(request) for request in requests]
        regions: dict = {}
        try:
            for request, size in zip(requests, sizes):
                regions[request.name] = self.buffer_allocator.allocate(size)
            for request in requests:
                self.materialize_request_into_region(request, regions[request.name])
            return {request.name: (regions[request.name].buffer, request.output_shape(),
                                   request.ref.dtype) for request in requests}
        finally:
            for region in regions.values():
                region.close()

    def materialize_requests_into(self, requests, buffers: Mapping) -> dict:
        """Reads each request into ``buffers[request.name]``; ``{name: bytes read}``."""
        return {request.name: self.materialize_request_into(request, buffers[request.name])
                for request in requests}

    def materialize_request_into(self, request: TensorReadRequest, buffer) -> int:
        """Reads one request into a writable buffer; returns the bytes read."""
        with writable_buffer_region(buffer) as region:
            return self.materialize_request_into_region(request, region)

    def materialize_request_into_region(self, request: TensorReadRequest,
                                        region: WritableBufferRegion) -> int:
        """Reads one request into the start of ``region``; returns the bytes read (0, without
        calling the store, for an empty selection)."""
        nbytes = _checked_nbytes(request)
        if region.size < nbytes:
            raise ValueError(f"field {request.name!r} needs {nbytes} bytes, the buffer has "
                             f"{region.size}")
        if nbytes == 0:
            return 0
        code = self.store.register_buffer(region.ptr, region.size)
        if code != 0:
            raise RuntimeError(f"register_buffer failed: {code}")
        failed = True
        try:
            read = self.store.get_tensor_dim_selection_into(
                request.ref.key, region.ptr, nbytes, list(request.ref.shape),
                normalize_dtype_name(request.ref.dtype), request.dim,
                request.store_selections(), request.ref.data_offset)
            if read < 0:
                raise RuntimeError(f"get_tensor_dim_selection_into {request.ref.key!r} "
                                   f"failed: {read}")
            failed = False
            return int(read)
        finally:
            code = self.store.unregister_buffer(region.ptr)
            if code != 0 and not failed:
                raise RuntimeError(f"unregister_buffer failed: {code}")


__all__ = [
    "BytearrayBufferAllocator",
    "DTYPE_BYTE_SIZES",
    "MAX_TENSOR_DIM_SELECTION_OUTPUT_BYTES",
    "RemoteTensorBatch",
    "RemoteTensorBatchMaterializer",
    "TensorDimSelection",
    "TensorFieldRef",
    "TensorReadRequest",
    "WritableBufferRegion",
    "dtype_byte_size",
    "normalize_dtype_name",
    "normalize_indices",
    "selection_output_shape",
    "tensor_nbytes",
    "writable_buffer_region",
]

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake's tensor objects: the 304-byte TensorMetadata format and the ``*_tensor`` methods.

An object is ``[TensorMetadata (304 bytes)][the tensor's bytes, C order]``, little-endian, as
Mooncake's ``integration_utils.h`` lays it out:

* TensorObjectHeader (40 B): u32 magic 0x4d4f4f4e, u16 version 1, u16 header_size 304, i32 dtype,
  i32 ndim (0..8), u32 layout_kind (0 FULL, 1 SHARD), u32 reserved 0, u64 data_offset 304,
  u64 data_bytes.
* TensorLayoutMetadata (264 B): i64 global_shape[8], i64 local_shape[8] (unused dims -1),
  u32 axis_count (<= 4), u32 reserved, 4 LayoutAxis of 32 B {i32 kind (DP 0, TP 1, EP 2, PP 3),
  i32 axis_index, i32 shard_rank, i32 shard_count, i32 split_dim (-1: none), i32 reserved0,
  i64 reserved1 (the shard's extent along split_dim)}.

A TP shard of ``key`` is stored under ``f"{key}_tp_{rank}"`` with layout SHARD and one TP axis.
torch is imported only when a tensor is made or read, so this module loads without it.

A tensor with a zero-size dimension (no elements) is stored as its metadata alone (data_bytes 0)
and reads back with its shape, as in Mooncake.

Where this differs from Mooncake: a CUDA tensor is refused (INVALID_PARAMS) instead of being read
through its device pointer, and a 0-d tensor reads back as 0-d (Mooncake returns shape (1,)).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import math
import struct
from typing import NamedTuple

from ._errors import ErrorCode

_log = logging.getLogger("larder.compat.mooncake")

TENSOR_MAGIC = 0x4D4F4F4E
TENSOR_VERSION = 1
TENSOR_METADATA_SIZE = 304
MAX_TENSOR_DIMS = 8
MAX_LAYOUT_AXES = 4

# magic, version, header_size, dtype, ndim, layout_kind, reserved_flags, data_offset, data_bytes
_HEADER = struct.Struct("<IHHiiIIQQ")
# global_shape[8], local_shape[8], axis_count, reserved0
_LAYOUT = struct.Struct("<8q8qII")
# kind, axis_index, shard_rank, shard_count, split_dim, reserved0, reserved1
_AXIS = struct.Struct("<6iq")
_LAYOUT_OFFSET = _HEADER.size
_AXES_OFFSET = _LAYOUT_OFFSET + _LAYOUT.size
assert _AXES_OFFSET + MAX_LAYOUT_AXES * _AXIS.size == TENSOR_METADATA_SIZE

_INVALID = int(ErrorCode.INVALID_PARAMS)


class TensorDtype(enum.IntEnum):
    """Mooncake's dtype codes."""

    FLOAT32 = 0
    FLOAT64 = 1
    INT8 = 2
    UINT8 = 3
    INT16 = 4
    UINT16 = 5
    INT32 = 6
    UINT32 = 7
    INT64 = 8
    UINT64 = 9
    BOOL = 10
    FLOAT16 = 11
    BFLOAT16 = 12
    FLOAT8_E4M3 = 13
    FLOAT8_E5M2 = 14


# Per code: element size and torch's name. A dtype this torch lacks cannot be written or read.
_DTYPE_INFO = {
    TensorDtype.FLOAT32: (4, "float32"),
    TensorDtype.FLOAT64: (8, "float64"),
    TensorDtype.INT8: (1, "int8"),
    TensorDtype.UINT8: (1, "uint8"),
    TensorDtype.INT16: (2, "int16"),
    TensorDtype.UINT16: (2, "uint16"),
    TensorDtype.INT32: (4, "int32"),
    TensorDtype.UINT32: (4, "uint32"),
    TensorDtype.INT64: (8, "int64"),
    TensorDtype.UINT64: (8, "uint64"),
    TensorDtype.BOOL: (1, "bool"),
    TensorDtype.FLOAT16: (2, "float16"),
    TensorDtype.BFLOAT16: (2, "bfloat16"),
    TensorDtype.FLOAT8_E4M3: (1, "float8_e4m3fn"),
    TensorDtype.FLOAT8_E5M2: (1, "float8_e5m2"),
}


class LayoutKind(enum.IntEnum):
    """TensorObjectHeader.layout_kind."""

    FULL = 0
    SHARD = 1


class AxisKind(enum.IntEnum):
    """LayoutAxis.kind."""

    DP = 0
    TP = 1
    EP = 2
    PP = 3
    RESERVED = 4


class LayoutAxis(NamedTuple):
    """One LayoutAxis record."""

    kind: int
    axis_index: int
    shard_rank: int
    shard_count: int
    split_dim: int
    reserved0: int = 0
    reserved1: int = 0


class TensorMetadata(NamedTuple):
    """A validated TensorMetadata. Shapes have ``ndim`` entries; ``axes`` has ``axis_count``."""

    dtype: int
    ndim: int
    layout_kind: int
    data_offset: int
    data_bytes: int
    global_shape: tuple
    local_shape: tuple
    axes: tuple


class TpShard(NamedTuple):
    """Marks a serialized tensor as shard ``rank`` of ``size`` along ``split_dim`` of a tensor
    shaped ``global_shape``."""

    rank: int
    size: int
    split_dim: int
    global_shape: tuple


def tensor_metadata_size() -> int:
    """sizeof(TensorMetadata): 304."""
    return TENSOR_METADATA_SIZE


def _torch():
    import torch

    return torch


_codes_by_dtype: dict | None = None


def _dtype_code(dtype) -> int:
    global _codes_by_dtype
    if _codes_by_dtype is None:
        torch = _torch()
        _codes_by_dtype = {getattr(torch, name): int(code)
                           for code, (_, name) in _DTYPE_INFO.items() if hasattr(torch, name)}
    code = _codes_by_dtype.get(dtype)
    if code is None:
        raise ValueError(f"dtype {dtype} has no Mooncake tensor code")
    return code


def _torch_dtype(code: int):
    name = _DTYPE_INFO[TensorDtype(code)][1]
    dtype = getattr(_torch(), name, None)
    if dtype is None:
        raise ValueError(f"dtype {TensorDtype(code).name} is not supported by this torch")
    return dtype


def _byte_view(buffer) -> memoryview:
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise ValueError("a tensor object must be a contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _memory_at(ptr, size) -> memoryview:
    if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0:
        raise ValueError(f"buffer pointer {ptr!r} is not a non-null address")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"size {size!r} is not a byte count")
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


def _padded(dims) -> list:
    return list(dims) + [-1] * (MAX_TENSOR_DIMS - len(dims))


def _pack_metadata(dtype: int, global_shape, local_shape, layout_kind: int, axes,
                   data_bytes: int) -> bytes:
    out = bytearray(TENSOR_METADATA_SIZE)
    _HEADER.pack_into(out, 0, TENSOR_MAGIC, TENSOR_VERSION, TENSOR_METADATA_SIZE, dtype,
                      len(global_shape), layout_kind, 0, TENSOR_METADATA_SIZE, data_bytes)
    _LAYOUT.pack_into(out, _LAYOUT_OFFSET, *_padded(global_shape), *_padded(local_shape),
                      len(axes), 0)
    for i, axis in enumerate(axes):
        _AXIS.pack_into(out, _AXES_OFFSET + i * _AXIS.size, *axis)
    return bytes(out)


def serialize_tensor(tensor, *, shard: TpShard | None = None) -> tuple[bytes, memoryview]:
    """Encodes a CPU tensor as ``(metadata, data)``: 304 bytes of TensorMetadata and a
    memoryview of the tensor's bytes (its contiguous form; it aliases ``tensor`` when that is
    already contiguous). With ``shard``, ``tensor`` is that shard and the layout is SHARD.

    Raises TypeError for a non-tensor, ValueError for a CUDA or sparse tensor, a dtype without a
    Mooncake code, more than 8 dims, or a shard that does not fit.
    """
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"host memory only: the tensor is on {tensor.device}")
    if tensor.layout != torch.strided:
        raise ValueError(f"dense tensors only, not {tensor.layout}")
    dtype = _dtype_code(tensor.dtype)
    local_shape = tuple(int(d) for d in tensor.shape)
    if len(local_shape) > MAX_TENSOR_DIMS:
        raise ValueError(f"{len(local_shape)} dims; Mooncake's format holds at most 8")
    if shard is None:
        global_shape, layout_kind, axes = local_shape, LayoutKind.FULL, ()
    else:
        global_shape = tuple(int(d) for d in shard.global_shape)
        split_dim = shard.split_dim
        if not 0 <= shard.rank < shard.size:
            raise ValueError(f"shard rank {shard.rank} is not in [0, {shard.size})")
        if len(global_shape) != len(local_shape) or not 0 <= split_dim < len(local_shape):
            raise ValueError(f"split_dim {split_dim} does not fit shapes {global_shape} and "
                             f"{local_shape}")
        if any(g != s for i, (g, s) in enumerate(zip(global_shape, local_shape))
               if i != split_dim):
            raise ValueError(f"shard shape {local_shape} differs from {global_shape} off "
                             f"split_dim {split_dim}")
        layout_kind = LayoutKind.SHARD
        axes = (LayoutAxis(AxisKind.TP, 0, shard.rank, shard.size, split_dim, 0,
                           local_shape[split_dim]),)
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    data = memoryview(flat.numpy())
    header = _pack_metadata(dtype, global_shape, local_shape, layout_kind, axes, len(data))
    return header, data


def parse_tensor_metadata(buffer) -> TensorMetadata:
    """Reads and validates the TensorMetadata at the start of a whole tensor object ``buffer``
    (any contiguous buffer). Raises ValueError naming the first field that is wrong."""
    view = _byte_view(buffer)
    total = len(view)
    if total < TENSOR_METADATA_SIZE:
        raise ValueError(f"tensor object is {total} bytes, shorter than its "
                         f"{TENSOR_METADATA_SIZE}-byte metadata")
    (magic, version, header_size, dtype, ndim, layout_kind, _flags, data_offset,
     data_bytes) = _HEADER.unpack_from(view, 0)
    if magic != TENSOR_MAGIC:
        raise ValueError(f"magic 0x{magic:08x} is not 0x{TENSOR_MAGIC:08x}: not a tensor object")
    if version != TENSOR_VERSION:
        raise ValueError(f"tensor object version {version}; only {TENSOR_VERSION} is known")
    if header_size != TENSOR_METADATA_SIZE:
        raise ValueError(f"header_size {header_size} is not {TENSOR_METADATA_SIZE}")
    if not 0 <= dtype < len(TensorDtype):
        raise ValueError(f"dtype code {dtype} is unknown")
    if not 0 <= ndim <= MAX_TENSOR_DIMS:
        raise ValueError(f"ndim {ndim} is not in [0, {MAX_TENSOR_DIMS}]")
    layout = _LAYOUT.unpack_from(view, _LAYOUT_OFFSET)
    global_dims, local_dims, axis_count = layout[0:8], layout[8:16], layout[16]
    if axis_count > MAX_LAYOUT_AXES:
        raise ValueError(f"axis_count {axis_count} exceeds {MAX_LAYOUT_AXES}")
    if layout_kind > LayoutKind.SHARD:
        raise ValueError(f"layout_kind {layout_kind} is neither FULL (0) nor SHARD (1)")
    if not TENSOR_METADATA_SIZE <= data_offset <= total:
        raise ValueError(f"data_offset {data_offset} is not in [{TENSOR_METADATA_SIZE}, {total}]")
    if data_bytes != total - data_offset:
        raise ValueError(f"data_bytes {data_bytes} but {total - data_offset} bytes follow the "
                         "metadata")
    for i in range(ndim):
        if global_dims[i] < 0 or local_dims[i] < 0:
            raise ValueError(f"dim {i}: global {global_dims[i]} and local {local_dims[i]} must "
                             "be >= 0")
    for i in range(ndim, MAX_TENSOR_DIMS):
        if global_dims[i] != -1 or local_dims[i] != -1:
            raise ValueError(f"unused dim {i} is global {global_dims[i]}, local "
                             f"{local_dims[i]}; both must be -1")
    axes = tuple(LayoutAxis(*_AXIS.unpack_from(view, _AXES_OFFSET + i * _AXIS.size))
                 for i in range(axis_count))
    for i, axis in enumerate(axes):
        if not AxisKind.DP <= axis.kind <= AxisKind.RESERVED:
            raise ValueError(f"axis {i}: kind {axis.kind} is unknown")
        if axis.shard_count <= 0 or not 0 <= axis.shard_rank < axis.shard_count:
            raise ValueError(f"axis {i}: shard {axis.shard_rank} of {axis.shard_count}")
        if not -1 <= axis.split_dim < ndim:
            raise ValueError(f"axis {i}: split_dim {axis.split_dim} is not in [-1, {ndim})")
    local_shape = tuple(local_dims[:ndim])
    expected = math.prod(local_shape) * _DTYPE_INFO[TensorDtype(dtype)][0]
    if data_bytes != expected:
        raise ValueError(f"data_bytes {data_bytes} does not match shape {local_shape} of "
                         f"{TensorDtype(dtype).name} ({expected} bytes)")
    return TensorMetadata(dtype, ndim, layout_kind, data_offset, data_bytes,
                          tuple(global_dims[:ndim]), local_shape, axes)


def _to_tensor(view: memoryview, meta: TensorMetadata, copy: bool):
    torch = _torch()
    dtype = _torch_dtype(meta.dtype)
    if meta.data_bytes == 0:
        return torch.empty(meta.local_shape, dtype=dtype)
    data = view[meta.data_offset:meta.data_offset + meta.data_bytes]
    if copy:
        data = bytearray(data)
    elif data.readonly:
        raise ValueError("copy=False needs a writable buffer")
    return torch.frombuffer(data, dtype=dtype).reshape(meta.local_shape)


def deserialize_tensor(buffer, *, copy: bool = True):
    """Decodes a whole tensor object (metadata and data) into a CPU tensor shaped like its local
    shape. ``copy=False`` returns a tensor aliasing ``buffer``, which must be writable and
    outlive it. Raises ValueError when the metadata is invalid or torch lacks the dtype."""
    view = _byte_view(buffer)
    return _to_tensor(view, parse_tensor_metadata(view), copy)


def _shard_range(dim_size: int, rank: int, count: int) -> tuple:
    """Mooncake's calculate_shard_range: torch.chunk's split, padded with empty shards."""
    chunk = -(-dim_size // count)
    start = rank * chunk
    if start >= dim_size:
        return dim_size, 0
    return start, min(chunk, dim_size - start)


def _tp_shards(tensor, tp_size: int, split_dim: int) -> list:
    """All ``tp_size`` shards of ``tensor`` along ``split_dim``, as Mooncake splits them."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if not 0 <= split_dim < tensor.dim():
        raise ValueError(f"split_dim {split_dim} is not in [0, {tensor.dim()})")
    dim_size = tensor.shape[split_dim]
    return [tensor.narrow(split_dim, *_shard_range(dim_size, rank, tp_size))
            for rank in range(tp_size)]


def _tp_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


def _objects(key: str, tensor, tp_size: int = 1, split_dim: int = 0) -> list:
    """(object key, [metadata, data]) for ``tensor``: itself under ``key`` when tp_size <= 1, else
    every TP shard under ``key_tp_<rank>``."""
    if tp_size <= 1:
        return [(key, list(serialize_tensor(tensor)))]
    shards = _tp_shards(tensor, tp_size, split_dim)
    global_shape = tuple(tensor.shape)
    return [(_tp_key(key, rank),
             list(serialize_tensor(shard, shard=TpShard(rank, tp_size, split_dim, global_shape))))
            for rank, shard in enumerate(shards)]


def _holds_tp_shard(meta: TensorMetadata, tp_rank: int) -> bool:
    return meta.layout_kind == LayoutKind.SHARD and any(
        axis.kind == AxisKind.TP and axis.shard_rank == tp_rank for axis in meta.axes)


def _refuse(what: str, error: BaseException) -> int:
    _log.warning("%s: %s", what, error)
    return _INVALID


class TensorMethods:
    """Mooncake's ``*_tensor`` methods, mixed into MooncakeDistributedStore.

    Writes return 0 or a negative Mooncake code (INVALID_PARAMS for a non-tensor, an unsupported
    dtype or shape, or a bad buffer); batch writes return one code per key, and all
    INVALID_PARAMS when the lists' lengths differ. Reads return a CPU tensor, or None for a
    missing key or an invalid object; batch reads return a list. Before setup and after close,
    writes return INVALID_PARAMS and reads None (batch_get_tensor_into: INVALID_PARAMS per key,
    as in Mooncake). ``tp_rank`` is ignored by writes: they store every shard.

    REQUIRES: ``self`` provides ``_not_ready``, ``_batch_put_parts``, ``put_from``,
    ``upsert_from``, ``batch_put_from``, ``batch_upsert_from``, ``batch_get_buffer`` and
    ``batch_get_into`` with Mooncake's return conventions.
    """

    # ---- writes from tensors ----

    def put_tensor(self, key, tensor) -> int:
        """Stores ``tensor`` under ``key``."""
        return self._write_tensors("put_tensor", [key], [tensor], None, False)[0]

    def pub_tensor(self, key, tensor, config=None) -> int:
        """put_tensor with a ReplicateConfig."""
        return self._write_tensors("pub_tensor", [key], [tensor], config, False)[0]

    def upsert_tensor(self, key, tensor) -> int:
        """put_tensor that replaces an existing value."""
        return self._write_tensors("upsert_tensor", [key], [tensor], None, True)[0]

    def upsert_pub_tensor(self, key, tensor, config=None) -> int:
        """upsert_tensor with a ReplicateConfig."""
        return self._write_tensors("upsert_pub_tensor", [key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys, tensors_list) -> list:
        """put_tensor for every pair, in one batch."""
        return self._write_tensors("batch_put_tensor", keys, tensors_list, None, False)

    def batch_pub_tensor(self, keys, tensors_list, config=None) -> list:
        """batch_put_tensor with a ReplicateConfig."""
        return self._write_tensors("batch_pub_tensor", keys, tensors_list, config, False)

    def batch_upsert_tensor(self, keys, tensors_list) -> list:
        """upsert_tensor for every pair, in one batch."""
        return self._write_tensors("batch_upsert_tensor", keys, tensors_list, None, True)

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None) -> list:
        """batch_upsert_tensor with a ReplicateConfig."""
        return self._write_tensors("batch_upsert_pub_tensor", keys, tensors_list, config, True)

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0) -> int:
        """Stores all ``tp_size`` shards of ``tensor`` along ``split_dim`` under
        ``key_tp_<rank>`` (the tensor itself under ``key`` when tp_size <= 1). Returns 0 or the
        first shard's failure."""
        return self._write_tensors("put_tensor_with_tp", [key], [tensor], None, False,
                                   tp_size, split_dim)[0]

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1,
                           split_dim=0) -> int:
        """put_tensor_with_tp with a ReplicateConfig."""
        return self._write_tensors("pub_tensor_with_tp", [key], [tensor], config, False,
                                   tp_size, split_dim)[0]

    def upsert_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0) -> int:
        """put_tensor_with_tp that replaces existing shards."""
        return self._write_tensors("upsert_tensor_with_tp", [key], [tensor], None, True,
                                   tp_size, split_dim)[0]

    def upsert_pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1,
                                  split_dim=0) -> int:
        """upsert_tensor_with_tp with a ReplicateConfig."""
        return self._write_tensors("upsert_pub_tensor_with_tp", [key], [tensor], config, True,
                                   tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0) -> list:
        """put_tensor_with_tp for every pair, in one batch."""
        return self._write_tensors("batch_put_tensor_with_tp", base_keys, tensors_list, None,
                                   False, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0) -> list:
        """batch_put_tensor_with_tp with a ReplicateConfig."""
        return self._write_tensors("batch_pub_tensor_with_tp", base_keys, tensors_list, config,
                                   False, tp_size, split_dim)

    def batch_upsert_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                    split_dim=0) -> list:
        """upsert_tensor_with_tp for every pair, in one batch."""
        return self._write_tensors("batch_upsert_tensor_with_tp", base_keys, tensors_list, None,
                                   True, tp_size, split_dim)

    def batch_upsert_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                        tp_size=1, split_dim=0) -> list:
        """batch_upsert_tensor_with_tp with a ReplicateConfig."""
        return self._write_tensors("batch_upsert_pub_tensor_with_tp", base_keys, tensors_list,
                                   config, True, tp_size, split_dim)

    # ---- writes from serialized buffers ----

    def put_tensor_from(self, key, buffer_ptr, size) -> int:
        """Stores the tensor object (metadata and data, ``size`` > 304 bytes) at ``buffer_ptr``
        (inside a registered buffer) as is, after validating its metadata."""
        return self._write_object("put_tensor_from", key, buffer_ptr, size, False)

    def upsert_tensor_from(self, key, buffer_ptr, size) -> int:
        """put_tensor_from that replaces an existing value."""
        return self._write_object("upsert_tensor_from", key, buffer_ptr, size, True)

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes) -> list:
        """put_tensor_from for every key, in one batch. One invalid buffer fails them all."""
        return self._write_objects("batch_put_tensor_from", keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes) -> list:
        """upsert_tensor_from for every key, in one batch. One invalid buffer fails them all."""
        return self._write_objects("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, True)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0) -> int:
        """Decodes the tensor object at ``buffer_ptr`` and stores it as put_tensor_with_tp does
        (as is, when tp_size <= 1)."""
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size,
                                                  split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0) -> list:
        """put_tensor_with_tp_from for every key, in one batch; an invalid buffer fails only
        its key."""
        what = "batch_put_tensor_with_tp_from"
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        if self._not_ready() or len(buffer_ptrs) != len(base_keys) or len(sizes) != len(
                base_keys):
            return [_INVALID] * len(base_keys)
        tensors = []
        for ptr, size in zip(buffer_ptrs, sizes):
            try:
                tensors.append(deserialize_tensor(_object_at(ptr, size), copy=False))
            except ValueError as e:
                _refuse(what, e)
                tensors.append(None)
        return self._write_tensors(what, base_keys, tensors, None, False, tp_size, split_dim)

    # ---- reads ----

    def get_tensor(self, key):
        """The tensor stored under ``key``, or None."""
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys) -> list:
        """get_tensor for every key, in one batch."""
        return self._read_tensors("batch_get_tensor", list(keys), None)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """Shard ``tp_rank`` of ``key`` (``key`` itself when tp_size <= 1), or None when it is
        missing or is not that TP shard."""
        return self.batch_get_tensor_with_tp([key], tp_rank, tp_size)[0]

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1) -> list:
        """get_tensor_with_tp for every key, in one batch."""
        keys = [_tp_key(k, tp_rank) for k in base_keys] if tp_size > 1 else list(base_keys)
        return self._read_tensors("batch_get_tensor_with_tp", keys,
                                  tp_rank if tp_size > 1 else None)

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads the tensor object into [buffer_ptr, buffer_ptr + size) (inside a registered
        buffer) and returns a tensor aliasing it at offset 304, or None."""
        if self._not_ready():
            return None
        return self._read_into("get_tensor_into", [key], [buffer_ptr], [size], None)[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes) -> list:
        """get_tensor_into for every key, in one batch. As in Mooncake, a list of
        INVALID_PARAMS (not None) before setup or when the lists' lengths differ."""
        if self._not_ready() or len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [_INVALID] * len(keys)
        return self._read_into("batch_get_tensor_into", list(keys), buffer_ptrs, sizes, None)

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        """get_tensor_into for shard ``tp_rank`` (``key`` itself when tp_size <= 1)."""
        return self.batch_get_tensor_with_tp_into([key], [buffer_ptr], [size], tp_rank,
                                                  tp_size)[0]

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0) -> list:
        """get_tensor_with_tp_into for every key, in one batch; a list of None before setup or
        when the lists' lengths differ."""
        if self._not_ready() or len(buffer_ptrs) != len(base_keys) or len(sizes) != len(
                base_keys):
            return [None] * len(base_keys)
        keys = [_tp_key(k, tp_rank) for k in base_keys] if tp_size > 1 else list(base_keys)
        return self._read_into("batch_get_tensor_with_tp_into", keys, buffer_ptrs, sizes,
                               tp_rank if tp_size > 1 else None)

    # ---- shared paths ----

    def _write_tensors(self, what, keys, tensors, config, upsert, tp_size=1,
                       split_dim=0) -> list:
        """Serializes every tensor (or its TP shards) and writes all objects in one
        _batch_put_parts; a key's result is its first failing object's code, else 0."""
        if self._not_ready() or len(tensors) != len(keys):
            return [_INVALID] * len(keys)
        results = [_INVALID] * len(keys)
        spans, object_keys, object_parts = [], [], []
        for i, (key, tensor) in enumerate(zip(keys, tensors)):
            try:
                objects = _objects(key, tensor, tp_size, split_dim)
            except (TypeError, ValueError) as e:
                _refuse(f"{what} key {key!r}", e)
                continue
            spans.append((i, len(object_keys), len(objects)))
            object_keys += [k for k, _ in objects]
            object_parts += [p for _, p in objects]
        if not object_keys:
            return results
        codes = self._batch_put_parts(object_keys, object_parts, config, upsert)
        for i, start, count in spans:
            results[i] = next((c for c in codes[start:start + count] if c != 0), 0)
        return results

    def _write_object(self, what, key, buffer_ptr, size, upsert) -> int:
        if self._not_ready():
            return _INVALID
        try:
            _object_at(buffer_ptr, size)
        except ValueError as e:
            return _refuse(what, e)
        write = self.upsert_from if upsert else self.put_from
        return write(key, buffer_ptr, size)

    def _write_objects(self, what, keys, buffer_ptrs, sizes, upsert) -> list:
        if self._not_ready() or len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [_INVALID] * len(keys)
        if not keys:
            return []
        try:
            for ptr, size in zip(buffer_ptrs, sizes):
                _object_at(ptr, size)
        except ValueError as e:
            _refuse(what, e)
            return [_INVALID] * len(keys)
        write = self.batch_upsert_from if upsert else self.batch_put_from
        return write(list(keys), list(buffer_ptrs), list(sizes))

    def _read_tensors(self, what, keys, tp_rank) -> list:
        if self._not_ready():
            return [None] * len(keys)
        if not keys:
            return []
        return [_decode(what, key, buffer, tp_rank, copy=True)
                for key, buffer in zip(keys, self.batch_get_buffer(keys))]

    def _read_into(self, what, keys, buffer_ptrs, sizes, tp_rank) -> list:
        if not keys:
            return []
        lengths = self.batch_get_into(keys, list(buffer_ptrs), list(sizes))
        results = []
        for key, ptr, size, length in zip(keys, buffer_ptrs, sizes, lengths):
            if length < 0 or length > size:
                results.append(None)
                continue
            try:
                view = _memory_at(ptr, length)
            except ValueError as e:
                _refuse(what, e)
                results.append(None)
                continue
            results.append(_decode(what, key, view, tp_rank, copy=False))
        return results


def _object_at(ptr, size) -> memoryview:
    """The tensor object at [ptr, ptr + size), its metadata validated. Raises ValueError."""
    if isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= TENSOR_METADATA_SIZE:
        raise ValueError(f"size {size} must exceed the {TENSOR_METADATA_SIZE}-byte metadata")
    view = _memory_at(ptr, size)
    parse_tensor_metadata(view)
    return view


def _decode(what, key, buffer, tp_rank, copy):
    """The tensor in ``buffer`` (None: a miss), or None when it is invalid or, with
    ``tp_rank``, not that TP shard."""
    if buffer is None:
        return None
    try:
        view = _byte_view(buffer)
        meta = parse_tensor_metadata(view)
        if tp_rank is not None and not _holds_tp_shard(meta, tp_rank):
            raise ValueError(f"not TP shard {tp_rank}")
        return _to_tensor(view, meta, copy)
    except (TypeError, ValueError) as e:
        _log.warning("%s key %r: %s", what, key, e)
        return None

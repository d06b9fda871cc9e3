# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The safetensors file format, written and read without the ``safetensors`` package.

A file is ``[u64 little-endian N][N bytes of JSON header][data]``. The header maps each tensor's
name to ``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` (offsets relative to
the start of the data, in the order the tensors were given, without gaps) and may hold a
``"__metadata__"`` map of strings. The header is padded with spaces to a multiple of 8 bytes, so
that the data starts aligned. Tensors are stored C-contiguous, little-endian: the byte order of
every host this module runs on (it refuses to load on another).
"""

from __future__ import annotations

import json
import math
import struct
import sys

if sys.byteorder != "little":
    raise ImportError("the safetensors codec needs a little-endian host")

_LENGTH = struct.Struct("<Q")
_METADATA = "__metadata__"
# A header larger than this is refused as corrupt (the safetensors package's own limit).
_MAX_HEADER_BYTES = 100 * 1024 * 1024

# torch dtype name -> (safetensors code, element size)
_CODES = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e5m2": ("F8_E5M2", 1),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint64": ("U64", 8),
    "uint32": ("U32", 4),
    "uint16": ("U16", 2),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}
_NAMES = {code: (name, size) for name, (code, size) in _CODES.items()}


def _torch():
    import torch

    return torch


def _dtype_name(dtype) -> str:
    return str(dtype).rpartition(".")[2]


def encode(tensors: dict, metadata: dict | None = None) -> bytes:
    """The safetensors bytes of ``tensors`` (name -> CPU torch.Tensor), in their order.
    Raises TypeError for a non-tensor and ValueError for a dtype safetensors cannot name, a
    tensor not in host memory, or a name that is not a non-empty string."""
    torch = _torch()
    header: dict = {}
    if metadata:
        header[_METADATA] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    offset = 0
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name or name == _METADATA:
            raise ValueError(f"tensor name {name!r} is not a usable safetensors name")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor for {name!r}, got {type(tensor).__name__}")
        if tensor.device.type != "cpu" or tensor.layout != torch.strided:
            raise ValueError(f"{name!r}: dense host-memory tensors only")
        code = _CODES.get(_dtype_name(tensor.dtype))
        if code is None:
            raise ValueError(f"{name!r}: safetensors has no name for {tensor.dtype}")
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": code[0], "shape": [int(d) for d in tensor.shape],
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return _LENGTH.pack(len(text)) + text + b"".join(chunks)


def decode(payload) -> tuple[dict, dict]:
    """``(tensors, metadata)`` from safetensors bytes: name -> CPU torch.Tensor (owning a copy)
    in file order, and the ``__metadata__`` map (empty when absent). Raises ValueError naming
    what is wrong with a malformed file, or a dtype this torch lacks."""
    torch = _torch()
    view = memoryview(payload).cast("B")
    if len(view) < _LENGTH.size:
        raise ValueError(f"{len(view)} bytes is too short for a safetensors file")
    (length,) = _LENGTH.unpack_from(view, 0)
    start = _LENGTH.size + length
    if length > _MAX_HEADER_BYTES or start > len(view):
        raise ValueError(f"header of {length} bytes does not fit the {len(view)}-byte file")
    try:
        header = json.loads(bytes(view[_LENGTH.size:start]).decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    metadata = header.pop(_METADATA, None) or {}
    if not isinstance(metadata, dict):
        raise ValueError("__metadata__ is not a JSON object")
    data = view[start:]
    tensors = {}
    for name, entry in header.items():
        try:
            dtype_name, size = _NAMES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"entry {name!r} is malformed: {e!r}") from e
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= len(data):
            raise ValueError(f"entry {name!r}: shape {shape} or offsets [{begin}, {end}) "
                             f"do not fit {len(data)} bytes of data")
        if end - begin != math.prod(shape) * size:
            raise ValueError(f"entry {name!r}: {end - begin} bytes for shape {shape} of "
                             f"{entry['dtype']}")
        dtype = getattr(torch, dtype_name, None)
        if dtype is None:
            raise ValueError(f"entry {name!r}: this torch has no {dtype_name}")
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        tensors[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
    return tensors, metadata

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake's Python API, served by Larder.

``MooncakeDistributedStore``, ``ReplicateConfig``, ``TransferEngine`` and ``TransferOpcode`` take
the same method names, arguments and return conventions as ``mooncake.store`` and
``mooncake.engine``: integers instead of exceptions (0 or a byte count on success, a negative
Mooncake error code on failure), ``b""`` from ``get`` for a missing key, 1 / 0 / -1 from
``is_exist``. Code written for Mooncake runs unchanged; put ``<build>/python/shim`` first on
``PYTHONPATH`` and ``from mooncake.store import MooncakeDistributedStore`` lands here.

Differences from Mooncake (see docs/python.md):

* ``metadata_server`` and ``rdma_devices`` / ``device_name`` are accepted and ignored: Larder's
  master holds the segment table and peers are reached directly at "ip:port".
* Protocol names Larder does not have ("rdma", "nvlink", "efa", ...) run as "auto" (same process:
  memcpy, same host: shm, otherwise tcp), with one warning per name.
* ``TransferEngine``'s ``target_hostname`` is the peer's "ip:port" as returned by its
  ``initialize`` address and ``get_rpc_port`` (what SGLang and vLLM connectors already pass).
* Soft pins are not supported (``with_soft_pin`` is ignored); hard pins are.

Environment (read here only, never by ``larder.Store``): ``MOONCAKE_MASTER``,
``MOONCAKE_PROTOCOL``, ``MOONCAKE_LOCAL_HOSTNAME``, ``MOONCAKE_GLOBAL_SEGMENT_SIZE`` and
``MOONCAKE_LOCAL_BUFFER_SIZE`` (ints or sizes such as "4gb"), ``MOONCAKE_TE_META_DATA_SERVER``,
``MOONCAKE_DEVICE`` and ``MOONCAKE_CONFIG_PATH`` (a JSON file with the same keys as the dict form of
``setup``). An argument passed to ``setup`` wins over the environment, which wins over the file.
"""

from ._buffers import (
    BufferLease,
    BufferPool,
    MooncakeHostMemAllocator,
    RegisteredBufferLease,
    RegisteredBufferPool,
)
from ._config import load_config, map_protocol
from ._engine import TransferEngine, TransferOpcode
from ._errors import ErrorCode, error_code
from ._store import (
    Descriptor,
    MemoryDescriptor,
    MooncakeDistributedStore,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)
from ._tensor import deserialize_tensor, serialize_tensor, tensor_metadata_size
from ._tensor_parallel import ParallelAxis, ReadTarget, TensorParallelism

# First the names ``mooncake.store`` exports (python/shim/mooncake/store.py re-exports them), then
# ``mooncake.engine``'s and the helpers'.
__all__ = [
    "BufferLease",
    "BufferPool",
    "Descriptor",
    "ErrorCode",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "ParallelAxis",
    "ReadTarget",
    "RegisteredBufferLease",
    "RegisteredBufferPool",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TensorParallelism",
]
_STORE_EXPORTS = tuple(__all__)
__all__ += [
    "TransferEngine",
    "TransferOpcode",
    "deserialize_tensor",
    "error_code",
    "load_config",
    "map_protocol",
    "serialize_tensor",
    "tensor_metadata_size",
]

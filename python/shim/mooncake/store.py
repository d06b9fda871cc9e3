# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.store`` served by Larder: see larder.compat.mooncake."""

import larder as _larder
from larder.compat import mooncake as _compat

# The names mooncake.store exports, as larder.compat.mooncake lists them.
globals().update({name: getattr(_compat, name) for name in _compat._STORE_EXPORTS})

# Mooncake's binding also has the tensor helpers, under private names.
_serialize_tensor = _compat.serialize_tensor
_deserialize_tensor = _compat.deserialize_tensor
_tensor_metadata_size = _compat.tensor_metadata_size

# Mooncake exports ReplicaStatus's members at module level.
UNDEFINED, INITIALIZED, PROCESSING, COMPLETE, REMOVED, FAILED = tuple(_compat.ReplicaStatus)

BufferHandle = _larder.Buffer  # what get_buffer returns

__all__ = ["BufferHandle", *_compat._STORE_EXPORTS]

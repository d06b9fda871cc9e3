# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.remote_tensor_batch`` served by Larder: see
larder.compat.mooncake._remote_tensor_batch."""

from larder.compat.mooncake import _remote_tensor_batch as _impl

globals().update({name: getattr(_impl, name) for name in _impl.__all__})

__all__ = list(_impl.__all__)

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.buffer_pool`` served by Larder: the registered buffer pool of
larder.compat.mooncake (``BufferPool``, also under its older name ``RegisteredBufferPool``)."""

from larder.compat.mooncake._buffers import BufferPool, RegisteredBufferPool  # noqa: F401

__all__ = ["BufferPool", "RegisteredBufferPool"]

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""A stand-in for the ``mooncake`` package that serves Mooncake's Python API from Larder.

Put this folder's parent (``python/shim``, or ``<build>/python/shim`` after a build) before the
real Mooncake on ``PYTHONPATH`` and ``larder`` somewhere on it too:

    PYTHONPATH=build/python/shim:build/python python3 my_sglang_or_lmcache_app.py

``from mooncake.store import MooncakeDistributedStore`` and ``from mooncake.engine import
TransferEngine`` then resolve to ``larder.compat.mooncake``.
"""

IS_LARDER = True  # lets applications (and tests) tell the shim from the real Mooncake

__all__ = ["BufferPool", "RegisteredBufferPool"]


def __getattr__(name: str):
    # Lazily, as Mooncake's package does: importing `mooncake` loads no store.
    if name in __all__:
        from larder.compat.mooncake import _buffers

        return getattr(_buffers, name)
    raise AttributeError(f"module 'mooncake' has no attribute {name!r}")

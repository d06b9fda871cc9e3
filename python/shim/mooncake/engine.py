# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.engine`` served by Larder: see larder.compat.mooncake.

Larder's engine moves host memory only (local memcpy, shm, tcp), so every capability flag of
Mooncake's binding is False.
"""

from larder.compat.mooncake._engine import (  # noqa: F401  (re-exported)
    InnerTransferEngine,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
)

SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_CUDA = False

__all__ = [
    "InnerTransferEngine",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
]

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.store`` served by Larder: see larder.compat.mooncake."""

from larder.compat.mooncake import (  # noqa: F401  (re-exported)
    ErrorCode,
    MooncakeDistributedStore,
    ReplicateConfig,
)

__all__ = ["ErrorCode", "MooncakeDistributedStore", "ReplicateConfig"]

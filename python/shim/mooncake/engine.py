# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.engine`` served by Larder: see larder.compat.mooncake."""

from larder.compat.mooncake import TransferEngine, TransferOpcode  # noqa: F401  (re-exported)

__all__ = ["TransferEngine", "TransferOpcode"]

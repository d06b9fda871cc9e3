# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Drop-in replacements for other KV-cache stores' Python APIs, served by Larder.

``larder.compat.mooncake``: Mooncake's ``MooncakeDistributedStore`` and ``TransferEngine``.
"""

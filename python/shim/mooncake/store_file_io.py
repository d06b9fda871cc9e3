# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake.store_file_io`` served by Larder: the return codes of the tensor file methods
(``save_tensor_to_file``, ``save_tensor_to_safetensor``, ``save_tensor``, ...), which
MooncakeDistributedStore has built in."""

from larder.compat.mooncake._errors import ErrorCode as _ErrorCode

INVALID_PARAMS = int(_ErrorCode.INVALID_PARAMS)
FILE_NOT_FOUND = int(_ErrorCode.FILE_NOT_FOUND)
PERSISTENT_FAIL = int(_ErrorCode.PERSISTENT_FAIL)


def patch_store_file_io_support() -> None:
    """Nothing to patch: Larder's MooncakeDistributedStore has the file methods already."""


__all__ = ["FILE_NOT_FOUND", "INVALID_PARAMS", "PERSISTENT_FAIL", "patch_store_file_io_support"]

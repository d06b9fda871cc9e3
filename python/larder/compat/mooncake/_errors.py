# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake error codes, and the code that stands for a Larder error."""

from __future__ import annotations

import enum
import logging

import larder

_log = logging.getLogger("larder.compat.mooncake")


class ErrorCode(enum.IntEnum):
    """Mooncake's error codes (its ``types.h`` values). The store returns them negated as ints:
    -200 (NO_AVAILABLE_HANDLE, the pool is full) is what callers treat as back-pressure."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_ALREADY_EXISTS = -711
    REPLICA_IS_GONE = -712
    REPLICA_NOT_IN_LOCAL_MEMORY = -713
    OBJECT_REPLICA_BUSY = -714
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    ETCD_OPERATION_ERROR = -1000
    ETCD_KEY_NOT_EXIST = -1001
    ETCD_TRANSACTION_FAIL = -1002
    ETCD_CTX_CANCELLED = -1003
    OPLOG_ENTRY_NOT_FOUND = -1004
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    FILE_NOT_FOUND = -1100
    FILE_OPEN_FAIL = -1101
    FILE_READ_FAIL = -1102
    FILE_WRITE_FAIL = -1103
    FILE_INVALID_BUFFER = -1104
    FILE_LOCK_FAIL = -1105
    FILE_INVALID_HANDLE = -1106
    UNABLE_OFFLOAD = -1300
    UNABLE_OFFLOADING = -1301
    TASK_NOT_FOUND = -1400
    SERIALIZE_UNSUPPORTED = -1500
    SERIALIZE_FAIL = -1501
    DESERIALIZE_FAIL = -1502
    PERSISTENT_FAIL = -1503
    TENANT_QUOTA_EXCEEDED = -1700
    TENANT_NOT_REGISTERED = -1701
    TENANT_NOT_EMPTY = -1702


_CODE_FOR_STATUS = {
    larder.StatusCode.CANCELLED: ErrorCode.TRANSFER_FAIL,
    larder.StatusCode.UNKNOWN: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_PARAMS,
    larder.StatusCode.DEADLINE_EXCEEDED: ErrorCode.RPC_TIMEOUT,
    larder.StatusCode.NOT_FOUND: ErrorCode.OBJECT_NOT_FOUND,
    larder.StatusCode.ALREADY_EXISTS: ErrorCode.OBJECT_ALREADY_EXISTS,
    larder.StatusCode.PERMISSION_DENIED: ErrorCode.ILLEGAL_CLIENT,
    larder.StatusCode.UNAUTHENTICATED: ErrorCode.ILLEGAL_CLIENT,
    larder.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.NO_AVAILABLE_HANDLE,
    larder.StatusCode.FAILED_PRECONDITION: ErrorCode.INVALID_PARAMS,
    larder.StatusCode.ABORTED: ErrorCode.TRANSFER_FAIL,
    larder.StatusCode.OUT_OF_RANGE: ErrorCode.INVALID_PARAMS,
    larder.StatusCode.UNIMPLEMENTED: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.INTERNAL: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.UNAVAILABLE: ErrorCode.RPC_FAIL,
    larder.StatusCode.DATA_LOSS: ErrorCode.TRANSFER_FAIL,
}


# The "retry later" refusals (Unavailable), told apart by their detail as Mooncake's codes tell
# them apart; any other Unavailable means the master or a peer is unreachable.
_CODE_FOR_DETAIL = {
    "Leased": ErrorCode.OBJECT_HAS_LEASE,
    "BeingWritten": ErrorCode.REPLICA_IS_NOT_READY,
    "LeaseExpired": ErrorCode.LEASE_EXPIRED,
}


def error_code(error: BaseException) -> int:
    """The negative Mooncake code that stands for ``error`` (a LarderError or a bad argument)."""
    if isinstance(error, larder.LarderError):
        detail = _CODE_FOR_DETAIL.get(getattr(error, "detail", "None"))
        if detail is not None:
            return int(detail)
        return int(_CODE_FOR_STATUS.get(error.code, ErrorCode.INTERNAL_ERROR))
    return int(ErrorCode.INVALID_PARAMS)


# Exceptions that mean "the caller passed something unusable": they become INVALID_PARAMS.
_ARGUMENT_ERRORS = (TypeError, ValueError, BufferError, OverflowError)


def _report(what: str, error: BaseException) -> int:
    code = error_code(error)
    missing = getattr(error, "code", None) == larder.StatusCode.NOT_FOUND
    level = logging.DEBUG if missing else logging.WARNING
    _log.log(level, "%s failed (%d): %s", what, code, error)
    return code



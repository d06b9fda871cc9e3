# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Larder: a distributed KV-cache store and the transfer engine beneath it.

Two classes cover the API:

* :class:`Store` -- a process's handle on the shared pool: ``put`` / ``get`` copy values,
  ``register_buffer`` + ``put_from`` / ``get_into`` move them straight between registered memory
  and the pool, ``batch_*`` forms do many keys per round trip.
* :class:`TransferEngine` -- moves bytes between this process's memory and segments that other
  processes export (prefill/decode disaggregation).

Errors are exceptions, one class per status code, all derived from :class:`LarderError`
(``NotFoundError``, ``UnavailableError``...); each carries ``code`` (:class:`StatusCode`) and
``message``. Batch calls do not raise for a single key: they return a list whose failed items
are the exception instances (``larder.check(results)`` raises the first one).

Mooncake users: ``larder.compat.mooncake`` offers ``MooncakeDistributedStore`` and
``TransferEngine`` with Mooncake's names and return conventions; see docs/python.md.
"""

try:
    from . import _larder  # noqa: F401
except ImportError as _error:
    import pathlib as _pathlib
    import sys as _sys

    _built = sorted(p.name.split(".")[1] for p in _pathlib.Path(__file__).parent.glob("_larder.*.so"))
    _this = f"cpython-{_sys.version_info.major}{_sys.version_info.minor}"
    if _built and not any(tag.startswith(_this + "-") for tag in _built):
        raise ImportError(
            f"larder's native module was built for {', '.join(_built)}, but this is Python "
            f"{_sys.version_info.major}.{_sys.version_info.minor} ({_sys.executable}). Run the "
            "interpreter it was built for (Debian's /usr/bin/python3 unless the build was told "
            "otherwise), or rebuild for this one: cmake -B build "
            f"-DPython3_EXECUTABLE={_sys.executable} && cmake --build build (docs/python.md)"
        ) from _error
    raise

from ._larder import (  # noqa: F401,E402  (re-exported)
    AbortedError,
    AlreadyExistsError,
    Buffer,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    LarderError,
    MemoryRegion,
    NotFoundError,
    ObjectInfo,
    OutOfRangeError,
    PermissionDeniedError,
    ReplicaInfo,
    ResourceExhaustedError,
    SegmentDescriptor,
    StatusCode,
    Store,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferResult,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
    __version__,
    parse_duration,
    parse_protocol,
    parse_size,
    resolve_protocol,
    set_current_device,
)

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "Buffer",
    "CancelledError",
    "DataLossError",
    "UnauthenticatedError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "LarderError",
    "MemoryRegion",
    "NotFoundError",
    "ObjectInfo",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ReplicaInfo",
    "ResourceExhaustedError",
    "SegmentDescriptor",
    "StatusCode",
    "Store",
    "TransferEngine",
    "TransferOp",
    "TransferRequest",
    "TransferResult",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "check",
    "error_for_code",
    "parse_duration",
    "parse_protocol",
    "parse_size",
    "resolve_protocol",
    "set_current_device",
]

_ERRORS_BY_CODE = {
    cls.code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}


def error_for_code(code):
    """The LarderError subclass raised for ``code`` (a StatusCode or its int value)."""
    return _ERRORS_BY_CODE[StatusCode(int(code))]


def check(results):
    """Returns ``results`` (a batch call's list) unchanged, or raises its first LarderError.

    >>> values = larder.check(store.batch_get(keys))   # all present, or an exception
    """
    for item in results:
        if isinstance(item, LarderError):
            raise item
    return results

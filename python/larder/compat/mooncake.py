# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake's Python API, served by Larder.

``MooncakeDistributedStore``, ``ReplicateConfig``, ``TransferEngine`` and ``TransferOpcode`` take
the same method names, arguments and return conventions as ``mooncake.store`` and
``mooncake.engine``: integers instead of exceptions (0 or a byte count on success, a negative
Mooncake error code on failure), ``b""`` from ``get`` for a missing key, 1 / 0 / -1 from
``is_exist``. Code written for Mooncake runs unchanged; put ``<build>/python/shim`` first on
``PYTHONPATH`` and ``from mooncake.store import MooncakeDistributedStore`` lands here.

Differences from Mooncake (see docs/python.md):

* ``metadata_server`` and ``rdma_devices`` / ``device_name`` are accepted and ignored: Larder's
  master holds the segment table and peers are reached directly at "ip:port".
* Protocol names Larder does not have ("rdma", "nvlink", "efa", ...) run as "auto" (same process:
  memcpy, same host: shm, otherwise tcp), with one warning per name.
* ``TransferEngine``'s ``target_hostname`` is the peer's "ip:port" as returned by its
  ``initialize`` address and ``get_rpc_port`` (what SGLang and vLLM connectors already pass).
* Soft pins are not supported (``with_soft_pin`` is ignored); hard pins are.

Environment (read here only, never by ``larder.Store``): ``MOONCAKE_MASTER``,
``MOONCAKE_PROTOCOL``, ``MOONCAKE_LOCAL_HOSTNAME``, ``MOONCAKE_GLOBAL_SEGMENT_SIZE`` and
``MOONCAKE_LOCAL_BUFFER_SIZE`` (ints or sizes such as "4gb"), ``MOONCAKE_TE_META_DATA_SERVER``,
``MOONCAKE_DEVICE`` and ``MOONCAKE_CONFIG_PATH`` (a JSON file with the same keys as the dict form of
``setup``). An argument passed to ``setup`` wins over the environment, which wins over the file.
"""

from __future__ import annotations

import ctypes
import enum
import json
import logging
import operator
import os
import socket
import threading
import warnings
from collections.abc import Mapping

import larder

__all__ = [
    "ErrorCode",
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "TransferEngine",
    "TransferOpcode",
    "error_code",
    "load_config",
    "map_protocol",
]

_log = logging.getLogger(__name__)


class ErrorCode(enum.IntEnum):
    """The Mooncake error codes this layer returns (Mooncake's ``types.h`` values)."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    NO_AVAILABLE_HANDLE = -200
    INVALID_PARAMS = -600
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    RPC_TIMEOUT = -901


_CODE_FOR_STATUS = {
    larder.StatusCode.CANCELLED: ErrorCode.TRANSFER_FAIL,
    larder.StatusCode.UNKNOWN: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_PARAMS,
    larder.StatusCode.DEADLINE_EXCEEDED: ErrorCode.RPC_TIMEOUT,
    larder.StatusCode.NOT_FOUND: ErrorCode.OBJECT_NOT_FOUND,
    larder.StatusCode.ALREADY_EXISTS: ErrorCode.OBJECT_ALREADY_EXISTS,
    larder.StatusCode.PERMISSION_DENIED: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.NO_AVAILABLE_HANDLE,
    larder.StatusCode.FAILED_PRECONDITION: ErrorCode.INVALID_PARAMS,
    larder.StatusCode.ABORTED: ErrorCode.TRANSFER_FAIL,
    larder.StatusCode.OUT_OF_RANGE: ErrorCode.INVALID_PARAMS,
    larder.StatusCode.UNIMPLEMENTED: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.INTERNAL: ErrorCode.INTERNAL_ERROR,
    larder.StatusCode.UNAVAILABLE: ErrorCode.RPC_FAIL,
    larder.StatusCode.DATA_LOSS: ErrorCode.TRANSFER_FAIL,
}


def error_code(error: BaseException) -> int:
    """The negative Mooncake code that stands for ``error`` (a LarderError or a bad argument)."""
    if isinstance(error, larder.LarderError):
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


# ---- configuration ----

_warned_protocols: set[str] = set()
_warn_lock = threading.Lock()


def map_protocol(protocol: str | None) -> str:
    """The Larder protocol for a Mooncake protocol name.

    Names Larder knows ("tcp", "shm", "auto", comma lists of them) pass through; "" stays "" (the
    engine then reads LARDER_STORE_PROTOCOL / LARDER_PROTOCOL, else "auto"); any other name
    ("rdma", "nvlink", ...) becomes "auto", with one warning per name per process.
    """
    name = (protocol or "").strip().lower()
    if not name:
        return ""
    try:
        larder.parse_protocol(name)
        return name
    except larder.InvalidArgumentError:
        pass
    with _warn_lock:
        first = name not in _warned_protocols
        _warned_protocols.add(name)
    if first:
        message = (f"Larder has no '{name}' transport; using 'auto' (local memcpy, shm between "
                   "processes of one host, tcp between hosts)")
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        _log.warning(message)
    return "auto"


_DEFAULTS = {
    "local_hostname": "127.0.0.1",
    "metadata_server": "P2PHANDSHAKE",
    "global_segment_size": 16 * 1024 * 1024,
    "local_buffer_size": 1024 * 1024 * 1024,
    "protocol": "tcp",
    "rdma_devices": "",
    "master_server_addr": "127.0.0.1:50051",
}

# Spellings found in Mooncake, SGLang and LMCache configuration files, mapped to setup()'s names.
_CONFIG_KEYS = {
    "local_hostname": "local_hostname",
    "metadata_server": "metadata_server",
    "global_segment_size": "global_segment_size",
    "local_buffer_size": "local_buffer_size",
    "protocol": "protocol",
    "rdma_devices": "rdma_devices",
    "device_name": "rdma_devices",
    "master_server_addr": "master_server_addr",
    "master_server_address": "master_server_addr",
}

_ENV_KEYS = {
    "MOONCAKE_LOCAL_HOSTNAME": "local_hostname",
    "MOONCAKE_TE_META_DATA_SERVER": "metadata_server",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE": "global_segment_size",
    "MOONCAKE_LOCAL_BUFFER_SIZE": "local_buffer_size",
    "MOONCAKE_PROTOCOL": "protocol",
    "MOONCAKE_DEVICE": "rdma_devices",
    "MOONCAKE_MASTER": "master_server_addr",
}


def _normalize(config: Mapping) -> dict:
    out = {}
    for key, value in config.items():
        name = _CONFIG_KEYS.get(key)
        if name is None:
            _log.debug("ignoring Mooncake config key %r", key)
        elif value is not None:
            out[name] = value
    return out


def load_config(overrides: Mapping | None = None) -> dict:
    """Resolves setup()'s arguments: ``overrides`` (non-None values), then the MOONCAKE_*
    environment variables, then the JSON file named by MOONCAKE_CONFIG_PATH, then Mooncake's
    defaults. Sizes come back as ints. Raises ValueError for an unreadable file or a bad size."""
    config = dict(_DEFAULTS)
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                config.update(_normalize(json.load(f)))
        except (OSError, ValueError) as e:
            raise ValueError(f"MOONCAKE_CONFIG_PATH={path}: {e}") from e
    for variable, name in _ENV_KEYS.items():
        value = os.environ.get(variable)
        if value:
            config[name] = value
    if overrides:
        config.update(_normalize(overrides))
    for name in ("global_segment_size", "local_buffer_size"):
        try:
            config[name] = larder.parse_size(config[name])
        except larder.LarderError as e:
            raise ValueError(f"{name}: {e}") from e
    return config


def _split_host(local_hostname: str) -> tuple[str, int]:
    """("ip", port) from "host", "host:port"; host names resolve to IPv4 addresses."""
    host, port = local_hostname, 0
    if local_hostname.count(":") == 1:
        host, _, port_text = local_hostname.partition(":")
        port = int(port_text)
    return socket.gethostbyname(host), port


# ---- the store ----


class ReplicateConfig:
    """Placement of a put, as Mooncake's ReplicateConfig.

    ``replica_num`` replicas (default 1); ``preferred_segment`` (or ``preferred_segments``): segment
    names ("ip:port", see MooncakeDistributedStore.get_hostname) to place replicas in first;
    ``with_hard_pin``: never evicted (only remove deletes it). ``with_soft_pin`` and
    ``prefer_alloc_in_same_node`` are accepted and have no effect (Larder places the first replica
    in the writer's own segment, then on its host, by default).
    """

    def __init__(self) -> None:
        self.replica_num = 1
        self.with_soft_pin = False
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []
        self.prefer_alloc_in_same_node = False

    def _put_kwargs(self) -> dict:
        preferred = [self.preferred_segment] if self.preferred_segment else []
        preferred += [s for s in self.preferred_segments if s and s not in preferred]
        return {
            "replica_num": max(int(self.replica_num), 0),
            "preferred_segments": preferred or None,
            "pin": bool(self.with_hard_pin),
        }

    def __repr__(self) -> str:
        return (f"ReplicateConfig(replica_num={self.replica_num}, "
                f"with_soft_pin={self.with_soft_pin}, with_hard_pin={self.with_hard_pin}, "
                f"preferred_segment={self.preferred_segment!r})")


def _put_kwargs(config: ReplicateConfig | None) -> dict:
    return {} if config is None else config._put_kwargs()


def _positive_int(value) -> bool:
    """True for an int (or an integer scalar such as numpy.uint64) above 0."""
    if isinstance(value, bool):
        return False
    try:
        return operator.index(value) > 0
    except TypeError:
        return False


_is_address = _positive_int
_is_size = _positive_int


class MooncakeDistributedStore:
    """Mooncake's store client, backed by :class:`larder.Store`.

    Call ``setup`` first; until then (and after ``close``) every call fails with
    INTERNAL_ERROR (-1), ``get`` returns b"" and ``is_exist`` -1. Thread-safe.
    """

    def __init__(self) -> None:
        self._store: larder.Store | None = None

    # ---- lifetime ----

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=None,
              local_buffer_size=None, protocol=None, rdma_devices=None, master_server_addr=None,
              engine=None) -> int:
        """Creates the client: contributes ``global_segment_size`` bytes to the pool and mounts
        them with the Larder master at ``master_server_addr``. Also takes one dict (the
        ``setup(config)`` form) with the same keys (``device_name`` and ``master_server_address``
        are accepted spellings). Missing values come from load_config(). ``metadata_server`` and
        ``rdma_devices`` are ignored; ``engine`` (a shared Mooncake engine) is not supported and
        ignored with a warning. Returns 0, or a negative code (RPC_FAIL when the master is
        unreachable, INVALID_PARAMS for bad values)."""
        if isinstance(local_hostname, Mapping):
            overrides = dict(local_hostname)
        else:
            overrides = {
                "local_hostname": local_hostname,
                "metadata_server": metadata_server,
                "global_segment_size": global_segment_size,
                "local_buffer_size": local_buffer_size,
                "protocol": protocol,
                "rdma_devices": rdma_devices,
                "master_server_addr": master_server_addr,
            }
        if engine is not None:
            _log.warning("setup(engine=...) is not supported by Larder: the store uses its own "
                         "transfer engine")
        try:
            config = load_config(overrides)
            host, _ = _split_host(str(config["local_hostname"]))
        except (ValueError, OSError) as e:
            _log.error("setup: %s", e)
            return int(ErrorCode.INVALID_PARAMS)
        self.close()
        try:
            self._store = larder.Store(
                str(config["master_server_addr"]),
                local_hostname=host,
                global_segment_size=config["global_segment_size"],
                local_buffer_size=config["local_buffer_size"],
                protocol=map_protocol(str(config["protocol"])),
            )
        except larder.LarderError as e:
            _log.error("setup: %s", e)
            return error_code(e)
        return 0

    def close(self) -> int:
        """Unmounts this client's segment and stops. Returns 0."""
        store, self._store = self._store, None
        if store is not None:
            store.close()
        return 0

    def get_hostname(self) -> str:
        """This client's segment name ("ip:port"), usable as ReplicateConfig.preferred_segment."""
        store = self._store
        return store.segment_name if store is not None else ""

    def _call(self, what: str, fn, failure=None):
        store = self._store
        if store is None:
            _log.warning("%s: the store is not set up (call setup first)", what)
            return int(ErrorCode.INTERNAL_ERROR) if failure is None else failure
        try:
            return fn(store)
        except larder.LarderError as e:
            code = _report(what, e)
            return code if failure is None else failure
        except _ARGUMENT_ERRORS as e:
            _log.warning("%s: %s", what, e)
            return int(ErrorCode.INVALID_PARAMS) if failure is None else failure

    # ---- copying API ----

    def put(self, key: str, value, config: ReplicateConfig | None = None) -> int:
        """Stores a bytes-like ``value``. Returns 0 or a negative code."""
        return self._call("put", lambda s: s.put(key, value, **_put_kwargs(config)) or 0)

    def put_parts(self, key: str, *parts, config: ReplicateConfig | None = None) -> int:
        """Stores the concatenation of bytes-like ``parts`` as one value."""
        return self._call(
            "put_parts",
            lambda s: s.put(key, b"".join(bytes(memoryview(p)) for p in parts),
                            **_put_kwargs(config)) or 0)

    def get(self, key: str) -> bytes:
        """The value, or b"" when the key is missing or the read fails."""
        return self._call("get", lambda s: s.get(key), failure=b"")

    def put_batch(self, keys, values, config: ReplicateConfig | None = None) -> int:
        """Stores every value. Returns 0 when all succeeded, else the first failure's code."""

        def run(store):
            if len(keys) != len(values):
                return int(ErrorCode.INVALID_PARAMS)
            for key, item in zip(keys, store.batch_put(list(keys), list(values),
                                                        **_put_kwargs(config))):
                if item is not None:
                    return _report(f"put_batch key {key!r}", item)
            return 0

        return self._call("put_batch", run)

    def get_batch(self, keys) -> list:
        """The values, b"" for each key missing or failed."""

        def run(store):
            return [b"" if isinstance(v, larder.LarderError) else v
                    for v in store.batch_get(list(keys))]

        return self._call("get_batch", run, failure=[b""] * len(keys))

    # ---- zero-copy API ----

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers [buffer_ptr, buffer_ptr + size) for the zero-copy calls. Returns 0 or a
        negative code (INVALID_PARAMS for a null or empty range or an overlap)."""
        if not (_is_address(buffer_ptr) and _is_size(size)):
            return int(ErrorCode.INVALID_PARAMS)
        return self._call("register_buffer", lambda s: s.register_buffer(buffer_ptr, size) or 0)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Returns 0, or OBJECT_NOT_FOUND when no buffer was registered at ``buffer_ptr``."""
        if not _is_address(buffer_ptr):
            return int(ErrorCode.INVALID_PARAMS)
        return self._call("unregister_buffer", lambda s: s.unregister_buffer(buffer_ptr) or 0)

    def put_from(self, key: str, buffer_ptr: int, size: int,
                 config: ReplicateConfig | None = None) -> int:
        """Stores ``size`` bytes at ``buffer_ptr`` (inside a registered buffer). Returns 0 or a
        negative code."""
        if not (_is_address(buffer_ptr) and _is_size(size)):
            return int(ErrorCode.INVALID_PARAMS)
        return self._call(
            "put_from", lambda s: s.put_from(key, buffer_ptr, size, **_put_kwargs(config)) or 0)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads the value into [buffer_ptr, buffer_ptr + size) (inside a registered buffer).
        Returns the bytes read, or a negative code (OBJECT_NOT_FOUND, INVALID_PARAMS when the
        value is larger than ``size`` or the buffer is not registered)."""
        if not (_is_address(buffer_ptr) and _is_size(size)):
            return int(ErrorCode.INVALID_PARAMS)
        return self._call("get_into", lambda s: s.get_into(key, buffer_ptr, size))

    def batch_put_from(self, keys, buffer_ptrs, sizes,
                       config: ReplicateConfig | None = None) -> list:
        """put_from for every key in one round trip. Returns 0 or a negative code per key."""
        bad = self._check_batch(keys, buffer_ptrs, sizes)
        if bad is not None:
            return bad

        def run(store):
            results = store.batch_put_from(list(keys), list(buffer_ptrs), list(sizes),
                                           **_put_kwargs(config))
            return self._codes("batch_put_from", keys, results, lambda v: 0)

        return self._batch("batch_put_from", keys, run)

    def batch_get_into(self, keys, buffer_ptrs, sizes) -> list:
        """get_into for every key in one round trip. Returns the bytes read or a negative code
        per key."""
        bad = self._check_batch(keys, buffer_ptrs, sizes)
        if bad is not None:
            return bad

        def run(store):
            results = store.batch_get_into(list(keys), list(buffer_ptrs), list(sizes))
            return self._codes("batch_get_into", keys, results, int)

        return self._batch("batch_get_into", keys, run)

    @staticmethod
    def _check_batch(keys, buffer_ptrs, sizes):
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            _log.warning("batch call: %d keys, %d pointers, %d sizes", len(keys),
                         len(buffer_ptrs), len(sizes))
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        if not all(_is_address(p) for p in buffer_ptrs) or not all(_is_size(s) for s in sizes):
            return [int(ErrorCode.INVALID_PARAMS)] * len(keys)
        return None

    @staticmethod
    def _codes(what, keys, results, on_success) -> list:
        codes = []
        reported = False
        for key, item in zip(keys, results):
            if isinstance(item, larder.LarderError):
                if not reported:
                    _report(f"{what} key {key!r}", item)
                    reported = True
                codes.append(error_code(item))
            else:
                codes.append(on_success(item))
        return codes

    def _batch(self, what, keys, fn) -> list:
        """Runs a batch call; when the call fails as a whole (not set up, master down), every
        key gets its code."""
        if len(keys) == 0:
            return []
        result = self._call(what, fn)
        return [result] * len(keys) if isinstance(result, int) else result

    # ---- metadata ----

    def is_exist(self, key: str) -> int:
        """1 when the key is stored, 0 when not, -1 on error."""
        return self._call("is_exist", lambda s: 1 if s.exist(key) else 0, failure=-1)

    def batch_is_exist(self, keys) -> list:
        """1 / 0 / -1 per key, in one round trip."""

        def run(store):
            return [-1 if isinstance(v, larder.LarderError) else int(v)
                    for v in store.batch_exist(list(keys))]

        return self._call("batch_is_exist", run, failure=[-1] * len(keys))

    def get_size(self, key: str) -> int:
        """The value's size, or a negative code (OBJECT_NOT_FOUND)."""
        return self._call("get_size", lambda s: s.get_size(key))

    def remove(self, key: str) -> int:
        """0, OBJECT_NOT_FOUND, OBJECT_HAS_LEASE while a reader holds it or REPLICA_IS_NOT_READY
        while it is being written (retry later), RPC_FAIL when the master is unreachable."""

        def run(store):
            try:
                store.remove(key)
                return 0
            except larder.UnavailableError as e:
                # Unavailable also means "master unreachable"; the master's refusals say why.
                _log.debug("remove %r: %s", key, e)
                if "leased" in e.message:
                    return int(ErrorCode.OBJECT_HAS_LEASE)
                if "being written" in e.message:
                    return int(ErrorCode.REPLICA_IS_NOT_READY)
                raise

        return self._call("remove", run)

    def batch_remove(self, keys, force: bool = False) -> list:
        """0 or a negative code per key. ``force`` is accepted and ignored."""

        def run(store):
            return self._codes("batch_remove", keys, store.batch_remove(list(keys)), lambda v: 0)

        return self._batch("batch_remove", keys, run)

    def remove_all(self) -> int:
        """Removes every object no reader holds; returns how many, or -1 on error."""
        return self._call("remove_all", lambda s: s.remove_all(), failure=-1)


# ---- the transfer engine ----


class TransferOpcode(enum.IntEnum):
    """Direction of TransferEngine.transfer_sync (Mooncake spells the members Read / Write)."""

    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


_SEGMENT_PREFIX = "mem@0x"


def _segment_name(base: int) -> str:
    """The name a registered buffer is exported under: its base address, so that peers can map
    a virtual address back to (segment, offset)."""
    return f"{_SEGMENT_PREFIX}{base:x}"


class _PeerBuffer:
    __slots__ = ("base", "size", "descriptor", "handle")

    def __init__(self, base: int, descriptor) -> None:
        self.base = base
        self.size = descriptor.size
        self.descriptor = descriptor
        self.handle = None


class TransferEngine:
    """Mooncake's TransferEngine (``mooncake.engine``), backed by :class:`larder.TransferEngine`.

    A buffer passed to ``register_memory`` (or returned by ``allocate_managed_buffer``) is
    exported as a segment named after its base address; a peer that knows an address inside it
    reads and writes it with ``transfer_sync_read`` / ``transfer_sync_write(target_hostname,
    local_addr, peer_addr, length)``. ``target_hostname`` is the peer's "ip:port": its
    ``initialize`` host and ``get_rpc_port()``. Addresses outside every buffer the peer
    registered are rejected (-1). Local addresses need no registration.

    Same-host peers reach memory from ``allocate_managed_buffer`` over shm; memory the
    application owns (``register_memory``) is reached over tcp. Thread-safe.
    """

    def __init__(self) -> None:
        self._engine: larder.TransferEngine | None = None
        self._lock = threading.Lock()
        self._local: dict[int, tuple[int, int, object]] = {}  # base -> (size, segment id, region)
        self._peers: dict[str, list[_PeerBuffer]] = {}  # guarded by _lock

    def initialize(self, local_hostname: str, metadata_server: str = "P2PHANDSHAKE",
                   protocol: str = "tcp", device_name: str = "") -> int:
        """Starts the engine's data server on ``local_hostname`` ("ip" or "ip:port"; port 0 or
        none picks a free one). ``metadata_server`` and ``device_name`` are ignored. Returns 0 or
        -1."""
        try:
            host, port = _split_host(str(local_hostname))
            engine = larder.TransferEngine(map_protocol(protocol) or None,
                                           listen_address=f"{host}:{port}")
        except (larder.LarderError, ValueError, OSError) as e:
            _log.error("initialize: %s", e)
            return -1
        self.close()
        self._engine = engine
        return 0

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str = "p2p") -> int:
        """initialize; ``metadata_type`` is ignored."""
        return self.initialize(local_hostname, metadata_server, protocol, device_name)

    def close(self) -> None:
        """Stops the engine (not in Mooncake's API; dropping the object does the same)."""
        engine, self._engine = self._engine, None
        with self._lock:
            self._peers.clear()
        self._local.clear()
        if engine is not None:
            engine.close()

    def get_rpc_port(self) -> int:
        """The port of this engine's data server; peers pass "ip:port" as target_hostname."""
        if self._engine is None:
            return -1
        return int(self._engine.address.rpartition(":")[2])

    def get_local_address(self) -> str:
        """This engine's "ip:port" (what peers pass as target_hostname). Larder extension."""
        return self._engine.address if self._engine is not None else ""

    # ---- memory ----

    def register_memory(self, buffer_addr: int, capacity: int) -> int:
        """Exports [buffer_addr, buffer_addr + capacity) to peers. Returns 0 or -1 (bad range,
        overlap with a registered buffer)."""
        if self._engine is None or not (_is_address(buffer_addr) and _is_size(capacity)):
            return -1
        for base, (size, _, _) in self._local.items():
            if base < buffer_addr + capacity and buffer_addr < base + size:
                _log.warning("register_memory: 0x%x+%d overlaps 0x%x+%d", buffer_addr, capacity,
                             base, size)
                return -1
        try:
            segment = self._engine.register_segment(_segment_name(buffer_addr), buffer_addr,
                                                    capacity)
        except larder.LarderError as e:
            _log.warning("register_memory: %s", e)
            return -1
        self._local[buffer_addr] = (capacity, segment, None)
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        """Stops exporting the buffer registered at ``buffer_addr``. Returns 0 or -1."""
        entry = self._local.get(buffer_addr)
        if self._engine is None or entry is None:
            return -1
        try:
            self._engine.unregister_segment(entry[1])
        except larder.LarderError as e:
            _log.warning("unregister_memory: %s", e)
            return -1
        del self._local[buffer_addr]
        return 0

    def batch_register_memory(self, buffer_addresses, capacities) -> int:
        """register_memory for each pair; 0 when all succeeded, else -1."""
        if len(buffer_addresses) != len(capacities):
            return -1
        results = [self.register_memory(a, c) for a, c in zip(buffer_addresses, capacities)]
        return 0 if all(r == 0 for r in results) else -1

    def batch_unregister_memory(self, buffer_addresses) -> int:
        """unregister_memory for each address; 0 when all succeeded, else -1."""
        results = [self.unregister_memory(a) for a in buffer_addresses]
        return 0 if all(r == 0 for r in results) else -1

    def allocate_managed_buffer(self, length: int) -> int:
        """Allocates and exports ``length`` zeroed bytes (a memfd: same-host peers reach it over
        shm). Returns its address, or 0 on failure."""
        if self._engine is None or not _is_size(length):
            return 0
        try:
            region = self._engine.allocate_segment_memory(length)
            segment = self._engine.register_segment(_segment_name(region.address), region)
        except larder.LarderError as e:
            _log.warning("allocate_managed_buffer: %s", e)
            return 0
        self._local[region.address] = (region.size, segment, region)
        return region.address

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Unexports and frees a buffer from allocate_managed_buffer. Returns 0 or -1."""
        entry = self._local.get(buffer_addr)
        if entry is None or entry[2] is None:
            return -1
        return self.unregister_memory(buffer_addr)

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copies ``length`` bytes of ``src_ptr`` (bytes-like) to local address ``dest_address``."""
        data = memoryview(src_ptr).cast("B")
        if not _is_address(dest_address) or length < 0 or length > len(data):
            return -1
        ctypes.memmove(dest_address, bytes(data[:length]), length)
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """``length`` bytes from local address ``source_address``."""
        if not _is_address(source_address) or length < 0:
            return b""
        return ctypes.string_at(source_address, length)

    # ---- transfers ----

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int) -> int:
        """Reads ``length`` bytes at the peer's ``peer_buffer_address`` into local ``buffer``.
        Returns 0 or -1."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], TransferOpcode.Read)

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int) -> int:
        """Writes ``length`` bytes of local ``buffer`` to the peer's ``peer_buffer_address``.
        Returns 0 or -1."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], TransferOpcode.Write)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode) -> int:
        """transfer_sync_read or transfer_sync_write, by ``opcode`` (TransferOpcode)."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], opcode)

    def batch_transfer_sync_read(self, target_hostname: str, buffers, peer_buffer_addresses,
                                 lengths) -> int:
        """Reads each (local, peer address, length) triple in one batch. Returns 0 when every
        request succeeded, else -1."""
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Read)

    def batch_transfer_sync_write(self, target_hostname: str, buffers, peer_buffer_addresses,
                                  lengths) -> int:
        """Writes each (local, peer address, length) triple in one batch. Returns 0 or -1."""
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Write)

    def batch_transfer_sync(self, target_hostname: str, buffers, peer_buffer_addresses, lengths,
                            opcode) -> int:
        """One batch of reads or writes (by ``opcode``). Returns 0 or -1."""
        engine = self._engine
        if engine is None:
            _log.warning("transfer: the engine is not initialized")
            return -1
        n = len(buffers)
        if n == 0 or len(peer_buffer_addresses) != n or len(lengths) != n:
            _log.warning("transfer: %d buffers, %d peer addresses, %d lengths", n,
                         len(peer_buffer_addresses), len(lengths))
            return -1
        if not all(_is_address(b) for b in buffers) or not all(_is_size(x) for x in lengths):
            _log.warning("transfer: null local address or non-positive length")
            return -1
        try:
            op = larder.TransferOp.READ if int(opcode) == 0 else larder.TransferOp.WRITE
        except (TypeError, ValueError):
            return -1
        for attempt in range(2):
            try:
                requests = []
                for local, peer, length in zip(buffers, peer_buffer_addresses, lengths):
                    handle, offset = self._locate(engine, target_hostname, peer, length,
                                                  refresh=attempt > 0)
                    requests.append(larder.TransferRequest(op, local, handle, offset, length))
                results = engine.transfer(requests)
            except LookupError as e:  # NotFoundError included: no such buffer at the peer
                if attempt == 0:
                    continue
                _log.warning("transfer to %s: %s", target_hostname, e)
                return -1
            except (larder.LarderError, TypeError, ValueError) as e:
                _log.warning("transfer to %s: %s", target_hostname, e)
                return -1
            failed = [r.error for r in results if r.error is not None]
            if not failed:
                return 0
            stale = any(isinstance(e, (larder.NotFoundError, larder.FailedPreconditionError))
                        for e in failed)
            if attempt == 0 and stale:
                continue  # the peer re-registered its buffers: look them up again
            _log.warning("transfer to %s: %d of %d requests failed; first: %s", target_hostname,
                         len(failed), n, failed[0])
            return -1
        return -1

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The lowest base address among the buffers the peer ``segment_name`` ("ip:port")
        registered, or 0."""
        engine = self._engine
        if engine is None:
            return 0
        try:
            buffers = self._peer_buffers(engine, segment_name, refresh=True)
        except larder.LarderError as e:
            _log.warning("get_first_buffer_address(%s): %s", segment_name, e)
            return 0
        return buffers[0].base if buffers else 0

    def _peer_buffers(self, engine, target: str, refresh: bool) -> list:
        with self._lock:
            cached = self._peers.get(target)
        if cached is not None and not refresh:
            return cached
        buffers = []
        for descriptor in engine.list_peer_segments(target):
            if descriptor.name.startswith(_SEGMENT_PREFIX):
                try:
                    base = int(descriptor.name[len(_SEGMENT_PREFIX):], 16)
                except ValueError:
                    continue
                buffers.append(_PeerBuffer(base, descriptor))
        buffers.sort(key=lambda b: b.base)
        with self._lock:
            old = self._peers.get(target, [])
            self._peers[target] = buffers
        for b in old:  # handles of segments the peer dropped or replaced
            if b.handle is not None:
                try:
                    engine.close_segment(b.handle)
                except larder.LarderError:
                    pass
        return buffers

    def _locate(self, engine, target: str, address: int, length: int, refresh: bool):
        """(segment handle, offset) of [address, address + length) at the peer. Raises
        NotFoundError when no registered buffer of the peer holds the whole range."""
        for pass_refresh in ((True,) if refresh else (False, True)):
            buffers = self._peer_buffers(engine, target, refresh=pass_refresh)
            for b in buffers:
                if b.base <= address and address + length <= b.base + b.size:
                    if b.handle is None:
                        b.handle = engine.open_segment(b.descriptor)
                    return b.handle, address - b.base
        raise larder.NotFoundError(
            f"0x{address:x}+{length} is not inside a buffer that {target} registered")

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""mooncake.store.MooncakeDistributedStore served by larder.Store.

Return conventions are Mooncake's: 0 or a byte count on success, a negative ErrorCode on failure
(-200 NO_AVAILABLE_HANDLE when the pool is full, -704 OBJECT_NOT_FOUND, -706 OBJECT_HAS_LEASE,
-600 INVALID_PARAMS for bad arguments and before setup / after close); ``b""`` from get and
``None`` from get_buffer / the tensor reads for a missing key; 1 / 0 / negative from is_exist.
"""

from __future__ import annotations

import enum
import logging
import operator
import random
import re
import socket
import threading
from collections.abc import Mapping, Sequence

import larder

from ._config import _host_and_port, _is_address, _is_size, load_config, map_protocol
from ._errors import _ARGUMENT_ERRORS, ErrorCode, _report, error_code
from ._tensor import TensorMethods
from ._tensor_files import TensorFileMethods
from ._tensor_parallel import ParallelTensorMethods
from ._tensor_selection import TensorSelectionMethods

_log = logging.getLogger("larder.compat.mooncake")

_INVALID = int(ErrorCode.INVALID_PARAMS)
_U64_MAX = (1 << 64) - 1
# Where a store serves when local_hostname names no port: Mooncake's range for its data port.
_PORT_RANGE = (12300, 14300)
# How many ports of that range setup tries before it lets the system pick one.
_PORT_TRIES = 32


class SoftPinAction(enum.IntEnum):
    """What a put does to its object's soft pin (applied when the object becomes readable)."""

    PRESERVE = 0  # an upserted key keeps its pin and deadline; a new key gets none
    ENABLE = 1  # pinned until now + soft_pin_ttl_ms (the master's default TTL when None)
    DISABLE = 2  # not pinned


class ObjectDataType(enum.IntEnum):
    """What an object holds (Mooncake's tag; Larder stores it nowhere)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicateConfig:
    """Placement of a put, as Mooncake's ReplicateConfig.

    ``replica_num`` replicas (default 1); ``preferred_segment`` / ``preferred_segments``: segment
    names ("ip:port", see MooncakeDistributedStore.get_hostname) to place replicas in first;
    ``with_hard_pin``: never evicted. Soft pins: ``soft_pin_action`` (SoftPinAction, default
    PRESERVE) and ``soft_pin_ttl_ms`` (None, or an unsigned 64-bit int: only with ENABLE); the
    older ``with_soft_pin=True`` means ENABLE with the master's default TTL. A soft-pinned object
    is evicted only when no unpinned one is left, until its TTL passes. ``group_ids`` (one per key
    of a batch), ``prefer_alloc_in_same_node``, ``nof_replica_num`` and ``data_type`` are
    accepted and checked; Larder places the first replica in the writer's own segment, then on
    its host, by default.
    """

    def __init__(self) -> None:
        self.replica_num = 1
        self.with_soft_pin = False
        self.soft_pin_action = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms: int | None = None
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []
        self.prefer_alloc_in_same_node = False
        self.group_ids: list[str] | None = None
        self.nof_replica_num = 0
        self.data_type = ObjectDataType.UNKNOWN

    @property
    def soft_pin_ttl_ms(self) -> int | None:
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value) -> None:
        if value is None:
            self._soft_pin_ttl_ms = None
            return
        if isinstance(value, bool):
            raise TypeError("soft_pin_ttl_ms must be None or an unsigned integer, not bool")
        ttl = operator.index(value)  # TypeError for floats, strings...
        if ttl < 0 or ttl > _U64_MAX:
            raise TypeError(f"soft_pin_ttl_ms must fit an unsigned 64-bit integer, not {ttl}")
        self._soft_pin_ttl_ms = ttl

    def _put_kwargs(self) -> dict:
        preferred = [self.preferred_segment] if self.preferred_segment else []
        preferred += [s for s in self.preferred_segments if s and s not in preferred]
        action = SoftPinAction(int(self.soft_pin_action))
        if action == SoftPinAction.PRESERVE and self.with_soft_pin:
            action = SoftPinAction.ENABLE
        soft_pin = {SoftPinAction.PRESERVE: None, SoftPinAction.ENABLE: "enable",
                    SoftPinAction.DISABLE: "disable"}[action]
        ttl = self._soft_pin_ttl_ms
        if ttl is not None and soft_pin is None:
            soft_pin = "preserve"  # the master refuses a TTL without ENABLE: INVALID_PARAMS
        return {
            "replica_num": max(int(self.replica_num), 0),
            "preferred_segments": preferred or None,
            "pin": bool(self.with_hard_pin),
            "soft_pin": soft_pin,
            "soft_pin_ttl": None if ttl is None else ttl / 1000.0,
        }

    def __repr__(self) -> str:
        return (f"ReplicateConfig(replica_num={self.replica_num}, "
                f"with_soft_pin={self.with_soft_pin}, "
                f"soft_pin_action={SoftPinAction(int(self.soft_pin_action)).name}, "
                f"soft_pin_ttl_ms={self._soft_pin_ttl_ms}, with_hard_pin={self.with_hard_pin}, "
                f"preferred_segment={self.preferred_segment!r}, "
                f"preferred_segments={self.preferred_segments!r})")

    __str__ = __repr__


def _put_kwargs(config: ReplicateConfig | None, keys: int = 1) -> dict:
    """larder.Store put keywords for ``config``; raises ValueError for a config that cannot be
    honoured (group_ids of the wrong length)."""
    if config is None:
        return {}
    if not isinstance(config, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not {type(config).__name__}")
    if config.group_ids is not None and len(config.group_ids) != keys:
        raise ValueError(f"group_ids has {len(config.group_ids)} entries for {keys} keys")
    return config._put_kwargs()


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class Descriptor:
    """Where a memory replica's bytes are: ``buffer_address`` in the owner's address space,
    ``size``, and the owner's data server ``transport_endpoint``."""

    def __init__(self, size: int = 0, buffer_address: int = 0, transport_endpoint: str = ""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor: Descriptor) -> None:
        self.buffer_descriptor = buffer_descriptor


class ReplicaDescriptor:
    """One replica of an object: always a complete memory replica in Larder (it has no disk
    tier). ``segment_name`` is Larder's extension."""

    def __init__(self, replica: larder.ReplicaInfo, size: int) -> None:
        self.status = ReplicaStatus.COMPLETE
        self.segment_name = replica.segment_name
        self._memory = MemoryDescriptor(
            Descriptor(size, replica.address, replica.endpoint or replica.segment_name))

    def is_memory_replica(self) -> bool:
        return True

    def is_disk_replica(self) -> bool:
        return False

    def is_local_disk_replica(self) -> bool:
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        return self._memory

    def get_disk_descriptor(self):
        raise RuntimeError("Larder keeps replicas in memory only: no disk descriptor")

    def __repr__(self) -> str:
        return f"<ReplicaDescriptor {self.status.name} {self._memory.buffer_descriptor!r}>"


def _pattern_text(pattern) -> str:
    """A str pattern, or the text of a compiled re.Pattern (which some callers pass)."""
    if isinstance(pattern, re.Pattern):
        pattern = pattern.pattern
    if isinstance(pattern, bytes):
        pattern = pattern.decode()
    if not isinstance(pattern, str):
        raise TypeError(f"regex_pattern must be a str, not {type(pattern).__name__}")
    return pattern


def _nbytes(value) -> int:
    """The size of a bytes-like value; 0 for anything else (larder.Store refuses it)."""
    try:
        return memoryview(value).nbytes
    except TypeError:
        return 0


def _outside(offset, size, limit: int) -> bool:
    """Whether [offset, offset + size) leaves [0, limit); non-integers are left to the store."""
    try:
        offset, size = operator.index(offset), operator.index(size)
    except TypeError:
        return False
    return offset < 0 or size < 0 or offset + size > limit


def _lists_of(values, n: int, what: str) -> list:
    """``values`` as a list of n sequences; raises ValueError otherwise."""
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{n} keys but {len(values)} {what}")
    for v in values:
        if not isinstance(v, Sequence) or isinstance(v, (str, bytes)):
            raise TypeError(f"each entry of {what} must be a list")
    return values


def _open_store(master: str, host: str, ip: str, port: int, options: dict) -> larder.Store:
    """A larder.Store serving on ``ip`` and named "host:port": on ``port`` when it is not 0,
    else (or when that port is taken) on a free port of Mooncake's range, else on one the system
    picks. Raises the LarderError of the last attempt, or any other failure at once."""
    low, high = _PORT_RANGE
    candidates = random.sample(range(low, high + 1), _PORT_TRIES)
    if port:
        candidates.insert(0, port)
    for candidate in candidates:
        try:
            store = larder.Store(master, local_hostname=f"{ip}:{candidate}",
                                 segment_name=f"{host}:{candidate}", **options)
        except larder.AlreadyExistsError as e:  # the port, or the segment name, is taken
            _log.debug("setup: %s:%d: %s", host, candidate, e)
            continue
        if port and candidate != port:
            _log.warning("setup: %s:%d is taken; serving as %s:%d", host, port, host, candidate)
        return store
    store = larder.Store(master, local_hostname=ip, **options)
    _log.warning("setup: no port of [%d, %d] is free; serving as %s", low, high,
                 store.segment_name)
    return store


class MooncakeDistributedStore(TensorMethods, ParallelTensorMethods, TensorFileMethods,
                               TensorSelectionMethods):
    """Mooncake's store client, backed by :class:`larder.Store`.

    Call ``setup`` first; until then (and after ``close``) calls return INVALID_PARAMS (-600),
    lists of it, ``b""`` or ``None``. Thread-safe.
    """

    def __init__(self) -> None:
        self._store: larder.Store | None = None
        self._http = None
        self._lock = threading.Lock()
        # Guarded by _lock:
        self._pool_left = 0  # setup_dummy: bytes alloc_from_mem_pool may still hand out
        # A setup or setup_dummy was tried (successful or not) since the last close: another is
        # refused until close, as in Mooncake.
        self._set_up = False
        self._local_buffer_size = 0  # the most a copying write stages (setup's argument)
        # batch_replica_clear keeps objects put or read within this many ms (Mooncake's KV lease).
        self._kv_lease_ttl_ms = 5000
        self._registered: dict[int, int] = {}  # register_buffer's ranges: address -> size

    # ---- lifetime ----

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=None,
              local_buffer_size=None, protocol=None, rdma_devices=None, master_server_addr=None,
              engine=None, enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
              enable_client_http_server=False, client_http_port=9300) -> int:
        """Creates the client: contributes ``global_segment_size`` bytes to the pool and mounts
        them with the Larder master at ``master_server_addr``. Also takes one dict (the
        ``setup(config)`` form) with the same keys. Missing values come from load_config().

        ``local_hostname`` is "host" or "host:port". As in Mooncake, the segment is named
        "host:port" (get_hostname), the host as written; without a port (or with port 0), a
        free one in [12300, 14300] is served. A port that is taken (by another store of this
        host, say) is replaced by a free one of that range, with a warning. ``tenant_id``: key
        namespace ("default" is the default tenant). ``enable_client_http_server``: serve this
        client's metrics (by route) on ``client_http_port``. ``local_buffer_size``: the largest
        value a copying write (put, put_parts, put_batch, put_tensor, ...) takes, as Mooncake's
        staging buffer. ``metadata_server`` and ``rdma_devices`` are ignored; ``engine`` (a
        shared TransferEngine) is accepted, but the store moves bytes with its own engine;
        ``enable_ssd_offload`` with ``ssd_offload_path`` makes this client its host's disk
        holder on that directory (Larder's disk tier, docs/disk-tier.md; one process per
        directory; ``LARDER_DISK_CAPACITY`` and the other LARDER_DISK_* settings apply).
        Returns 0, or a negative code (RPC_FAIL when the master is unreachable, INVALID_PARAMS
        for bad values, or when this store was set up, or failed to, since its last close)."""
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
                "enable_ssd_offload": enable_ssd_offload,
                "ssd_offload_path": ssd_offload_path,
                "tenant_id": tenant_id,
                "enable_client_http_server": enable_client_http_server,
                "client_http_port": client_http_port,
            }
        if not self._begin_setup("setup"):
            return _INVALID
        if engine is not None:
            _log.info("setup(engine=...): Larder's store moves bytes with its own engine; the "
                      "shared engine stays the PD connector's")
        try:
            config = load_config(overrides)
            host, port = _host_and_port(str(config["local_hostname"]))
            ip = socket.gethostbyname(host)
        except (ValueError, OSError) as e:
            _log.error("setup: %s", e)
            return _INVALID
        tenant = str(config["tenant_id"]).strip()
        options = {
            "global_segment_size": config["global_segment_size"],
            "local_buffer_size": config["local_buffer_size"],
            "protocol": map_protocol(str(config["protocol"])),
            "tenant_id": "" if tenant in ("", "default") else tenant,
        }
        if config["enable_ssd_offload"]:
            path = str(config["ssd_offload_path"]).strip()
            if not path:
                _log.error("setup: enable_ssd_offload needs ssd_offload_path (a directory of "
                           "this process's own)")
                return _INVALID
            options["disk_path"] = path
            capacity = str(config["ssd_offload_capacity"]).strip()
            if capacity:
                options["disk_capacity"] = capacity
        elif str(config["ssd_offload_path"]).strip():
            _log.info("setup: ssd_offload_path is set but enable_ssd_offload is not: no disk tier")
        try:
            store = _open_store(str(config["master_server_addr"]), host, ip, port, options)
        except larder.LarderError as e:
            _log.error("setup: %s", e)
            return error_code(e)
        except _ARGUMENT_ERRORS as e:
            _log.error("setup: %s", e)
            return _INVALID
        with self._lock:
            self._store = store
            self._local_buffer_size = config["local_buffer_size"]
            self._kv_lease_ttl_ms = config["default_kv_lease_ttl"]
        if config["enable_client_http_server"]:
            from ._http import ClientHttpServer

            try:
                self._http = ClientHttpServer(store, host, int(config["client_http_port"]))
            except OSError as e:
                _log.error("setup: client HTTP server on port %s: %s",
                           config["client_http_port"], e)
                self._drop_store()
                return _INVALID
        return 0

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address) -> int:
        """Standalone mode: attaches to the larder-client daemon at ``server_address`` (its
        "host:port" as Mooncake's client_server_address, "@name" or a socket path), which owns
        the segment and the master traffic, so this process's objects outlive it. Host memory for
        the zero-copy calls comes from ``alloc_from_mem_pool`` (at most ``mem_pool_size`` bytes
        in all) or from MooncakeHostMemAllocator; the copying calls stage through
        ``local_buffer_size`` bytes, which bounds the value a copying write takes. Returns 0,
        RPC_FAIL (-900) when no daemon serves the address, INVALID_PARAMS for bad values or
        when this store was set up, or failed to, since its last close."""
        if not self._begin_setup("setup_dummy"):
            return _INVALID
        if not (_is_size(mem_pool_size) and _is_size(local_buffer_size)
                and isinstance(server_address, str) and server_address):
            return _INVALID
        try:
            lease_ttl_ms = load_config()["default_kv_lease_ttl"]
        except ValueError as e:
            _log.error("setup_dummy: %s", e)
            return _INVALID
        try:
            store = larder.Store.attach(server_address, staging_bytes=local_buffer_size)
        except larder.LarderError as e:
            _log.error("setup_dummy(%s): %s", server_address, e)
            return error_code(e)
        with self._lock:
            self._store = store
            self._pool_left = int(mem_pool_size)
            self._local_buffer_size = int(local_buffer_size)
            self._kv_lease_ttl_ms = lease_ttl_ms
        return 0

    def _begin_setup(self, what: str) -> bool:
        """Marks a setup attempt; False (logged) when one was made since the last close."""
        with self._lock:
            if self._set_up:
                _log.error("%s: this store was set up (or tried to be) already; call close() "
                           "first", what)
                return False
            self._set_up = True
            return True

    def alloc_from_mem_pool(self, size: int) -> int:
        """Standalone mode: ``size`` bytes of host memory shared with the daemon and registered
        for the zero-copy calls (their address), or 0 when the pool given to setup_dummy is
        spent or the store is not attached."""
        store = self._store
        if store is None or not getattr(store, "attached", False) or not _is_size(size):
            return 0
        with self._lock:
            if size > self._pool_left:
                _log.warning("alloc_from_mem_pool(%d): %d bytes of the pool left", size,
                             self._pool_left)
                return 0
            self._pool_left -= size
        try:
            return store.allocate_shared(size)
        except larder.LarderError as e:
            with self._lock:
                self._pool_left += size
            _report("alloc_from_mem_pool", e)
            return 0

    def init_all(self, protocol, device_name, mount_segment_size=16 * 1024 * 1024) -> int:
        """Mooncake's legacy helper: setup() with this protocol, a segment of
        ``mount_segment_size`` bytes and the environment's master."""
        return self.setup({"protocol": protocol, "rdma_devices": device_name,
                           "global_segment_size": mount_segment_size})

    def close(self) -> int:
        """Unmounts this client's segment and stops; setup may be called again. Returns 0 (also
        when never set up)."""
        self._drop_store()
        with self._lock:
            self._set_up = False
        return 0

    def _drop_store(self) -> None:
        with self._lock:
            store, self._store = self._store, None
            http, self._http = self._http, None
            self._registered.clear()
        if http is not None:
            http.close()
        if store is not None:
            store.close()

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 the master cannot be reached."""
        store = self._store
        if store is None:
            return 1
        try:
            store.exist("\x00larder-health")
        except larder.LarderError:
            return 2
        return 0

    def get_hostname(self) -> str:
        """This client's segment name, "host:port" (see setup; use it as
        ReplicateConfig.preferred_segment); "" before setup."""
        store = self._store
        return store.segment_name if store is not None else ""

    def _not_ready(self) -> bool:
        return self._store is None

    def _call(self, what: str, fn, failure=None):
        """Runs fn(store); a LarderError or bad argument becomes its code (or ``failure``)."""
        store = self._store
        if store is None:
            _log.warning("%s: the store is not set up (call setup first)", what)
            return _INVALID if failure is None else failure
        try:
            return fn(store)
        except _ARGUMENT_ERRORS + (larder.LarderError,) as e:
            code = _report(what, e)
            return code if failure is None else failure

    def _batch(self, what: str, keys, fn, failure=None) -> list:
        """Runs a batch call: one result per key; when the call fails as a whole (not set up,
        bad arguments, master down), every key gets its code (or ``failure``)."""
        n = len(keys)
        if n == 0:
            return []
        result = self._call(what, fn)
        if isinstance(result, list):
            return result
        return [result if failure is None else failure] * n

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

    # ---- copying API ----

    def _put_values(self, what, keys, values, config, upsert) -> list:
        """Writes values (bytes-like) through the copying path: a value larger than the local
        buffer is refused (INVALID_PARAMS), as Mooncake's staging allocation refuses it."""
        if len(values) != len(keys):
            _log.warning("%s: %d keys, %d values", what, len(keys), len(values))
            return [_INVALID] * len(keys)
        codes = [_INVALID] * len(keys)
        limit = self._local_buffer_size
        fitting = [i for i, value in enumerate(values) if _nbytes(value) <= limit]
        if len(fitting) < len(keys) and self._store is not None:
            _log.warning("%s: %d of %d values exceed local_buffer_size (%d bytes), which the "
                         "copying calls stage through", what, len(keys) - len(fitting),
                         len(keys), limit)
        fitting_keys = [keys[i] for i in fitting]

        def run(store):
            results = store.batch_put(fitting_keys, [values[i] for i in fitting],
                                      overwrite=upsert, **_put_kwargs(config, len(keys)))
            return self._codes(what, fitting_keys, results, lambda v: 0)

        if self._store is None:
            return self._batch(what, keys, run)
        for i, code in zip(fitting, self._batch(what, fitting_keys, run)):
            codes[i] = code
        return codes

    def put(self, key: str, value, config: ReplicateConfig | None = None) -> int:
        """Stores ``value`` (bytes-like). Returns 0 (also when the key exists) or a negative
        code (NO_AVAILABLE_HANDLE when the pool is full)."""
        return self._put_values("put", [key], [value], config, False)[0]

    def upsert(self, key: str, value, config: ReplicateConfig | None = None) -> int:
        """Stores ``value``, replacing the key's value if it exists. Returns 0 or a code."""
        return self._put_values("upsert", [key], [value], config, True)[0]

    def put_parts(self, key: str, *parts, config: ReplicateConfig | None = None) -> int:
        """Stores the concatenation of ``parts`` (1-D bytes-like objects)."""
        return self._batch_put_parts([key], [list(parts)], config, False)[0]

    def upsert_parts(self, key: str, *parts, config: ReplicateConfig | None = None) -> int:
        """put_parts that replaces an existing value."""
        return self._batch_put_parts([key], [list(parts)], config, True)[0]

    def _batch_put_parts(self, keys, parts, config=None, upsert=False) -> list:
        """Each object is the concatenation of its parts; 0 or a code per key."""
        try:
            values = [b"".join(memoryview(p).cast("B") for p in ps) for ps in parts]
        except _ARGUMENT_ERRORS as e:
            _log.warning("put_parts: parts must be 1-D bytes-like objects: %s", e)
            return [_INVALID] * len(keys)
        return self._put_values("put_parts", keys, values, config, upsert)

    def put_batch(self, keys, values, config: ReplicateConfig | None = None) -> int:
        """Stores every value in one round trip. Returns 0, or the first failed key's code."""
        codes = self._put_values("put_batch", keys, values, config, False)
        return next((c for c in codes if c != 0), 0)

    def upsert_batch(self, keys, values, config: ReplicateConfig | None = None) -> int:
        """put_batch that replaces existing values. Returns 0 or the first code."""
        codes = self._put_values("upsert_batch", keys, values, config, True)
        return next((c for c in codes if c != 0), 0)

    def get(self, key: str) -> bytes:
        """The value, or b"" when missing or on error."""
        return self.get_batch([key])[0]

    def get_batch(self, keys) -> list:
        """The values, b"" for each key missing or failed."""

        def run(store):
            return [b"" if isinstance(v, larder.LarderError) else v
                    for v in store.batch_get(list(keys))]

        return self._batch("get_batch", keys, run, failure=b"")

    def get_buffer(self, key: str):
        """The value in a buffer (``ptr()``, ``size()``, ``len()``, the buffer protocol) read
        straight from its replica without a copy into bytes, or None when missing."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys) -> list:
        """get_buffer for many keys in one round trip: a buffer or None per key."""

        def run(store):
            results = store.batch_get_buffers(list(keys))
            self._codes("batch_get_buffer", keys, results, lambda v: 0)  # logs the first error
            return [None if isinstance(r, larder.LarderError) else r for r in results]

        result = self._batch("batch_get_buffer", keys, run)
        return [None if isinstance(r, int) else r for r in result]

    # ---- zero-copy API ----

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers [buffer_ptr, buffer_ptr + size) of host memory for the zero-copy calls.
        Returns 0 or a negative code (INVALID_PARAMS for a null or empty range or an overlap)."""
        if not (_is_address(buffer_ptr) and _is_size(size)):
            return _INVALID

        def run(store):
            registered = False
            if getattr(store, "attached", False):
                # Standalone mode: the daemon maps the memory itself, so memory from
                # MooncakeHostMemAllocator travels as its memfd.
                from ._buffers import MooncakeHostMemAllocator

                shared = MooncakeHostMemAllocator().fd_of(buffer_ptr)
                if shared is not None and shared[2] >= size:
                    fd, offset, _ = shared
                    store.register_shared_buffer(buffer_ptr, size, fd, offset)
                    registered = True
            if not registered:
                store.register_buffer(buffer_ptr, size)
            # get_into_ranges bounds its writes by this range, as Mooncake does (memory from
            # alloc_from_mem_pool is registered whole underneath).
            with self._lock:
                self._registered[buffer_ptr] = size
            return 0

        return self._call("register_buffer", run)

    def unregister_buffer(self, buffer_ptr: int, size: int | None = None) -> int:
        """Returns 0, or OBJECT_NOT_FOUND when no buffer was registered at ``buffer_ptr``.
        ``size`` is accepted and ignored."""
        if not _is_address(buffer_ptr):
            return _INVALID

        def run(store):
            store.unregister_buffer(buffer_ptr)
            with self._lock:
                self._registered.pop(buffer_ptr, None)
            return 0

        return self._call("unregister_buffer", run)

    def _put_from(self, what, keys, buffer_ptrs, sizes, config, upsert) -> list:
        bad = self._check_batch(keys, buffer_ptrs, sizes)
        if bad is not None:
            return bad

        def run(store):
            results = store.batch_put_from(list(keys), list(buffer_ptrs), list(sizes),
                                           overwrite=upsert, **_put_kwargs(config, len(keys)))
            return self._codes(what, keys, results, lambda v: 0)

        return self._batch(what, keys, run)

    def put_from(self, key: str, buffer_ptr: int, size: int,
                 config: ReplicateConfig | None = None) -> int:
        """Stores ``size`` bytes at ``buffer_ptr`` (inside a registered buffer). Returns 0 or a
        negative code."""
        return self._put_from("put_from", [key], [buffer_ptr], [size], config, False)[0]

    def upsert_from(self, key: str, buffer_ptr: int, size: int,
                    config: ReplicateConfig | None = None) -> int:
        """put_from that replaces an existing value."""
        return self._put_from("upsert_from", [key], [buffer_ptr], [size], config, True)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes,
                       config: ReplicateConfig | None = None) -> list:
        """put_from for every key in one round trip. Returns 0 or a negative code per key."""
        return self._put_from("batch_put_from", keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes,
                          config: ReplicateConfig | None = None) -> list:
        """batch_put_from that replaces existing values."""
        return self._put_from("batch_upsert_from", keys, buffer_ptrs, sizes, config, True)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads the value into [buffer_ptr, buffer_ptr + size) (inside a registered buffer).
        Returns the bytes read, or a negative code (OBJECT_NOT_FOUND, INVALID_PARAMS when the
        value is larger than ``size`` or the buffer is not registered)."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes) -> list:
        """get_into for every key in one round trip: the bytes read or a code per key."""
        bad = self._check_batch(keys, buffer_ptrs, sizes)
        if bad is not None:
            return bad

        def run(store):
            results = store.batch_get_into(list(keys), list(buffer_ptrs), list(sizes))
            return self._codes("batch_get_into", keys, results, int)

        return self._batch("batch_get_into", keys, run)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     config: ReplicateConfig | None = None) -> list:
        """Stores object i as the concatenation of the registered ranges (all_buffer_ptrs[i][j],
        all_sizes[i][j]): one page of a layer-first pool, one slice per layer. Returns 0 or a
        code per key (NO_AVAILABLE_HANDLE, -200, when the pool is full)."""

        def run(store):
            ptrs = _lists_of(all_buffer_ptrs, len(keys), "buffer lists")
            sizes = _lists_of(all_sizes, len(keys), "size lists")
            results = store.batch_put_from_slices(list(keys), ptrs, sizes,
                                                  **_put_kwargs(config, len(keys)))
            return self._codes("batch_put_from_multi_buffers", keys, results, lambda v: 0)

        return self._batch("batch_put_from_multi_buffers", keys, run)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node: bool = False) -> list:
        """Reads object i across the registered ranges (all_buffer_ptrs[i][j], all_sizes[i][j]),
        in order. Returns the bytes read or a code per key."""

        def run(store):
            ptrs = _lists_of(all_buffer_ptrs, len(keys), "buffer lists")
            sizes = _lists_of(all_sizes, len(keys), "size lists")
            results = store.batch_get_into_slices(list(keys), ptrs, sizes)
            return self._codes("batch_get_into_multi_buffers", keys, results, int)

        return self._batch("batch_get_into_multi_buffers", keys, run)

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes) -> list:
        """Ranged reads: for buffer b, key k and fragment f, reads all_sizes[b][k][f] bytes from
        byte all_src_offsets[b][k][f] of the value of all_keys[b][k] into buffer_ptrs[b] +
        all_dst_offsets[b][k][f] (registered memory). Returns [b][k][f] nested results: the bytes
        read or a code per fragment; a key whose lists differ in length gets [INVALID_PARAMS],
        and so does a fragment that ends past the size register_buffer gave buffer_ptrs[b]."""
        try:
            shape_ok = len(all_keys) == len(buffer_ptrs) == len(all_dst_offsets) == \
                len(all_src_offsets) == len(all_sizes)
        except TypeError:
            shape_ok = False
        if not shape_ok:
            _log.warning("get_into_ranges: the outer lists differ in length")
            return []
        keys, offsets, ptrs, sizes, where = [], [], [], [], []
        out: list = []
        with self._lock:
            registered = dict(self._registered)
        for b, base in enumerate(buffer_ptrs):
            limit = registered.get(base)
            row = []
            for k, key in enumerate(all_keys[b]):
                try:
                    dst, src, size = all_dst_offsets[b][k], all_src_offsets[b][k], all_sizes[b][k]
                    valid = len(dst) == len(src) == len(size) and _is_address(base)
                except (TypeError, IndexError):
                    valid = False
                if not valid:
                    row.append([_INVALID])
                    continue
                row.append([0] * len(dst))
                for f in range(len(dst)):
                    if limit is not None and _outside(dst[f], size[f], limit):
                        _log.warning("get_into_ranges: [%s, +%s) runs past the %d bytes "
                                     "registered at 0x%x", dst[f], size[f], limit, base)
                        row[-1][f] = _INVALID
                        continue
                    keys.append(key)
                    offsets.append(src[f])
                    ptrs.append(base + dst[f])
                    sizes.append(size[f])
                    where.append((b, k, f))
            out.append(row)
        if not keys:
            return out

        def run(store):
            return self._codes("get_into_ranges", keys,
                               store.batch_get_ranges(keys, offsets, ptrs, sizes), int)

        codes = self._batch("get_into_ranges", keys, run)
        for (b, k, f), code in zip(where, codes):
            out[b][k][f] = code
        return out

    @staticmethod
    def _check_batch(keys, buffer_ptrs, sizes):
        try:
            lengths_ok = len(buffer_ptrs) == len(keys) and len(sizes) == len(keys)
        except TypeError:
            return [_INVALID] * len(keys)
        if not lengths_ok:
            _log.warning("batch call: %d keys, %d pointers, %d sizes", len(keys),
                         len(buffer_ptrs), len(sizes))
            return [_INVALID] * len(keys)
        if not all(_is_address(p) for p in buffer_ptrs) or not all(_is_size(s) for s in sizes):
            return [_INVALID] * len(keys)
        return None

    # ---- metadata ----

    def is_exist(self, key: str) -> int:
        """1 when the key is stored, 0 when not, a negative code on error."""
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys) -> list:
        """1 / 0 / a negative code per key, in one round trip."""

        def run(store):
            return [error_code(v) if isinstance(v, larder.LarderError) else int(v)
                    for v in store.batch_exist(list(keys))]

        return self._batch("batch_is_exist", keys, run)

    def get_size(self, key: str) -> int:
        """The value's size, or a negative code (OBJECT_NOT_FOUND)."""
        return self._call("get_size", lambda s: s.get_size(key))

    def get_replica_desc(self, key: str) -> list:
        """The key's replicas (ReplicaDescriptor), or [] when missing or on error."""
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys) -> dict:
        """{key: [ReplicaDescriptor, ...]} for the keys found."""

        def run(store):
            out = {}
            for key, info in zip(keys, store.batch_get_object_info(list(keys))):
                if not isinstance(info, larder.LarderError):
                    out[key] = [ReplicaDescriptor(r, info.size) for r in info.replicas]
            return out

        result = self._call("batch_get_replica_desc", run)
        return result if isinstance(result, dict) else {}

    def remove(self, key: str, force: bool = False) -> int:
        """0, OBJECT_NOT_FOUND, OBJECT_HAS_LEASE while a reader holds it (unless ``force``),
        REPLICA_IS_NOT_READY while it is being written, RPC_FAIL when the master is
        unreachable."""
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys, force: bool = False) -> list:
        """0 or a negative code per key."""

        def run(store):
            return self._codes("batch_remove", keys,
                               store.batch_remove(list(keys), force=bool(force)), lambda v: 0)

        return self._batch("batch_remove", keys, run)

    def remove_by_regex(self, regex_pattern, force: bool = False) -> int:
        """Removes the keys of this tenant that match ``regex_pattern`` in full (RE2 syntax: no
        backreferences or lookaround; a compiled re.Pattern is accepted for its text). Returns
        how many, or a negative code."""
        return self._call("remove_by_regex",
                          lambda s: s.remove_by_regex(_pattern_text(regex_pattern),
                                                      force=bool(force)))

    def remove_all(self, force: bool = False) -> int:
        """Removes every object of this tenant no reader holds (all, with ``force``); returns
        how many, or a negative code."""
        return self._call("remove_all", lambda s: s.remove_all(force=bool(force)))

    def batch_replica_clear(self, keys, segment_name: str = "") -> list:
        """Clears the replicas of ``keys`` (on ``segment_name`` only, when given: the others stay
        readable, and an object goes with its last replica) that no reader holds and that were
        not put or read within the KV lease (``default_kv_lease_ttl``, 5 s: Mooncake's master
        keeps each object in a lease that long after each put and read); returns the keys
        cleared."""
        store = self._store
        if store is None or len(keys) == 0:
            return []
        try:
            keys = list(keys)
            results = store.batch_remove(keys, segment=segment_name,
                                         unused_for=self._kv_lease_ttl_ms / 1000)
        except _ARGUMENT_ERRORS + (larder.LarderError,) as e:
            _report("batch_replica_clear", e)
            return []
        return [k for k, r in zip(keys, results) if r is None]

    # ---- Larder extensions ----

    def larder_store(self) -> larder.Store | None:
        """The larder.Store underneath (None before setup)."""
        return self._store


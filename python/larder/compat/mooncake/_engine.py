# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""mooncake.engine.TransferEngine served by larder.TransferEngine."""

from __future__ import annotations

import ctypes
import enum
import itertools
import json
import logging
import os
import pathlib
import threading

import larder

from ._config import _is_address, _is_size, _split_host, map_protocol

_log = logging.getLogger("larder.compat.mooncake")


class TransferOpcode(enum.IntEnum):
    """Direction of a transfer (Mooncake spells the members Read / Write)."""

    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


# Mooncake's batch_id_t is a uint64: its -1 reaches Python as 2**64 - 1.
INVALID_BATCH_ID = (1 << 64) - 1

# The hints Mooncake's binding accepts (TENT transport names); any other raises ValueError there
# too. Larder picks the route itself (local, shm, tcp), so a valid hint changes nothing.
TRANSPORT_HINTS = frozenset({"", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp",
                             "ascend", "sunrise_link", "unspec"})

# Protocols of device-memory fabrics, which Mooncake's engine refuses (initialize returns -1)
# unless it was built with them; Larder's engine moves host memory only.
_DEVICE_FABRICS = frozenset({"nvlink", "nvlink_intra", "hip"})

# How long send_probe waits for the peer's answer.
_PROBE_TIMEOUT_S = 2.0

_SEGMENT_PREFIX = "mem@0x"

# What Mooncake's engine registers at initialize for its managed buffers, unless PASS_ALLOC is a
# non-zero integer: one 2 GiB host buffer, the first buffer of every engine (what a peer's
# get_first_buffer_address finds). Larder's is a sparse memfd: it costs memory only where written.
_POOL_BYTES = 2 << 30

# The segment in which an engine counts the buffers it stopped exporting (a uint64). A same-host
# peer writes a managed buffer through its own mapping, which outlives the owner's registration;
# it reads this count with every synchronous batch and fails the call when one of the buffers it
# used went meanwhile, as Mooncake's engine fails a transfer into a freed buffer.
_UNEXPORTS_SEGMENT = "larder-mc-unexports"

_notify_logged = False
_notify_lock = threading.Lock()


def _pass_alloc() -> bool:
    """Whether PASS_ALLOC asks initialize not to register its buffer (a non-zero integer)."""
    try:
        return int(os.environ.get("PASS_ALLOC", "0")) != 0
    except ValueError:
        _log.warning("ignoring PASS_ALLOC=%r (not an integer)", os.environ.get("PASS_ALLOC"))
        return False


def _check_hint(transport_hint) -> None:
    """Raises ValueError, as Mooncake does, for a hint that is not one of TRANSPORT_HINTS."""
    if not isinstance(transport_hint, str) or transport_hint not in TRANSPORT_HINTS:
        raise ValueError(f"unknown transport hint {transport_hint!r}; expected one of "
                         f"{sorted(TRANSPORT_HINTS)}")


def _note_notify(notify) -> None:
    """Larder has no notification channel: a notify is accepted and dropped (logged once)."""
    global _notify_logged
    if notify is None:
        return
    with _notify_lock:
        first, _notify_logged = not _notify_logged, True
    if first:
        _log.debug("transfer notifications are not delivered by Larder (first: %r)", notify)


def _transfer_timeout(total_bytes: int) -> float:
    """Mooncake's sync-transfer deadline: MC_TRANSFER_TIMEOUT seconds (at least 5, default 30),
    plus 1 ns per byte."""
    try:
        base = int(os.environ.get("MC_TRANSFER_TIMEOUT", "30"))
    except ValueError:
        base = 30
    return max(base, 5) + total_bytes * 1e-9


def _segment_name(base: int) -> str:
    """The name a registered buffer is exported under: its base address, so that peers can map
    a virtual address back to (segment, offset)."""
    return f"{_SEGMENT_PREFIX}{base:x}"


def _segment_key(descriptor) -> tuple:
    """What identifies one registration of a segment: equal keys, same memory."""
    return (descriptor.engine_id, descriptor.segment_id, descriptor.epoch)


class TransferNotify:
    """A notification sent with a transfer (``name``: the receiver's segment, ``msg``: text).

    Accepted by ``transfer_sync`` / ``batch_transfer_sync`` for compatibility; Larder does not
    deliver it (``get_notifies`` is always empty).
    """

    __slots__ = ("name", "msg")

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


class InnerTransferEngine:
    """What ``TransferEngine.get_engine()`` returns: an opaque handle on that engine, to pass to
    ``MooncakeDistributedStore.setup(engine=...)`` (Larder's store uses its own engine, and says
    so)."""

    __slots__ = ("_outer",)

    def __init__(self, outer: TransferEngine) -> None:
        self._outer = outer

    def __repr__(self) -> str:
        return f"<InnerTransferEngine of {self._outer!r}>"


class _PeerBuffer:
    __slots__ = ("base", "size", "descriptor", "handle")

    def __init__(self, base: int, descriptor) -> None:
        self.base = base
        self.size = descriptor.size
        self.descriptor = descriptor
        self.handle = None  # guarded by TransferEngine._lock


class _PeerUnexports:
    """A same-host peer's unexport count, open here, and its value when its buffers were
    listed."""

    __slots__ = ("handle", "seen")

    def __init__(self, handle: int, seen: int) -> None:
        self.handle = handle
        self.seen = seen


class _Batch:
    """A batch handed out by batch_transfer_async: the larder engine that runs it and its id."""

    __slots__ = ("engine", "batch")

    def __init__(self, engine, batch: int) -> None:
        self.engine = engine
        self.batch = batch


class TransferEngine:
    """Mooncake's TransferEngine (``mooncake.engine``), backed by :class:`larder.TransferEngine`.

    A buffer passed to ``register_memory`` (or returned by ``allocate_managed_buffer``) is
    exported as a segment named after its base address; a peer that knows an address inside it
    reads and writes it with ``transfer_sync_read`` / ``transfer_sync_write(target_hostname,
    local_addr, peer_addr, length)``. ``target_hostname`` is the peer's "ip:port": its
    ``initialize`` host and ``get_rpc_port()``. Addresses outside every buffer the peer
    registered are rejected (-1). Local addresses need no registration.

    Device (GPU) memory works where the engine has Larder's device transport (``LARDER_PROTOCOL``
    naming ``device``, e.g. ``device,tcp``): ``register_memory`` asks the device backend which
    memory a pointer is and exports device memory as such; a peer of the same host reaches it
    natively (the device route), a peer of another host over tcp through pinned staging buffers
    on both ends (route ``tcp-staged``), and local device buffers are staged the same way. The
    device transport initializes on the current device of the thread that first registers
    device memory (``larder.set_current_device``, or the framework's ``cudaSetDevice``).
    Without it, every address must be host memory.

    Same-host peers reach memory from ``allocate_managed_buffer`` over shm; memory the
    application owns (``register_memory``) is reached over tcp. Every transfer method takes
    ``transport_hint`` (one of TRANSPORT_HINTS, else ValueError); the hint is advisory: Larder
    picks the route. Transfers get Mooncake's deadline: ``MC_TRANSFER_TIMEOUT`` seconds (at
    least 5, default 30) plus 1 ns per byte. Thread-safe.
    """

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        self._engine: larder.TransferEngine | None = None
        self._lock = threading.Lock()  # guards _peers, their handles, _batches
        self._peers: dict[str, list[_PeerBuffer]] = {}
        self._batches: dict[int, _Batch] = {}
        self._batch_ids = itertools.count(1)
        self._memory_lock = threading.Lock()  # guards _local, _aliases
        self._local: dict[int, tuple[int, int, object]] = {}  # base -> (size, segment id, region)
        self._aliases: set[int] = set()  # register_memory calls inside a managed buffer
        self._pool = 0  # base of the buffer registered at initialize, or 0
        self._unexports = None  # the region counting unexported buffers
        self._peer_unexports: dict[str, _PeerUnexports] = {}  # guarded by _lock

    def initialize(self, local_hostname: str, metadata_server: str = "P2PHANDSHAKE",
                   protocol: str = "tcp", device_name: str = "") -> int:
        """Starts the engine's data server on ``local_hostname`` ("ip" or "ip:port"; port 0 or
        none picks a free one). ``metadata_server`` and ``device_name`` are ignored. Returns 0 or
        -1; -1 also for the device fabrics "nvlink", "nvlink_intra" and "hip", as Mooncake's
        engine built without them (SUPPORT_MNNVL, SUPPORT_INTRA_NVLINK, SUPPORT_HIP) refuses
        them. As Mooncake's does, it then registers a 2 GiB buffer (sparse: it costs memory only
        where written; shared with same-host peers over shm), the engine's first buffer, unless
        the environment sets ``PASS_ALLOC`` to a non-zero integer. A failure to allocate it is
        logged and leaves the engine without it."""
        if str(protocol or "").strip().lower() in _DEVICE_FABRICS:
            _log.error("initialize: protocol %r moves device memory, which Larder's Mooncake "
                       "engine does not reach (host memory only)", protocol)
            return -1
        try:
            host, port = _split_host(str(local_hostname))
            engine = larder.TransferEngine(map_protocol(protocol, role="engine") or None,
                                           listen_address=f"{host}:{port}")
        except (larder.LarderError, ValueError, OSError) as e:
            _log.error("initialize: %s", e)
            return -1
        self.close()
        self._engine = engine
        self._register_unexports(engine)
        if not _pass_alloc():
            self._register_pool(engine)
        return 0

    def _register_unexports(self, engine) -> None:
        try:
            region = engine.allocate_segment_memory(8)
            engine.register_segment(_UNEXPORTS_SEGMENT, region)
        except larder.LarderError as e:
            _log.warning("initialize: the count of unexported buffers: %s", e)
            return
        with self._memory_lock:
            self._unexports = region

    def _register_pool(self, engine) -> None:
        try:
            region = engine.allocate_segment_memory(_POOL_BYTES)
            segment = engine.register_segment(_segment_name(region.address), region)
        except larder.LarderError as e:
            _log.warning("initialize: the %d-byte buffer of managed memory: %s", _POOL_BYTES, e)
            return
        with self._memory_lock:
            self._local[region.address] = (region.size, segment, region)
            self._pool = region.address

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str = "p2p") -> int:
        """initialize; ``metadata_type`` is ignored."""
        return self.initialize(local_hostname, metadata_server, protocol, device_name)

    def close(self) -> None:
        """Stops the engine (not in Mooncake's API; dropping the object does the same). Batches
        not yet collected are dropped."""
        engine, self._engine = self._engine, None
        with self._lock:
            self._peers.clear()
            self._peer_unexports.clear()
            self._batches.clear()
        with self._memory_lock:
            self._local.clear()
            self._aliases.clear()
            self._pool = 0
            self._unexports = None
        if engine is not None:
            engine.close()

    def get_rpc_port(self) -> int:
        """The port of this engine's data server; peers pass "ip:port" as target_hostname."""
        if self._engine is None:
            return -1
        return int(self._engine.address.rpartition(":")[2])

    def larder_engine(self) -> larder.TransferEngine | None:
        """The larder.TransferEngine underneath (None before initialize). Larder extension."""
        return self._engine

    def get_local_address(self) -> str:
        """This engine's "ip:port" (what peers pass as target_hostname). Larder extension."""
        return self._engine.address if self._engine is not None else ""

    def get_engine(self) -> InnerTransferEngine:
        """A handle on this engine for ``MooncakeDistributedStore.setup(engine=...)``."""
        return InnerTransferEngine(self)

    def get_engine_ptr(self) -> int:
        """0: there is no native Mooncake engine to point at (Mooncake returns its address for
        C++ code to use, which cannot work with Larder)."""
        return 0

    def get_local_topology(self, device_name: str | None = None) -> str:
        """Mooncake's topology JSON for host memory only: one ``"cpu:<numa node>"`` entry per
        NUMA node, each with empty preferred and available device lists (Larder uses no RDMA
        devices). ``device_name`` is ignored."""
        nodes = sorted(int(p.name[4:]) for p in pathlib.Path("/sys/devices/system/node").glob(
            "node[0-9]*")) or [0]
        return json.dumps({f"cpu:{n}": [[], []] for n in nodes})

    def get_notifies(self) -> list:
        """Notifications received: always [] (Larder has no notification channel)."""
        return []

    def warmup_efa_segment(self, segment_name: str) -> int:
        """0: there is no EFA to warm up."""
        return 0

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the engine at ``peer_server_name`` ("ip:port") answers a segment listing
        within 2 s; -1 when it does not, or when this engine is not initialized."""
        engine = self._engine
        if engine is None:
            return -1
        try:
            engine.list_peer_segments(str(peer_server_name), timeout=_PROBE_TIMEOUT_S)
        except larder.LarderError as e:
            _log.info("send_probe(%s): %s", peer_server_name, e)
            return -1
        return 0

    def release_remote_segment(self, target_hostname: str) -> int:
        """Forgets what this engine cached about ``target_hostname``'s buffers; returns the
        number of open segment handles it closed. The next transfer to it lists them again."""
        engine = self._engine
        with self._lock:
            buffers = self._peers.pop(target_hostname, [])
            handles = [b.handle for b in buffers if b.handle is not None]
            unexports = self._peer_unexports.pop(target_hostname, None)
        if unexports is not None:
            self._close_handle(engine, unexports.handle)
        return sum(self._close_handle(engine, h) for h in handles)

    # ---- memory ----

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Exports [buffer_addr, buffer_addr + capacity) to peers (device memory as such, where
        the engine has the device transport; see the class). A range inside
        a buffer from allocate_managed_buffer is already exported: 0, and nothing changes.
        ``location`` is ignored. Returns 0 or -1 (not initialized, bad range, overlap with a
        registered buffer)."""
        engine = self._engine
        if engine is None or not (_is_address(buffer_addr) and _is_size(capacity)):
            return -1
        buffer_addr, capacity = int(buffer_addr), int(capacity)
        with self._memory_lock:
            for base, (size, _, region) in self._local.items():
                if base < buffer_addr + capacity and buffer_addr < base + size:
                    if region is not None and base <= buffer_addr and \
                            buffer_addr + capacity <= base + size:
                        self._aliases.add(buffer_addr)
                        return 0
                    _log.warning("register_memory: 0x%x+%d overlaps 0x%x+%d", buffer_addr,
                                 capacity, base, size)
                    return -1
            try:
                segment = engine.register_segment(_segment_name(buffer_addr), buffer_addr,
                                                  capacity)
            except larder.LarderError as e:
                _log.warning("register_memory: %s", e)
                return -1
            self._local[buffer_addr] = (capacity, segment, None)
        return 0

    def unregister_memory(self, buffer_addr: int) -> int:
        """Stops exporting the buffer registered at ``buffer_addr``. Returns 0 or -1."""
        engine = self._engine
        with self._memory_lock:
            if buffer_addr in self._aliases:
                self._aliases.discard(buffer_addr)
                return 0
            entry = self._local.get(buffer_addr)
            if engine is None or entry is None:
                return -1
            try:
                engine.unregister_segment(entry[1])
            except larder.LarderError as e:
                _log.warning("unregister_memory: %s", e)
                return -1
            del self._local[buffer_addr]
            if self._unexports is not None:  # under _memory_lock: one writer at a time
                count = ctypes.c_uint64.from_address(self._unexports.address)
                count.value += 1
        return 0

    def batch_register_memory(self, buffer_addresses, capacities, location: str = "*") -> int:
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
        engine = self._engine
        if engine is None or not _is_size(length):
            return 0
        try:
            region = engine.allocate_segment_memory(int(length))
            segment = engine.register_segment(_segment_name(region.address), region)
        except larder.LarderError as e:
            _log.warning("allocate_managed_buffer: %s", e)
            return 0
        with self._memory_lock:
            self._local[region.address] = (region.size, segment, region)
        return region.address

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Unexports and frees a buffer from allocate_managed_buffer. Returns 0 or -1 (also for
        the buffer registered at initialize, which lives as long as the engine)."""
        with self._memory_lock:
            entry = self._local.get(buffer_addr)
            pool = self._pool
        if entry is None or entry[2] is None or buffer_addr == pool:
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

    # ---- synchronous transfers: 0 when every request succeeded, else -1 ----

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        """Reads ``length`` bytes at the peer's ``peer_buffer_address`` into local ``buffer``.
        Returns 0 or -1."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], TransferOpcode.Read,
                                        transport_hint=transport_hint)

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        """Writes ``length`` bytes of local ``buffer`` to the peer's ``peer_buffer_address``.
        Returns 0 or -1."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], TransferOpcode.Write,
                                        transport_hint=transport_hint)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode, notify: TransferNotify | None = None,
                      transport_hint: str = "") -> int:
        """transfer_sync_read or transfer_sync_write, by ``opcode`` (TransferOpcode). A
        ``notify`` is accepted and not delivered."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], opcode, notify, transport_hint)

    def batch_transfer_sync_read(self, target_hostname: str, buffers, peer_buffer_addresses,
                                 lengths, transport_hint: str = "") -> int:
        """Reads each (local, peer address, length) triple in one batch. Returns 0 when every
        request succeeded, else -1 (also for lists of different lengths)."""
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Read,
                                        transport_hint=transport_hint)

    def batch_transfer_sync_write(self, target_hostname: str, buffers, peer_buffer_addresses,
                                  lengths, transport_hint: str = "") -> int:
        """Writes each (local, peer address, length) triple in one batch. Returns 0 or -1."""
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Write,
                                        transport_hint=transport_hint)

    def batch_transfer_sync(self, target_hostname: str, buffers, peer_buffer_addresses, lengths,
                            opcode, notify: TransferNotify | None = None,
                            transport_hint: str = "") -> int:
        """One batch of reads or writes (by ``opcode``), waited for. A ``notify`` is accepted and
        not delivered. Returns 0 or -1."""
        _check_hint(transport_hint)
        _note_notify(notify)
        engine = self._engine
        op = self._checked_op(engine, buffers, peer_buffer_addresses, lengths, opcode)
        if op is None:
            return -1
        n = len(buffers)
        timeout = _transfer_timeout(sum(int(x) for x in lengths))
        for attempt in range(2):
            used: list = []
            unexports = ctypes.c_uint64()
            try:
                requests = self._requests(engine, target_hostname, buffers,
                                          peer_buffer_addresses, lengths, op,
                                          refresh=attempt > 0, used=used)
                seen = self._unexports_request(engine, target_hostname, unexports, requests)
                results = engine.transfer(requests, timeout=timeout)
            except (larder.LarderError, LookupError, TypeError, ValueError) as e:
                _log.warning("transfer to %s: %s", target_hostname, e)
                return -1
            failed = [r.error for r in results if r.error is not None]
            if not failed and seen is not None and unexports.value != seen:
                gone = self._gone(engine, target_hostname, used)
                if gone is not None:
                    _log.warning("transfer to %s: %s", target_hostname, gone)
                    return -1
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

    # ---- asynchronous transfers: a batch id, then its status ----

    def batch_transfer_async_read(self, target_hostname: str, buffers, peer_buffer_addresses,
                                  lengths, transport_hint: str = "") -> int:
        """Starts reading each (local, peer address, length) triple; see batch_transfer_async."""
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Read, transport_hint)

    def batch_transfer_async_write(self, target_hostname: str, buffers, peer_buffer_addresses,
                                   lengths, transport_hint: str = "") -> int:
        """Starts writing each (local, peer address, length) triple; see batch_transfer_async."""
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Write, transport_hint)

    def batch_transfer_async(self, target_hostname: str, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint: str = "") -> int:
        """Starts one batch of reads or writes (by ``opcode``) and returns its batch id, a
        positive int, for get_batch_transfer_status or transfer_check_status. Local buffers must
        stay valid until the batch is complete. Returns 0 when the batch is refused (not
        initialized, lists of different lengths, bad values, an address outside the peer's
        buffers) and 2**64 - 1 when the peer cannot be reached, as Mooncake does when it cannot
        open the segment."""
        _check_hint(transport_hint)
        engine = self._engine
        op = self._checked_op(engine, buffers, peer_buffer_addresses, lengths, opcode)
        if op is None:
            return 0
        try:
            requests = self._requests(engine, target_hostname, buffers, peer_buffer_addresses,
                                      lengths, op, refresh=False)
        except LookupError as e:  # NotFoundError included: no such buffer at the peer
            _log.warning("transfer to %s: %s", target_hostname, e)
            return 0
        except larder.LarderError as e:
            _log.warning("transfer to %s: %s", target_hostname, e)
            return INVALID_BATCH_ID
        except (TypeError, ValueError) as e:
            _log.warning("transfer to %s: %s", target_hostname, e)
            return 0
        try:
            batch = engine.submit(requests,
                                  timeout=_transfer_timeout(sum(int(x) for x in lengths)))
        except larder.LarderError as e:
            _log.warning("transfer to %s: %s", target_hostname, e)
            return 0
        with self._lock:
            batch_id = next(self._batch_ids)
            self._batches[batch_id] = _Batch(engine, batch)
        return batch_id

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, transport_hint: str = "") -> int:
        """Starts writing ``length`` bytes of local ``buffer`` to the peer's
        ``peer_buffer_address``; returns a batch id for transfer_check_status, or what
        batch_transfer_async returns for a failure, as Mooncake's does: 0 when the write is
        refused, 2**64 - 1 when the peer cannot be reached."""
        return self.batch_transfer_async(target_hostname, [buffer], [peer_buffer_address],
                                         [length], TransferOpcode.Write, transport_hint)

    def get_batch_transfer_status(self, batch_ids) -> int:
        """Waits for every batch of ``batch_ids`` to finish and frees them all. Returns 0 when
        every request of every batch succeeded, -1 when one failed or timed out, or an id is
        unknown (never handed out, already freed, or 0 / 2**64 - 1 from a refused submit)."""
        ids = list(batch_ids)
        with self._lock:
            batches = [self._batches.pop(i, None) for i in ids]
        ok = True
        for position, (batch_id, batch) in enumerate(zip(ids, batches)):
            if batch is None:
                _log.warning("get_batch_transfer_status: unknown batch id %s", batch_id)
                ok = False
                continue
            try:
                batch.engine.wait(batch.batch)
            except larder.LarderError as e:
                _log.warning("batch %s: %s", batch_id, e)
                ok = False
            except BaseException:  # KeyboardInterrupt: keep the batches not yet collected
                with self._lock:
                    for i, b in zip(ids[position:], batches[position:]):
                        if b is not None:
                            self._batches[i] = b
                raise
            self._release(batch)
        return 0 if ok else -1

    def transfer_check_status(self, batch_id: int) -> int:
        """Does not block. 1: the batch completed (id freed); 0: still running; -1: a request
        failed, or the id is unknown (id freed); -2: a request ran past its deadline (id freed:
        Larder ends timed-out requests)."""
        with self._lock:
            batch = self._batches.get(batch_id)
        if batch is None:
            return -1
        try:
            if not batch.engine.poll(batch.batch):
                return 0
        except larder.LarderError as e:  # the engine was closed or re-initialized
            _log.warning("batch %s: %s", batch_id, e)
            with self._lock:
                self._batches.pop(batch_id, None)
            return -1
        with self._lock:
            if self._batches.pop(batch_id, None) is None:
                return -1  # another thread collected it meanwhile
        try:
            errors = [r.error for r in batch.engine.results(batch.batch) if r.error is not None]
        except larder.LarderError as e:
            _log.warning("batch %s: %s", batch_id, e)
            return -1
        finally:
            self._release(batch)
        if not errors:
            return 1
        _log.warning("batch %s: %d requests failed; first: %s", batch_id, len(errors), errors[0])
        if any(isinstance(e, larder.DeadlineExceededError) for e in errors):
            return -2
        return -1

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The base address of the first buffer that the peer ``segment_name`` ("ip:port") still
        registers (the oldest registration: the buffer from its initialize, unless PASS_ALLOC),
        or 0 when it registers none."""
        engine = self._engine
        if engine is None:
            return 0
        try:
            buffers = self._peer_buffers(engine, segment_name, refresh=True)
        except larder.LarderError as e:
            _log.warning("get_first_buffer_address(%s): %s", segment_name, e)
            return 0
        if not buffers:
            return 0
        return min(buffers, key=lambda b: b.descriptor.segment_id).base

    # ---- internals ----

    @staticmethod
    def _checked_op(engine, buffers, peer_buffer_addresses, lengths, opcode):
        """The larder.TransferOp of a batch call, or None (logged) when the call is malformed or
        the engine is not initialized."""
        if engine is None:
            _log.warning("transfer: the engine is not initialized")
            return None
        n = len(buffers)
        if n == 0 or len(peer_buffer_addresses) != n or len(lengths) != n:
            _log.warning("transfer: %d buffers, %d peer addresses, %d lengths", n,
                         len(peer_buffer_addresses), len(lengths))
            return None
        if not all(_is_address(b) for b in buffers) or not all(_is_size(x) for x in lengths):
            _log.warning("transfer: null local address or non-positive length")
            return None
        try:
            code = int(opcode)
        except (TypeError, ValueError):
            code = None
        if code not in (TransferOpcode.Read, TransferOpcode.Write):
            _log.warning("transfer: opcode %r is neither Read (0) nor Write (1)", opcode)
            return None
        return larder.TransferOp.READ if code == TransferOpcode.Read else larder.TransferOp.WRITE

    def _requests(self, engine, target: str, buffers, peer_buffer_addresses, lengths, op,
                  refresh: bool, used: list | None = None) -> list:
        """The larder.TransferRequests of a batch call (the sync and async paths share them).
        ``refresh``: list the peer's buffers again first. ``used`` receives (address, length,
        segment key) of each request. Raises NotFoundError when a range is not inside one buffer
        the peer registered, LarderError when the peer cannot be reached."""
        if refresh:
            self._peer_buffers(engine, target, refresh=True)
        requests = []
        for local, peer, length in zip(buffers, peer_buffer_addresses, lengths):
            handle, offset, key = self._locate(engine, target, int(peer), int(length))
            requests.append(larder.TransferRequest(op, int(local), handle, offset, int(length)))
            if used is not None:
                used.append((int(peer), int(length), key))
        return requests

    def _unexports_request(self, engine, target: str, into: ctypes.c_uint64,
                           requests: list):
        """Adds to ``requests`` a read of the unexport count of ``target`` into ``into`` when
        this engine maps the peer's memory (shm); returns the count its buffer list was taken
        at, or None (another route, where the peer itself refuses unexported buffers)."""
        with self._lock:
            entry = self._peer_unexports.get(target)
            if entry is None or entry.handle is None:
                return None
            handle, seen = entry.handle, entry.seen
        requests.append(larder.TransferRequest(larder.TransferOp.READ, ctypes.addressof(into),
                                               handle, 0, 8))
        return seen

    def _gone(self, engine, target: str, used: list) -> str | None:
        """After the peer unexported buffers during a transfer: lists its buffers again and
        says which range of ``used`` was in a buffer that is gone (None when none was)."""
        buffers = self._peer_buffers(engine, target, refresh=True)
        live = {_segment_key(b.descriptor) for b in buffers}
        for address, length, key in used:
            if key not in live:
                return (f"0x{address:x}+{length} was in a buffer that {target} unregistered "
                        "during the transfer")
        return None

    def _watch_unexports(self, engine, target: str, descriptors: list) -> bool:
        """Opens the peer's unexport count when its memory is mapped here (shm) and records its
        value now; True when it did (the caller then lists the buffers again, so that the count
        predates the listing it uses)."""
        descriptor = next((d for d in descriptors if d.name == _UNEXPORTS_SEGMENT), None)
        with self._lock:
            old = self._peer_unexports.pop(target, None)
        if old is not None and old.handle is not None:
            self._close_handle(engine, old.handle)
        if descriptor is None:
            return False
        handle = engine.open_segment(descriptor)
        if engine.segment_route(handle) != "shm":
            self._close_handle(engine, handle)
            return False
        count = ctypes.c_uint64()
        results = engine.transfer([larder.TransferRequest(
            larder.TransferOp.READ, ctypes.addressof(count), handle, 0, 8)],
            timeout=_PROBE_TIMEOUT_S)
        if results[0].error is not None:
            self._close_handle(engine, handle)
            raise results[0].error
        with self._lock:
            self._peer_unexports[target] = _PeerUnexports(handle, count.value)
        return True

    def _release(self, batch: _Batch) -> None:
        try:
            batch.engine.release(batch.batch)
        except larder.LarderError as e:  # closed meanwhile: the batch went with the engine
            _log.debug("release: %s", e)

    @staticmethod
    def _close_handle(engine, handle) -> bool:
        if engine is None:
            return False
        try:
            engine.close_segment(handle)
        except larder.LarderError:
            return False
        return True

    def _peer_buffers(self, engine, target: str, refresh: bool) -> list:
        """The buffers ``target`` registered, sorted by base address: cached, or listed again
        when ``refresh`` (or not cached). A refresh keeps the open handles of segments that did
        not change, so concurrent transfers through them are not disturbed."""
        with self._lock:
            cached = self._peers.get(target)
        if cached is not None and not refresh:
            return cached
        buffers = []
        descriptors = engine.list_peer_segments(target)
        if self._watch_unexports(engine, target, descriptors):
            descriptors = engine.list_peer_segments(target)
        for descriptor in descriptors:
            if descriptor.name.startswith(_SEGMENT_PREFIX):
                try:
                    base = int(descriptor.name[len(_SEGMENT_PREFIX):], 16)
                except ValueError:
                    continue
                buffers.append(_PeerBuffer(base, descriptor))
        buffers.sort(key=lambda b: b.base)
        with self._lock:
            kept = {_segment_key(b.descriptor): b for b in self._peers.get(target, [])
                    if b.handle is not None}
            for b in buffers:
                previous = kept.pop(_segment_key(b.descriptor), None)
                if previous is not None:
                    b.handle = previous.handle
            self._peers[target] = buffers
        for b in kept.values():  # handles of segments the peer dropped or replaced
            self._close_handle(engine, b.handle)
        return buffers

    def _locate(self, engine, target: str, address: int, length: int):
        """(segment handle, offset, segment key) of [address, address + length) at the peer; an
        address that the cache does not hold lists the peer's buffers again. Raises
        NotFoundError when no registered buffer of the peer holds the whole range."""
        for refresh in (False, True):
            for b in self._peer_buffers(engine, target, refresh=refresh):
                if b.base <= address and address + length <= b.base + b.size:
                    return (self._handle(engine, target, b), address - b.base,
                            _segment_key(b.descriptor))
        raise larder.NotFoundError(
            f"0x{address:x}+{length} is not inside a buffer that {target} registered")

    def _handle(self, engine, target: str, buffer: _PeerBuffer) -> int:
        """The open handle of a peer buffer, opening it on first use. A buffer that a concurrent
        refresh replaced shares the handle of its replacement, so no handle is left behind."""
        with self._lock:
            if buffer.handle is not None:
                return buffer.handle
        handle = engine.open_segment(buffer.descriptor)
        key = _segment_key(buffer.descriptor)
        with self._lock:
            current = next((c for c in self._peers.get(target, [])
                            if _segment_key(c.descriptor) == key), None)
            if current is not None and current.handle is None:
                current.handle = handle
            winner = current.handle if current is not None else None
            buffer.handle = winner
        if winner != handle:
            self._close_handle(engine, handle)
        if winner is None:
            raise larder.NotFoundError(f"{target} no longer exports segment "
                                       f"'{buffer.descriptor.name}'")
        return winner

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake's host-memory allocator and registered buffer pool.

``MooncakeHostMemAllocator`` hands out zeroed host memory by address, as Mooncake's does. Each
allocation is its own memfd ("larder-host-mem") mapped MAP_SHARED, so that the same pages can be
handed to another process by file descriptor (``fd_of``, Larder's extension). The allocation table
is process-wide: any allocator instance frees or looks up any allocation, like Mooncake's
``ShmHelper`` singleton.

``BufferPool`` (alias ``RegisteredBufferPool``) leases memory that is registered with a store, for
the zero-copy calls (``put_from``, ``get_into``, ...). Where this differs from Mooncake's native
pool:

* The pool owns its memory instead of carving the store's local buffer: it allocates regions with
  the allocator above, registers each with the store once, and splits them into power-of-two
  size classes (a buddy allocator, so freed blocks merge back). A request above
  ``max_size_class`` gets a dedicated region, registered on acquire and unregistered on release.
* ``max_bytes=0`` means 1 GiB (Mooncake: twice the store's local buffer).
* ``alignment`` is the granularity of region sizes; addresses are page-aligned, not
  ``alignment``-aligned.
* ``prewarm`` allocates and registers regions ahead (Mooncake's native pool ignores it when the
  store has a local buffer).
* Argument values the pool refuses raise ``BufferPoolArgumentError``, a ``RuntimeError`` (what
  Mooncake's native pool raises) that is also a ``ValueError``; wrong types raise ``TypeError``;
  pool states raise ``RuntimeError`` with Mooncake's messages ("buffer pool is exhausted", "timed
  out waiting for buffer", "requested buffer size exceeds pool capacity", "buffer pool is
  closed").

This module uses only the standard library (no torch, no larder extension).
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import dataclasses
import errno
import fcntl
import functools
import logging
import mmap
import operator
import os
import threading
import time
import weakref

_log = logging.getLogger("larder.compat.mooncake")

_PAGE = mmap.PAGESIZE
_DEFAULT_MAX_BYTES = 1 << 30
_MEMFD_NAME = "larder-host-mem"
# posix_fallocate errors that mean "this file system cannot reserve", not "out of memory".
_FALLOCATE_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 62


def _as_size(value) -> int | None:
    """``value`` as an int, or None for a bool or a non-integer."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _next_power_of_two(value: int) -> int:
    return 1 << (max(value, 1) - 1).bit_length()


class BufferPoolArgumentError(RuntimeError, ValueError):
    """An argument value the buffer pool refuses (an alignment that is not a power of two, a
    negative size, ...): a RuntimeError, as Mooncake's native pool raises, and a ValueError."""


# ---- host memory ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _HostMapping:
    address: int
    size: int
    fd: int
    mapping: mmap.mmap


_host_lock = threading.Lock()
_host_mappings: dict[int, _HostMapping] = {}  # guarded by _host_lock; keyed by address
_host_addresses: list[int] = []  # guarded by _host_lock; the keys of _host_mappings, sorted


class MooncakeHostMemAllocator:
    """Zeroed, writable host memory by address; each allocation is a MAP_SHARED memfd mapping.

    Thread-safe. All instances share one process-wide table, so memory allocated through one
    instance can be freed or looked up through another.
    """

    def alloc(self, size) -> int:
        """Returns the address of ``size`` zeroed, writable bytes, valid until ``free`` (or process
        exit); 0 when ``size`` is not a positive int, exceeds physical memory, or cannot be had.
        The pages are reserved up front (posix_fallocate), so that running out of memory shows
        here as 0 rather than later as SIGBUS on first touch."""
        size = _as_size(size)
        # Above physical memory, reserving the pages would only end in the OOM killer.
        if size is None or size <= 0 or size > _physical_memory():
            return 0
        try:
            fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (AttributeError, OSError):
            return 0
        try:
            os.ftruncate(fd, size)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as error:
                if error.errno not in _FALLOCATE_UNSUPPORTED:
                    raise
            # Sealed against shrinking, so that a larder-client daemon can map it safely
            # (a file cut short under a mapping would fault its reader).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            mapping = mmap.mmap(
                fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, OverflowError, ValueError, MemoryError):
            os.close(fd)
            return 0
        # A from_buffer object is an export of the mapping, which could then not be closed: take
        # the address and drop it at once.
        first_byte = ctypes.c_char.from_buffer(mapping)
        address = ctypes.addressof(first_byte)
        del first_byte
        with _host_lock:
            _host_mappings[address] = _HostMapping(address, size, fd, mapping)
            bisect.insort(_host_addresses, address)
        return address

    def free(self, ptr) -> int:
        """Unmaps the allocation that starts at ``ptr`` and closes its memfd. Returns 0, or -1 when
        ``ptr`` is not the start of a live allocation."""
        ptr = _as_size(ptr)
        with _host_lock:
            entry = _host_mappings.get(ptr) if ptr is not None else None
            if entry is None:
                return -1
            try:
                entry.mapping.close()
            except BufferError:  # something in this process still exports the mapping
                return -1
            del _host_mappings[ptr]
            del _host_addresses[bisect.bisect_left(_host_addresses, ptr)]
        os.close(entry.fd)
        return 0

    def fd_of(self, ptr) -> tuple[int, int, int] | None:
        """Larder's extension: the memfd behind ``ptr`` as ``(fd, offset, size)``, where ``ptr``
        may point anywhere inside an allocation, ``offset`` is ``ptr``'s offset in the file and
        ``size`` the bytes from ``ptr`` to the end of the allocation; None when ``ptr`` is in no
        live allocation. The fd is borrowed: it is closed by ``free``; ``os.dup`` it to keep it
        (for instance to send it to a local larder-client daemon, which maps the same pages)."""
        ptr = _as_size(ptr)
        if ptr is None:
            return None
        with _host_lock:
            index = bisect.bisect_right(_host_addresses, ptr) - 1
            if index < 0:
                return None
            entry = _host_mappings[_host_addresses[index]]
            if ptr >= entry.address + entry.size:
                return None
            return entry.fd, ptr - entry.address, entry.address + entry.size - ptr


# ---- buffer pool ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BufferPoolStats:
    """A snapshot of a BufferPool."""

    regions: int  # registered regions the pool holds (shared and dedicated)
    bytes: int  # their total size
    leased_bytes: int  # memory held by leases, by block (size class, or dedicated region size)
    active_leases: int  # leases not yet released (a dropped lease counts while its views live)


@dataclasses.dataclass(eq=False)
class _Region:
    ptr: int
    size: int
    dedicated: bool


@dataclasses.dataclass(eq=False)
class _Block:
    region: _Region
    offset: int
    size: int

    @property
    def ptr(self) -> int:
        return self.region.ptr + self.offset


@functools.lru_cache(maxsize=64)
def _exporter_type(length: int) -> type:
    """A weak-referenceable ctypes array type of ``length`` bytes: a lease's views export one such
    array, so the array is alive exactly while a view of the lease is."""
    return type("_LeaseBytes", (ctypes.c_ubyte * length,), {})


class BufferLease:
    """A block of registered memory, leased from a BufferPool until ``release``.

    ``ptr`` is the block's address (pass it to the store's zero-copy calls), ``size`` the
    requested size, ``buffer`` a writable memoryview of exactly ``size`` bytes at ``ptr``. Use as
    a context manager to release on exit. A lease that is dropped without ``release`` returns its
    memory once it and every view taken from ``buffer`` are gone. Thread-safe.
    """

    def __init__(self, pool: BufferPool, block: _Block, size: int):
        # All fields but _pool, _block and _size are guarded by the pool's lock.
        self._pool = pool
        self._block = block
        self._size = size
        self._released = False
        self._exporter: weakref.ref | None = None

    @property
    def ptr(self) -> int:
        """The block's address. REQUIRES: not released (RuntimeError otherwise)."""
        if self._released:
            raise RuntimeError("buffer lease is released")
        return self._block.ptr

    @property
    def size(self) -> int:
        """The size that was requested (the block may be larger)."""
        return self._size

    @property
    def buffer(self) -> memoryview:
        """A writable memoryview (format 'B', 1-D, length ``size``) of the leased bytes.
        REQUIRES: not released (RuntimeError otherwise). Release every view (``del`` it or call
        its ``release()``) before releasing the lease."""
        return self._pool._lease_view(self)

    def release(self) -> None:
        """Returns the memory to the pool and wakes waiting acquires. Idempotent. Raises
        RuntimeError, and keeps the lease, while a view taken from ``buffer`` (or an object built
        on one, such as a numpy array) is still alive."""
        self._pool._release_lease(self)

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __del__(self):
        try:
            self._pool._release_dropped(self)
        except Exception:  # noqa: BLE001 (a finalizer must not raise, e.g. at interpreter exit)
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else f"ptr=0x{self._block.ptr:x}"
        return f"BufferLease({state}, size={self._size})"


class BufferPool:
    """Leases of memory registered with ``store``, for zero-copy calls.

    ``store`` is any object with ``register_buffer(ptr, size) -> int`` and
    ``unregister_buffer(ptr) -> int`` (0 on success), such as MooncakeDistributedStore.

    * ``max_bytes``: bound on the total size of the pool's regions; 0 means 1 GiB. Must be at least
      the region size (below).
    * ``min_size_class``, ``max_size_class``: the smallest and largest block a shared region is cut
      into, each rounded up to a power of two; ``max_size_class`` defaults to ``alignment``.
      Requests above ``max_size_class`` get a dedicated region of the page-rounded request size.
    * ``alignment``: a power of two; shared regions are ``max(max_size_class, alignment)`` bytes.
    * ``block_on_exhaustion``: whether ``acquire`` waits for memory by default (else it raises).
    * ``default_timeout``: seconds an acquire waits by default; None waits forever.
    * ``max_regions``: bound on the number of regions (shared and dedicated); None: no bound.
    * ``prewarm_size``, ``prewarm_count``: run ``prewarm(prewarm_size, prewarm_count)`` now.

    Fully free shared regions are kept registered for reuse; they are unregistered and freed
    only by ``close`` or when a dedicated request needs their room.

    Thread-safe: one condition variable guards the pool's state and is never held across a call
    into the store or the allocator; waiters are woken by every release (no FIFO order).
    """

    def __init__(
        self,
        store,
        max_bytes: int = 0,
        min_size_class: int = 64 * 1024,
        max_size_class: int | None = None,
        alignment: int = 8 * 1024 * 1024,
        block_on_exhaustion: bool = True,
        default_timeout: float | None = None,
        max_regions: int | None = None,
        prewarm_size: int | None = None,
        prewarm_count: int = 0,
    ):
        if not (
            callable(getattr(store, "register_buffer", None))
            and callable(getattr(store, "unregister_buffer", None))
        ):
            raise TypeError("store must have register_buffer(ptr, size) and unregister_buffer(ptr)")
        alignment = _positive(alignment, "alignment")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise BufferPoolArgumentError(
                "alignment must be a power of two and at least sizeof(void*)")
        self._min_size_class = _next_power_of_two(_positive(min_size_class, "min_size_class"))
        if max_size_class is None:
            max_size_class = alignment
        self._max_size_class = _positive(max_size_class, "max_size_class")
        if self._max_size_class < self._min_size_class:
            raise BufferPoolArgumentError("max_size_class must be at least min_size_class")
        largest_class = _next_power_of_two(self._max_size_class)
        self._region_size = max(largest_class, alignment, _PAGE)
        max_bytes = _as_size(max_bytes)
        if max_bytes is None or max_bytes < 0:
            raise BufferPoolArgumentError("max_bytes must be a non-negative int")
        self._max_bytes = max_bytes or _DEFAULT_MAX_BYTES
        if self._max_bytes < self._region_size:
            raise BufferPoolArgumentError(
                f"max_bytes ({self._max_bytes}) is below the region size ({self._region_size})"
            )
        self._max_regions = None if max_regions is None else _positive(max_regions, "max_regions")
        self._default_timeout = _timeout(default_timeout)
        self._block_on_exhaustion = bool(block_on_exhaustion)
        self._store = store
        self._allocator = MooncakeHostMemAllocator()

        # An RLock because a dropped lease's finalizer may run (garbage collection) on a thread
        # that holds it; the finalizer then only queues its block and notifies.
        self._cond = threading.Condition(threading.RLock())
        # Block addresses whose leases were dropped, queued by finalizers (deque appends are
        # atomic) and returned by the next locked section (_drain_locked).
        self._pending: collections.deque[int] = collections.deque()
        # Guarded by _cond:
        self._closed = False
        self._regions: dict[int, _Region] = {}  # installed regions by address
        self._region_bytes = 0  # total size of _regions
        # Regions being created or retired outside the lock still count against the bounds.
        self._reserved_bytes = 0
        self._reserved_regions = 0
        # Free shared blocks by size: (region address, offset in region).
        self._free: dict[int, set[tuple[int, int]]] = {}
        size = self._min_size_class
        while size <= self._region_size:
            self._free[size] = set()
            size *= 2
        self._active: dict[int, _Block] = {}  # leased blocks by address

        if prewarm_size is not None and prewarm_count:
            self.prewarm(prewarm_size, prewarm_count)

    # ---- public API ----

    def acquire(self, size: int, block: bool | None = None, timeout: float | None = None):
        """Leases at least ``size`` bytes (``size`` >= 0) of registered memory.

        ``block`` (default ``block_on_exhaustion``): when the pool is exhausted, wait for a
        release, at most ``timeout`` seconds (default ``default_timeout``; None waits forever).
        Raises RuntimeError "buffer pool is exhausted" (not blocking), "timed out waiting for
        buffer", "requested buffer size exceeds pool capacity" (larger than ``max_bytes``),
        "buffer pool is closed", or when the allocator or the store's register_buffer fails.
        """
        size = _as_size(size)
        if size is None:
            raise TypeError("size must be an int")
        if size < 0:
            raise BufferPoolArgumentError("size must be non-negative")
        should_block = self._block_on_exhaustion if block is None else bool(block)
        timeout = self._default_timeout if timeout is None else _timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        dedicated = size > self._max_size_class
        if dedicated:
            block_size = region_size = _round_up(size, _PAGE)
        else:
            block_size = max(self._min_size_class, _next_power_of_two(size))
            region_size = self._region_size
        if region_size > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")

        while True:
            retire: list[_Region] = []
            grow = False
            try:
                with self._cond:
                    self._drain_locked(retire)
                    self._raise_if_closed_locked()
                    if retire:
                        pass  # retire them first: that may be the room this request needs
                    elif not dedicated and (found := self._take_block_locked(block_size)):
                        return self._lease_locked(found, size)
                    elif self._has_room_locked(region_size):
                        self._reserved_bytes += region_size
                        self._reserved_regions += 1
                        grow = True
                    elif self._reclaim_locked(region_size, retire) or self._pending:
                        pass  # retry once the reclaimed regions or the queued returns are in
                    elif not should_block:
                        raise RuntimeError("buffer pool is exhausted")
                    else:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise RuntimeError("timed out waiting for buffer")
                        self._cond.wait(remaining)
            finally:
                if retire:
                    self._retire(retire)
            if grow:
                region = self._create_region(region_size, dedicated)
                retire = []
                try:
                    with self._cond:
                        self._install_locked(region, retire)
                        self._raise_if_closed_locked()
                        if dedicated:
                            found = _Block(region, 0, region.size)
                        else:
                            found = self._take_block_locked(block_size)
                        return self._lease_locked(found, size)
                finally:
                    if retire:
                        self._retire(retire)

    def buffer(self, size: int, block: bool | None = None, timeout: float | None = None):
        """The same as ``acquire``."""
        return self.acquire(size, block=block, timeout=timeout)

    def prewarm(self, size: int, count: int) -> None:
        """Allocates and registers regions now so that ``count`` leases of ``size`` bytes can be
        had without allocating (counting the free blocks the pool already holds). Raises
        RuntimeError "cannot prewarm oversize buffers" (``size`` > ``max_size_class``), "buffer
        pool capacity exceeded" (nothing is allocated then), "buffer pool is closed", or when the
        allocator or the store fails."""
        size = _as_size(size)
        count = _as_size(count)
        if size is None or count is None or size < 0 or count < 0:
            raise BufferPoolArgumentError("size and count must be non-negative ints")
        if size > self._max_size_class:
            raise RuntimeError("cannot prewarm oversize buffers")
        block_size = max(self._min_size_class, _next_power_of_two(size))
        per_region = self._region_size // block_size
        retire: list[_Region] = []
        try:
            with self._cond:
                self._drain_locked(retire)
                self._raise_if_closed_locked()
                have = sum(
                    len(blocks) * (free_size // block_size)
                    for free_size, blocks in self._free.items()
                    if free_size >= block_size
                )
                regions = -(-max(count - have, 0) // per_region)
                if not self._has_room_locked(regions * self._region_size, regions):
                    raise RuntimeError("buffer pool capacity exceeded")
                self._reserved_bytes += regions * self._region_size
                self._reserved_regions += regions
        finally:
            if retire:
                self._retire(retire)
        for created in range(regions):
            try:
                region = self._create_region(self._region_size, dedicated=False)
            except BaseException:
                with self._cond:
                    left = regions - created - 1  # _create_region returned its own reservation
                    self._reserved_bytes -= left * self._region_size
                    self._reserved_regions -= left
                    self._cond.notify_all()
                raise
            retire = []
            try:
                with self._cond:
                    self._install_locked(region, retire)
                    self._cond.notify_all()
            finally:
                if retire:
                    self._retire(retire)

    def close(self) -> None:
        """Unregisters and frees every region; later calls raise "buffer pool is closed".
        Idempotent. Raises RuntimeError while leases are active (the pool stays open). A region
        whose unregister_buffer fails is logged and left allocated, never freed under the store."""
        retire: list[_Region] = []
        try:
            with self._cond:
                self._drain_locked(retire)
                if self._closed:
                    return
                if self._active:
                    raise RuntimeError("cannot close buffer pool with active leases")
                self._closed = True
                for blocks in self._free.values():
                    blocks.clear()
                for region in list(self._regions.values()):
                    self._uninstall_locked(region, retire)
                self._cond.notify_all()
        finally:
            if retire:
                self._retire(retire)

    def stats(self) -> BufferPoolStats:
        """A snapshot of the pool's regions and leases."""
        retire: list[_Region] = []
        try:
            with self._cond:
                self._drain_locked(retire)
                return BufferPoolStats(
                    regions=len(self._regions),
                    bytes=self._region_bytes,
                    leased_bytes=sum(block.size for block in self._active.values()),
                    active_leases=len(self._active),
                )
        finally:
            if retire:
                self._retire(retire)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (a finalizer must not raise)
            pass

    # ---- leases ----

    def _lease_locked(self, block: _Block, size: int) -> BufferLease:
        self._active[block.ptr] = block
        return BufferLease(self, block, size)

    def _lease_view(self, lease: BufferLease) -> memoryview:
        with self._cond:
            if lease._released:
                raise RuntimeError("buffer lease is released")
            exporter = lease._exporter() if lease._exporter is not None else None
            if exporter is None:
                block = lease._block
                exporter = _exporter_type(block.size).from_address(block.ptr)
                lease._exporter = weakref.ref(exporter)
            return memoryview(exporter).cast("B")[: lease._size]

    def _release_lease(self, lease: BufferLease) -> None:
        retire: list[_Region] = []
        try:
            with self._cond:
                if lease._released:
                    return
                if lease._exporter is not None and lease._exporter() is not None:
                    raise RuntimeError("cannot release buffer lease while exported views exist")
                lease._released = True
                self._return_block_locked(self._active.pop(lease._block.ptr), retire)
                self._cond.notify_all()
        finally:
            if retire:
                self._retire(retire)

    def _release_dropped(self, lease: BufferLease) -> None:
        """From BufferLease.__del__: may run on any thread, inside any of this pool's locked
        sections, so it only queues the block (once no view of it is left) and notifies."""
        if lease._released:
            return
        lease._released = True
        exporter = lease._exporter() if lease._exporter is not None else None
        if exporter is None:
            self._queue_return(lease._block.ptr)
        else:
            finalizer = weakref.finalize(exporter, self._queue_return, lease._block.ptr)
            finalizer.atexit = False

    def _queue_return(self, ptr: int) -> None:
        self._pending.append(ptr)
        with self._cond:
            self._cond.notify_all()

    def _drain_locked(self, retire: list[_Region]) -> None:
        returned = False
        while self._pending:
            block = self._active.pop(self._pending.popleft(), None)
            if block is not None:
                self._return_block_locked(block, retire)
                returned = True
        if returned:
            self._cond.notify_all()

    # ---- blocks (a buddy allocator over each shared region) ----

    def _take_block_locked(self, block_size: int) -> _Block | None:
        size = block_size
        while size <= self._region_size and not self._free[size]:
            size *= 2
        if size > self._region_size:
            return None
        key = min(self._free[size])  # lowest address first keeps the high ones whole
        self._free[size].remove(key)
        base, offset = key
        while size > block_size:
            size //= 2
            self._free[size].add((base, offset + size))
        return _Block(self._regions[base], offset, block_size)

    def _return_block_locked(self, block: _Block, retire: list[_Region]) -> None:
        region = block.region
        if region.dedicated:
            self._uninstall_locked(region, retire)
            return
        offset, size = block.offset, block.size
        while size < self._region_size:
            buddy = (region.ptr, offset ^ size)
            if buddy not in self._free[size]:
                break
            self._free[size].remove(buddy)
            offset &= ~size
            size *= 2
        self._free[size].add((region.ptr, offset))

    # ---- regions ----

    def _has_room_locked(self, nbytes: int, regions: int = 1, freed: tuple = (0, 0)) -> bool:
        """Whether ``regions`` more regions of ``nbytes`` in all fit the bounds, once regions of
        ``freed`` = (bytes, count) are gone."""
        used_bytes = self._region_bytes + self._reserved_bytes - freed[0]
        if used_bytes + nbytes > self._max_bytes:
            return False
        if self._max_regions is None:
            return True
        used_regions = len(self._regions) + self._reserved_regions - freed[1]
        return used_regions + regions <= self._max_regions

    def _reclaim_locked(self, nbytes: int, retire: list[_Region]) -> bool:
        """Retires fully free shared regions when that makes room for a region of ``nbytes``;
        returns whether it did. Keeps them all when even that would not be enough."""
        chosen: list[_Region] = []
        freed_bytes = 0
        for base, _ in sorted(self._free[self._region_size], reverse=True):
            if self._has_room_locked(nbytes, freed=(freed_bytes, len(chosen))):
                break
            chosen.append(self._regions[base])
            freed_bytes += self._region_size
        if not chosen or not self._has_room_locked(nbytes, freed=(freed_bytes, len(chosen))):
            return False
        for region in chosen:
            self._free[self._region_size].remove((region.ptr, 0))
            self._uninstall_locked(region, retire)
        return True

    def _create_region(self, size: int, dedicated: bool) -> _Region:
        """Allocates and registers a region whose room the caller reserved. On failure the
        reservation is returned and RuntimeError (or the store's exception) raised."""
        ptr = self._allocator.alloc(size)
        try:
            if ptr == 0:
                raise RuntimeError(f"cannot allocate {size} bytes of host memory")
            result = self._store.register_buffer(ptr, size)
            if result != 0:
                raise RuntimeError(f"register_buffer failed ({result})")
        except BaseException:
            if ptr:
                self._allocator.free(ptr)
            with self._cond:
                self._reserved_bytes -= size
                self._reserved_regions -= 1
                self._cond.notify_all()
            raise
        return _Region(ptr, size, dedicated)

    def _install_locked(self, region: _Region, retire: list[_Region]) -> None:
        """Moves a created region from reserved to installed; straight to ``retire`` when the
        pool was closed meanwhile."""
        self._reserved_bytes -= region.size
        self._reserved_regions -= 1
        self._regions[region.ptr] = region
        self._region_bytes += region.size
        if self._closed:
            self._uninstall_locked(region, retire)
        elif not region.dedicated:
            self._free[self._region_size].add((region.ptr, 0))

    def _uninstall_locked(self, region: _Region, retire: list[_Region]) -> None:
        """Moves a region from installed to reserved and onto ``retire``; the caller then passes
        ``retire`` to _retire once it has left the lock. REQUIRES: none of its blocks is free
        in ``_free`` or leased."""
        del self._regions[region.ptr]
        self._region_bytes -= region.size
        self._reserved_bytes += region.size
        self._reserved_regions += 1
        retire.append(region)

    def _retire(self, regions: list[_Region]) -> None:
        """Unregisters and frees uninstalled regions, then returns their reservations. Called
        without the lock."""
        for region in regions:
            try:
                result = self._store.unregister_buffer(region.ptr)
            except Exception as error:  # noqa: BLE001 (logged; the memory is kept, see below)
                result = error
            if result == 0:
                self._allocator.free(region.ptr)
            else:
                # Freeing memory the store may still reach would be worse than leaking it.
                _log.warning(
                    "unregister_buffer(0x%x) failed (%s); leaving its %d bytes allocated",
                    region.ptr,
                    result,
                    region.size,
                )
        with self._cond:
            for region in regions:
                self._reserved_bytes -= region.size
                self._reserved_regions -= 1
            self._cond.notify_all()

    def _raise_if_closed_locked(self) -> None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")


def _positive(value, name: str) -> int:
    number = _as_size(value)
    if number is None or number <= 0:
        raise BufferPoolArgumentError(f"{name} must be a positive int")
    return number


def _timeout(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("timeout must be a number of seconds or None")
    if value < 0:
        raise BufferPoolArgumentError("timeout must be non-negative")
    return float(value)


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease

__all__ = [
    "BufferLease",
    "BufferPool",
    "BufferPoolStats",
    "MooncakeHostMemAllocator",
    "RegisteredBufferLease",
    "RegisteredBufferPool",
]

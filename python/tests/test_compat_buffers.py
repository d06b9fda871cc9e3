# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.compat.mooncake._buffers: the memfd host allocator and the registered buffer pool,
driven through a fake store that records register_buffer / unregister_buffer."""

import ctypes
import gc
import importlib
import importlib.util
import mmap
import os
import pathlib
import random
import sys
import threading

import pytest


def _load_from_source():
    """_buffers.py from the source tree, for builds whose package does not list it yet (it
    imports only the standard library, so it loads on its own)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "larder" / "compat" / "mooncake"
    name = "_larder_mooncake_buffers_source"
    spec = importlib.util.spec_from_file_location(name, path / "_buffers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


try:
    from larder.compat.mooncake import _buffers
except ImportError:
    _buffers = _load_from_source()

KIB = 1024
MIB = 1024 * 1024
DEADLINE_S = 10  # how long a test waits for something that should happen at once


class FakeStore:
    """Records registrations; register_buffer fails with ``fail_register`` when set."""

    def __init__(self):
        self.lock = threading.Lock()
        self.registered = {}  # ptr -> size
        self.register_calls = []
        self.unregister_calls = []
        self.fail_register = 0

    def register_buffer(self, ptr, size):
        with self.lock:
            self.register_calls.append((ptr, size))
            if self.fail_register:
                return self.fail_register
            assert all(ptr + size <= p or p + s <= ptr for p, s in self.registered.items())
            self.registered[ptr] = size
            return 0

    def unregister_buffer(self, ptr):
        with self.lock:
            self.unregister_calls.append(ptr)
            return 0 if self.registered.pop(ptr, None) is not None else -704

    def owner(self, ptr, size):
        """The registered range holding [ptr, ptr + size), or None."""
        with self.lock:
            for base, length in self.registered.items():
                if base <= ptr and ptr + size <= base + length:
                    return base
        return None


@pytest.fixture
def store():
    return FakeStore()


def small_pool(store, **overrides):
    """1 MiB shared regions cut into 64..256 KiB blocks, at most 2 MiB in all."""
    options = dict(
        max_bytes=2 * MIB, min_size_class=64 * KIB, max_size_class=256 * KIB, alignment=1 * MIB
    )
    options.update(overrides)
    return _buffers.BufferPool(store, **options)


def fill(ptr, size, byte):
    ctypes.memset(ptr, byte, size)


def holds(ptr, size, byte):
    return ctypes.string_at(ptr, size) == bytes([byte]) * size


# ---- MooncakeHostMemAllocator ---------------------------------------------------------------


def test_alloc_returns_zeroed_writable_memory():
    allocator = _buffers.MooncakeHostMemAllocator()
    size = 3 * MIB + 17
    ptr = allocator.alloc(size)
    assert ptr != 0
    assert ctypes.string_at(ptr, size) == bytes(size)
    ctypes.memmove(ptr, b"larder", 6)
    ctypes.memset(ptr + size - 4, 0xAB, 4)
    assert ctypes.string_at(ptr, 6) == b"larder"
    assert ctypes.string_at(ptr + size - 4, 4) == b"\xab" * 4
    assert allocator.free(ptr) == 0


def test_allocation_is_a_shared_memfd():
    allocator = _buffers.MooncakeHostMemAllocator()
    size = 2 * MIB
    ptr = allocator.alloc(size)
    try:
        fd, offset, length = allocator.fd_of(ptr)
        assert (offset, length) == (0, size)
        assert "memfd:larder-host-mem" in os.readlink(f"/proc/self/fd/{fd}")
        assert os.fstat(fd).st_size == size

        payload = bytes(range(256)) * 16
        ctypes.memmove(ptr + 5000, payload, len(payload))
        assert os.pread(fd, len(payload), 5000) == payload  # the file sees writes at the address

        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED) as second:
            assert second[5000 : 5000 + len(payload)] == payload
            second[size - 3 :] = b"xyz"  # and the address sees writes through another mapping
        assert ctypes.string_at(ptr + size - 3, 3) == b"xyz"

        assert allocator.fd_of(ptr + 5000) == (fd, 5000, size - 5000)
        assert allocator.fd_of(ptr + size - 1) == (fd, size - 1, 1)
        assert allocator.fd_of(ptr + size) is None or allocator.fd_of(ptr + size)[0] != fd
    finally:
        assert allocator.free(ptr) == 0
    assert allocator.fd_of(ptr) is None


@pytest.mark.parametrize("size", [0, -1, 1.5, "4096", None, True, 1 << 62])
def test_alloc_refuses_bad_sizes(size):
    assert _buffers.MooncakeHostMemAllocator().alloc(size) == 0


def test_free_refuses_unknown_pointers():
    allocator = _buffers.MooncakeHostMemAllocator()
    ptr = allocator.alloc(4096)
    assert allocator.free(0) == -1
    assert allocator.free(ptr + 1) == -1  # inside an allocation, not its start
    assert allocator.free("ptr") == -1
    assert allocator.free(None) == -1
    assert allocator.free(ptr) == 0
    assert allocator.free(ptr) == -1  # twice
    assert allocator.fd_of(0) is None
    assert allocator.fd_of("ptr") is None


def test_allocations_are_shared_between_instances():
    first, second = _buffers.MooncakeHostMemAllocator(), _buffers.MooncakeHostMemAllocator()
    ptr = first.alloc(8192)
    assert second.fd_of(ptr)[1:] == (0, 8192)
    assert second.free(ptr) == 0
    assert first.free(ptr) == -1


def test_allocator_is_thread_safe():
    allocator = _buffers.MooncakeHostMemAllocator()
    errors = []

    def worker(seed):
        try:
            held = []
            for i in range(40):
                size = 4096 * (1 + (seed + i) % 5)
                ptr = allocator.alloc(size)
                assert ptr
                fill(ptr, size, seed)
                held.append((ptr, size))
                if i % 3 == 2:
                    old_ptr, old_size = held.pop(0)
                    assert holds(old_ptr, old_size, seed)
                    assert allocator.free(old_ptr) == 0
            for ptr, size in held:
                assert holds(ptr, size, seed)
                assert allocator.free(ptr) == 0
        except Exception as error:  # noqa: BLE001 (reported by the main thread)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)


# ---- BufferPool -----------------------------------------------------------------------------


def test_aliases():
    assert _buffers.RegisteredBufferPool is _buffers.BufferPool
    assert _buffers.RegisteredBufferLease is _buffers.BufferLease


def test_leases_never_overlap_and_lie_in_registered_memory(store):
    pool = small_pool(store)
    sizes = [64 * KIB, 100 * KIB, 1, 256 * KIB, 0, 200 * KIB, 64 * KIB, 130 * KIB, 256 * KIB]
    leases = [pool.acquire(size) for size in sizes]
    spans = sorted((lease.ptr, max(lease.size, 1)) for lease in leases)
    for (ptr, size), (next_ptr, _) in zip(spans, spans[1:]):
        assert ptr + size <= next_ptr
    for byte, lease in enumerate(leases, start=1):
        assert store.owner(lease.ptr, lease.size) is not None
        fill(lease.ptr, lease.size, byte)
    for byte, lease in enumerate(leases, start=1):
        assert holds(lease.ptr, lease.size, byte)
    for lease in leases:
        lease.release()
    pool.close()


def test_buffer_is_an_exact_writable_view(store):
    pool = small_pool(store)
    lease = pool.acquire(100 * KIB + 3)
    view = lease.buffer
    assert (view.format, view.ndim, len(view), view.readonly) == ("B", 1, 100 * KIB + 3, False)
    view[:5] = b"hello"
    view[-1] = 7
    assert ctypes.string_at(lease.ptr, 5) == b"hello"
    assert ctypes.string_at(lease.ptr + 100 * KIB + 2, 1) == b"\x07"
    ctypes.memmove(lease.ptr + 10, b"zero-copy", 9)
    assert bytes(view[10:19]) == b"zero-copy"
    view.release()
    lease.release()

    empty = pool.acquire(0)
    assert empty.size == 0 and len(empty.buffer) == 0
    empty.release()
    pool.close()


def test_size_classes_reuse_freed_memory(store):
    pool = small_pool(store)
    first = pool.acquire(64 * KIB)
    ptr = first.ptr
    first.release()
    second = pool.acquire(50 * KIB)
    assert second.ptr == ptr
    second.release()

    # Sixteen 64 KiB blocks fill a region; once freed they merge back into 256 KiB blocks.
    small = [pool.acquire(64 * KIB) for _ in range(16)]
    assert len(store.register_calls) == 1
    for lease in small:
        lease.release()
    large = [pool.acquire(256 * KIB) for _ in range(4)]
    assert len(store.register_calls) == 1
    assert pool.stats().regions == 1
    for lease in large:
        lease.release()
    pool.close()


def test_regions_are_registered_once(store):
    pool = small_pool(store)
    for _ in range(20):
        pool.acquire(128 * KIB).release()
    assert len(store.register_calls) == 1
    assert store.register_calls[0][1] == 1 * MIB
    assert store.unregister_calls == []
    pool.close()
    assert store.registered == {}


def test_dedicated_lease_registers_on_acquire_and_unregisters_on_release(store):
    pool = small_pool(store)
    lease = pool.acquire(300 * KIB + 1)
    assert store.registered == {lease.ptr: 300 * KIB + mmap.PAGESIZE}
    fill(lease.ptr, lease.size, 0x5A)
    assert holds(lease.ptr, lease.size, 0x5A)
    assert pool.stats().leased_bytes == 300 * KIB + mmap.PAGESIZE
    ptr = lease.ptr
    lease.release()
    assert store.unregister_calls == [ptr]
    assert store.registered == {}
    assert _buffers.MooncakeHostMemAllocator().fd_of(ptr) is None  # freed
    assert pool.stats().regions == 0
    pool.close()


def test_dedicated_request_reclaims_free_regions(store):
    pool = small_pool(store, prewarm_size=64 * KIB, prewarm_count=32)
    assert pool.stats().regions == 2  # all of max_bytes, free
    lease = pool.acquire(1536 * KIB)
    assert len(store.unregister_calls) == 2
    assert list(store.registered.values()) == [1536 * KIB]
    lease.release()
    pool.close()


def test_blocking_acquire_wakes_on_release(store):
    pool = small_pool(store, max_bytes=1 * MIB)
    held = [pool.acquire(256 * KIB) for _ in range(4)]
    started, done = threading.Event(), threading.Event()
    result = {}

    def waiter():
        started.set()
        try:
            result["lease"] = pool.acquire(256 * KIB, timeout=DEADLINE_S)
        except Exception as error:  # noqa: BLE001 (checked below)
            result["error"] = error
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(DEADLINE_S)
    assert not done.is_set()  # nothing can satisfy it before a release
    freed = held.pop(2)
    freed_ptr = freed.ptr
    freed.release()
    assert done.wait(DEADLINE_S)
    thread.join(DEADLINE_S)
    assert "error" not in result
    assert result["lease"].ptr == freed_ptr
    result["lease"].release()
    for lease in held:
        lease.release()
    pool.close()


def test_blocking_acquire_wakes_when_a_dropped_lease_returns(store):
    pool = small_pool(store, max_bytes=1 * MIB, max_size_class=1 * MIB)
    held = pool.acquire(1 * MIB)
    done = threading.Event()
    result = {}

    def waiter():
        result["lease"] = pool.acquire(1 * MIB, timeout=DEADLINE_S)
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    del held  # dropped, never released
    assert done.wait(DEADLINE_S)
    thread.join(DEADLINE_S)
    result["lease"].release()
    pool.close()


def test_nonblocking_acquire_raises_when_exhausted(store):
    pool = small_pool(store, max_bytes=1 * MIB)
    held = [pool.acquire(256 * KIB) for _ in range(4)]
    with pytest.raises(RuntimeError, match="buffer pool is exhausted"):
        pool.acquire(64 * KIB, block=False)
    with pytest.raises(RuntimeError, match="buffer pool is exhausted"):
        pool.acquire(512 * KIB, block=False)  # a dedicated region has no room either
    for lease in held:
        lease.release()
    pool.close()

    pool = small_pool(store, max_bytes=1 * MIB, block_on_exhaustion=False)
    held = pool.acquire(256 * KIB, block=False)
    others = [pool.acquire(256 * KIB) for _ in range(3)]
    with pytest.raises(RuntimeError, match="buffer pool is exhausted"):
        pool.acquire(1)
    for lease in [held, *others]:
        lease.release()
    pool.close()


def test_max_regions_bounds_the_pool(store):
    pool = small_pool(store, max_regions=1, block_on_exhaustion=False)
    held = [pool.acquire(256 * KIB) for _ in range(4)]
    with pytest.raises(RuntimeError, match="buffer pool is exhausted"):
        pool.acquire(64 * KIB)
    assert pool.stats().regions == 1
    for lease in held:
        lease.release()
    pool.close()


def test_acquire_times_out(store):
    pool = small_pool(store, max_bytes=1 * MIB)
    held = [pool.acquire(256 * KIB) for _ in range(4)]
    with pytest.raises(RuntimeError, match="timed out waiting for buffer"):
        pool.acquire(64 * KIB, timeout=0.05)
    with pytest.raises(RuntimeError, match="timed out waiting for buffer"):
        pool.acquire(64 * KIB, timeout=0)
    for lease in held:
        lease.release()
    pool.close()

    pool = small_pool(store, max_bytes=1 * MIB, default_timeout=0.05)
    held = pool.acquire(1 * MIB - 1)  # dedicated: all of max_bytes
    with pytest.raises(RuntimeError, match="timed out waiting for buffer"):
        pool.acquire(64 * KIB)
    held.release()
    pool.close()


def test_request_above_capacity_raises(store):
    pool = small_pool(store)
    with pytest.raises(RuntimeError, match="requested buffer size exceeds pool capacity"):
        pool.acquire(2 * MIB + 1)
    assert store.register_calls == []
    pool.close()


def test_close_refuses_active_leases(store):
    pool = small_pool(store)
    lease = pool.acquire(64 * KIB)
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    assert pool.acquire(64 * KIB).ptr != lease.ptr  # still open (that lease is dropped at once)
    lease.release()
    pool.close()


def test_close_unregisters_and_frees_everything(store):
    pool = small_pool(store, max_bytes=4 * MIB)
    pool.prewarm(256 * KIB, 6)  # two regions
    big = pool.acquire(512 * KIB)
    small = pool.acquire(64 * KIB)
    ptrs = list(store.registered)
    assert len(ptrs) == 3
    big.release()
    small.release()
    pool.close()
    assert store.registered == {}
    assert sorted(store.unregister_calls) == sorted(p for p, _ in store.register_calls)
    allocator = _buffers.MooncakeHostMemAllocator()
    assert all(allocator.fd_of(ptr) is None for ptr in ptrs)
    assert pool.stats() == _buffers.BufferPoolStats(0, 0, 0, 0)
    with pytest.raises(RuntimeError, match="buffer pool is closed"):
        pool.acquire(64 * KIB)
    with pytest.raises(RuntimeError, match="buffer pool is closed"):
        pool.prewarm(64 * KIB, 1)
    pool.close()  # idempotent


def test_lease_as_context_manager(store):
    pool = small_pool(store)
    with pool.acquire(64 * KIB) as lease:
        ptr = lease.ptr
        fill(ptr, 64 * KIB, 1)
        assert pool.stats().active_leases == 1
    assert pool.stats().active_leases == 0
    with pytest.raises(RuntimeError, match="released"):
        lease.ptr
    with pytest.raises(RuntimeError, match="released"):
        lease.buffer
    with pool.buffer(64 * KIB) as again:
        assert again.ptr == ptr
    pool.close()


def test_release_refuses_while_views_are_exported(store):
    pool = small_pool(store)
    lease = pool.acquire(64 * KIB)
    view = lease.buffer
    part = view[10:20]
    del view
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()  # a slice still exports the lease's memory
    del part
    array = (ctypes.c_char * 16).from_buffer(lease.buffer)
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    del array
    lease.release()
    lease.release()  # idempotent
    assert pool.stats().active_leases == 0
    pool.close()


def test_dropped_lease_returns_its_memory(store):
    pool = small_pool(store)
    ptr = pool.acquire(64 * KIB).ptr
    assert pool.stats().active_leases == 0
    assert pool.acquire(64 * KIB).ptr == ptr

    view = pool.acquire(64 * KIB).buffer  # the lease is dropped; its view keeps the memory
    view[:4] = b"live"
    assert pool.stats().active_leases == 1
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    del view
    gc.collect()
    assert pool.stats().active_leases == 0
    pool.close()


def test_prewarm_registers_ahead(store):
    pool = small_pool(store, prewarm_size=64 * KIB, prewarm_count=20)
    assert len(store.register_calls) == 2  # 16 blocks of 64 KiB per region
    leases = [pool.acquire(64 * KIB) for _ in range(20)]
    assert len(store.register_calls) == 2
    for lease in leases:
        lease.release()
    pool.prewarm(64 * KIB, 32)  # already there
    assert len(store.register_calls) == 2
    with pytest.raises(RuntimeError, match="capacity exceeded"):
        pool.prewarm(256 * KIB, 9)
    assert len(store.register_calls) == 2
    with pytest.raises(RuntimeError, match="oversize"):
        pool.prewarm(300 * KIB, 1)
    pool.close()


def test_register_failure_raises_and_frees(store):
    store.fail_register = -600
    pool = small_pool(store)
    with pytest.raises(RuntimeError, match="register_buffer failed"):
        pool.acquire(64 * KIB)
    with pytest.raises(RuntimeError, match="register_buffer failed"):
        pool.acquire(512 * KIB)
    allocator = _buffers.MooncakeHostMemAllocator()
    assert all(allocator.fd_of(ptr) is None for ptr, _ in store.register_calls)
    assert pool.stats() == _buffers.BufferPoolStats(0, 0, 0, 0)
    store.fail_register = 0
    pool.acquire(64 * KIB).release()  # the failed reservations were returned
    pool.close()


def test_stats(store):
    pool = small_pool(store)
    empty = _buffers.BufferPoolStats(regions=0, bytes=0, leased_bytes=0, active_leases=0)
    assert pool.stats() == empty
    a = pool.acquire(100 * KIB)
    b = pool.acquire(1)
    c = pool.acquire(400 * KIB)
    stats = pool.stats()
    assert stats.regions == 2
    assert stats.bytes == 1 * MIB + 400 * KIB
    assert stats.leased_bytes == 128 * KIB + 64 * KIB + 400 * KIB
    assert stats.active_leases == 3
    for lease in (a, b, c):
        lease.release()
    assert pool.stats() == _buffers.BufferPoolStats(1, 1 * MIB, 0, 0)
    pool.close()


def test_invalid_arguments(store):
    with pytest.raises(TypeError):
        _buffers.BufferPool(object())
    # Mooncake's native pool raises RuntimeError; ours is a ValueError too.
    with pytest.raises(RuntimeError, match="alignment"):
        small_pool(store, alignment=12345)
    with pytest.raises(ValueError):
        small_pool(store, alignment=3 * MIB)
    with pytest.raises(ValueError):
        small_pool(store, max_bytes=512 * KIB)  # below one region
    with pytest.raises(ValueError):
        small_pool(store, min_size_class=512 * KIB)  # above max_size_class
    pool = small_pool(store)
    with pytest.raises(TypeError):
        pool.acquire(1.5)
    with pytest.raises(ValueError):
        pool.acquire(-1)
    with pytest.raises(ValueError):
        pool.acquire(1, timeout=-1)
    pool.close()


def test_defaults(store):
    pool = _buffers.BufferPool(store)
    lease = pool.acquire(1 * MIB)
    assert store.register_calls == [(store.register_calls[0][0], 8 * MIB)]
    lease.release()
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire((1 << 30) + 1)
    pool.close()


def test_concurrent_leases_stay_disjoint(store):
    pool = small_pool(store, max_bytes=4 * MIB, default_timeout=DEADLINE_S)
    errors = []
    start = threading.Barrier(8)

    def worker(byte):
        rng = random.Random(byte)
        try:
            start.wait(DEADLINE_S)
            for _ in range(60):
                size = rng.choice([1, 64 * KIB, 100 * KIB, 256 * KIB, 300 * KIB])
                with pool.acquire(size) as lease:
                    view = lease.buffer
                    view[:] = bytes([byte]) * size
                    assert holds(lease.ptr, size, byte)
                    del view
        except Exception as error:  # noqa: BLE001 (reported by the main thread)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(byte,)) for byte in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(4 * DEADLINE_S)
    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    assert pool.stats().active_leases == 0
    pool.close()
    assert store.registered == {}


def test_mooncake_buffer_pool_module(shim_path):
    # `from mooncake.buffer_pool import BufferPool`, as Mooncake's users import it.
    from mooncake.buffer_pool import BufferPool, RegisteredBufferPool

    assert BufferPool is RegisteredBufferPool and BufferPool.__name__ == "BufferPool"

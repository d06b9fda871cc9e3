# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Standalone mode from Python: larder.Store.attach and Mooncake's setup_dummy against a real
larder-client daemon. The daemon owns the segment, so an inference process that dies loses no
cache; several processes share one daemon; a dead daemon is reported, not waited on."""

import ctypes
import multiprocessing
import os
import signal

import numpy as np
import pytest

import larder
from conftest import ClientDaemon, have_client_daemon, wait_until

MB = 1 << 20
RPC_FAIL = -900
INVALID = -600

pytestmark = pytest.mark.skipif(not have_client_daemon(), reason="larder-client not built")


@pytest.fixture
def daemon(master):
    d = ClientDaemon(master.address)
    yield d
    d.stop()


def _pattern(key: str, size: int) -> bytes:
    """Bytes that differ by key (the key, repeated)."""
    return (key.encode() * (size // len(key) + 1))[:size]


def test_attach_zero_copy_and_copying(daemon, master):
    store = larder.Store.attach(daemon.address)
    try:
        assert store.attached and store.segment_name == daemon.segment_name
        base = store.allocate_shared(1 * MB)
        view = (ctypes.c_char * MB).from_address(base)
        value = _pattern("sa/a", 64 * 1024)
        ctypes.memmove(base, value, len(value))
        store.put_from("sa/a", base, len(value))
        assert store.get_into("sa/a", base + 512 * 1024, 512 * 1024) == len(value)
        assert view[512 * 1024:512 * 1024 + len(value)] == value
        store.put("sa/copy", b"staged bytes")  # the copying API stages through shared memory
        assert store.get("sa/copy") == b"staged bytes"
        plain = np.zeros(4096, np.uint8)  # memory the daemon cannot map
        with pytest.raises(larder.FailedPreconditionError):
            store.register_buffer(plain)
        # An embedded client of the same cluster sees the daemon's objects.
        with larder.Store(master.address, global_segment_size="8MiB") as other:
            assert other.get("sa/a") == value
        store.free_shared(base)
    finally:
        store.close()
    with pytest.raises(larder.FailedPreconditionError):
        larder.Store(master.address, global_segment_size="8MiB").allocate_shared(4096)


def test_attached_remove_keeps_what_was_used_recently(daemon):
    """batch_remove's segment and unused_for reach the daemon's master as they would an embedded
    client's."""
    store = larder.Store.attach(daemon.address)
    try:
        store.batch_put(["sr/a", "sr/b"], [b"a", b"b"])
        kept = store.batch_remove(["sr/a"], segment=daemon.segment_name, unused_for=60)
        assert isinstance(kept[0], larder.UnavailableError), kept
        wait_until(lambda: store.batch_remove(["sr/a"], segment=daemon.segment_name,
                                              unused_for=0.5) == [None],
                   "an object put 0.5 s ago to go")
        assert store.batch_remove(["sr/b"], unused_for=0) == [None]
        assert store.batch_exist(["sr/a", "sr/b"]) == [False, False]
        with pytest.raises(larder.InvalidArgumentError):
            store.batch_remove(["sr/b"], unused_for=-1)
    finally:
        store.close()


def _writer(address: str, keys: list, done) -> None:
    store = larder.Store.attach(address)
    base = store.allocate_shared(len(keys) * 4096)
    for i, key in enumerate(keys):
        ctypes.memmove(base + i * 4096, _pattern(key, 4096), 4096)
    results = store.batch_put_from(keys, [base + i * 4096 for i in range(len(keys))],
                                   [4096] * len(keys))
    assert all(r is None for r in results), results
    done.set()
    signal.pause()  # killed here, with its store open


def test_a_killed_process_loses_no_cache(daemon):
    ctx = multiprocessing.get_context("spawn")
    keys = [f"kill/{i}" for i in range(32)]
    done = ctx.Event()
    child = ctx.Process(target=_writer, args=(daemon.address, keys, done))
    child.start()
    try:
        assert done.wait(60), "the writer did not finish its puts"
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
        reader = larder.Store.attach(daemon.address)
        try:
            values = reader.batch_get(keys)
            assert values == [_pattern(k, 4096) for k in keys]
        finally:
            reader.close()
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def test_dead_daemon_is_reported(master, shim_path):
    from mooncake.store import MooncakeDistributedStore

    d = ClientDaemon(master.address)
    store = larder.Store.attach(d.address, timeout=10)
    store.put("dd/a", b"v")
    mc = MooncakeDistributedStore()
    assert mc.setup_dummy(16 * MB, 16 * MB, d.address) == 0
    assert mc.get("dd/a") == b"v"
    d.proc.kill()
    d.proc.wait()
    d.stop()
    with pytest.raises(larder.UnavailableError, match="is gone"):
        store.get("dd/a")
    assert mc.put("dd/b", b"v") == RPC_FAIL
    assert mc.get("dd/a") == b""
    store.close()
    mc.close()
    # No daemon at all: setup_dummy fails at once with RPC_FAIL.
    assert MooncakeDistributedStore().setup_dummy(16 * MB, 16 * MB, d.address) == RPC_FAIL


def test_setup_dummy_memory(daemon, shim_path):
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    mc = MooncakeDistributedStore()
    assert mc.setup_dummy(1 * MB, 4 * MB, daemon.address) == 0
    try:
        assert mc.get_hostname() == daemon.segment_name
        # Memory from the pool given to setup_dummy is registered already.
        ptr = mc.alloc_from_mem_pool(256 * 1024)
        assert ptr != 0
        assert mc.alloc_from_mem_pool(1 * MB) == 0  # past the pool
        ctypes.memset(ptr, 7, 4096)
        assert mc.put_from("sd/pool", ptr, 4096) == 0
        assert mc.get_into("sd/pool", ptr + 8192, 4096) == 4096
        assert ctypes.string_at(ptr + 8192, 4096) == b"\x07" * 4096
        # MooncakeHostMemAllocator memory registers as its memfd (SGLang's standalone pools).
        allocator = MooncakeHostMemAllocator()
        host = allocator.alloc(1 * MB)
        assert mc.register_buffer(host, 1 * MB) == 0
        ctypes.memset(host, 9, 4096)
        assert mc.batch_put_from(["sd/host"], [host], [4096]) == [0]
        assert mc.batch_get_into(["sd/host"], [host + 4096], [4096]) == [4096]
        assert ctypes.string_at(host + 4096, 4096) == b"\x09" * 4096
        assert mc.unregister_buffer(host) == 0
        plain = np.zeros(4096, np.uint8)
        assert mc.register_buffer(plain.ctypes.data, 4096) == INVALID
        assert allocator.free(host) == 0
    finally:
        assert mc.close() == 0
    assert mc.setup_dummy(0, 4 * MB, daemon.address) == INVALID
    assert mc.setup_dummy(1 * MB, 4 * MB, "") == INVALID


def test_setup_dummy_ranges_and_local_buffer(daemon, shim_path):
    # Mooncake's dummy-client calls: ranged reads into alloc_from_mem_pool memory registered in
    # small pieces, bounded by what register_buffer was given; copying writes bounded by the
    # local buffer.
    from mooncake.store import MooncakeDistributedStore

    mc = MooncakeDistributedStore()
    assert mc.setup_dummy(1 * MB, 64 * 1024, daemon.address) == 0
    try:
        data = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        assert mc.put("sd/r1", data) == 0
        buf = mc.alloc_from_mem_pool(32)
        assert mc.register_buffer(buf, 32) == 0
        ctypes.memset(buf, ord("_"), 32)
        assert mc.get_into_ranges([buf], [["sd/r1"]], [[[0, 20]]], [[[2, 30]]],
                                  [[[4, 3]]]) == [[[4, 3]]]
        assert ctypes.string_at(buf, 4) == data[2:6]
        assert ctypes.string_at(buf + 20, 3) == data[30:33]
        # A fragment that ends past the 32 registered bytes fails; its neighbour is read.
        result = mc.get_into_ranges([buf], [["sd/r1"]], [[[30, 0]]], [[[0, 0]]], [[[4, 4]]])
        assert result[0][0][0] < 0 and result[0][0][1] == 4
        assert mc.unregister_buffer(buf) == 0
        assert mc.put("sd/big", b"x" * (64 * 1024 + 1)) == INVALID
        assert mc.is_exist("sd/big") == 0
        assert mc.put("sd/fits", b"x" * (64 * 1024)) == 0
        # setup_dummy on a store that is set up is refused until close.
        assert mc.setup_dummy(1 * MB, 4 * MB, daemon.address) == INVALID
    finally:
        assert mc.close() == 0

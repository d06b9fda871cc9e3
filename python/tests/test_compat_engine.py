# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.compat.mooncake.TransferEngine (``mooncake.engine``) and the asynchronous API of
larder.TransferEngine under it: in one process (two engines), and against a peer process that is
stopped or killed. The two-process PD patterns are in test_pd.py and test_consumer_pd.py."""

import ctypes
import json
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import larder
import pd_workers
from conftest import SHIM_DIR, auto_routes
from larder.compat import mooncake as compat
from larder.compat.mooncake import _config

MB = 1 << 20
INVALID = (1 << 64) - 1
HINTS = ["", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp", "ascend",
         "sunrise_link", "unspec"]


@pytest.fixture
def te_module(shim_path):
    from mooncake import engine as module

    return module


def make_engine(module, protocol="tcp"):
    engine = module.TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    return engine


@pytest.fixture
def pair(te_module):
    """(prefill, decode): prefill registers memory, decode moves bytes to and from it."""
    prefill, decode = make_engine(te_module), make_engine(te_module)
    yield prefill, decode
    prefill.close()
    decode.close()


def session(engine):
    return f"127.0.0.1:{engine.get_rpc_port()}"


def test_initialize(te_module):
    engine = te_module.TransferEngine()
    assert engine.get_rpc_port() == -1
    assert engine.initialize("localhost:0", "P2PHANDSHAKE", "tcp", "") == 0
    assert engine.get_rpc_port() > 0
    assert engine.get_local_address() == session(engine)
    assert engine.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p") == 0
    assert engine.initialize("no-such-host.invalid", "P2PHANDSHAKE", "tcp", "") == -1
    assert engine.initialize("127.0.0.1:notaport", "P2PHANDSHAKE", "tcp", "") == -1
    engine.close()


def test_unknown_protocol_runs_as_auto(te_module, monkeypatch):
    monkeypatch.setattr(_config, "_warned_protocols", set())
    engine = te_module.TransferEngine()
    with pytest.warns(RuntimeWarning, match="'rdma'"):
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert engine._engine.routes == auto_routes()
    engine.close()


@pytest.mark.parametrize("protocol", ["nvlink", "hip", "nvlink_intra"])
def test_device_fabrics_are_refused(te_module, protocol):
    # As Mooncake's engine built without them (its SUPPORT_* flags, all False here) does.
    assert not (te_module.SUPPORT_MNNVL or te_module.SUPPORT_HIP or te_module.SUPPORT_INTRA_NVLINK)
    engine = te_module.TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == -1
    assert engine.get_rpc_port() == -1


def test_register_memory(pair):
    prefill, _ = pair
    buf = np.zeros(MB, np.uint8)
    base = buf.ctypes.data
    assert prefill.register_memory(base, buf.nbytes) == 0
    assert prefill.register_memory(base + 100, 10) == -1  # overlaps
    assert prefill.register_memory(0, 10) == -1
    assert prefill.register_memory(base, 0) == -1
    assert prefill.unregister_memory(base) == 0
    assert prefill.unregister_memory(base) == -1
    other = np.zeros(MB, np.uint8)
    assert prefill.batch_register_memory([base, other.ctypes.data], [MB, MB]) == 0
    assert prefill.batch_register_memory([base], [MB, MB]) == -1
    assert prefill.batch_unregister_memory([base, other.ctypes.data]) == 0
    assert prefill.batch_unregister_memory([base]) == -1


def test_read_write_by_peer_address(te_module, pair):
    prefill, decode = pair
    remote = np.zeros(4 * MB, np.uint8)
    remote_base = remote.ctypes.data
    assert prefill.register_memory(remote_base, remote.nbytes) == 0
    local = (np.arange(2 * MB) % 253).astype(np.uint8)
    local_base = local.ctypes.data
    target = session(prefill)
    assert decode.transfer_sync_write(target, local_base, remote_base + MB, 64 * 1024) == 0
    assert np.array_equal(remote[MB:MB + 64 * 1024], local[:64 * 1024])
    back = np.zeros(64 * 1024, np.uint8)
    assert decode.transfer_sync_read(target, back.ctypes.data, remote_base + MB, back.nbytes) == 0
    assert np.array_equal(back, local[:64 * 1024])
    assert decode.transfer_sync(target, back.ctypes.data, remote_base, 16,
                                te_module.TransferOpcode.Read) == 0
    assert not back[:16].any()
    # batch forms: 32 scattered blocks
    n, block = 32, 16 * 1024
    locals_ = [local_base + i * block for i in range(n)]
    peers = [remote_base + 2 * MB + (n - 1 - i) * block for i in range(n)]
    assert decode.batch_transfer_sync_write(target, locals_, peers, [block] * n) == 0
    for i in range(n):
        j = n - 1 - i
        assert np.array_equal(remote[2 * MB + j * block:2 * MB + (j + 1) * block],
                              local[i * block:(i + 1) * block])
    readback = np.zeros(n * block, np.uint8)
    dsts = [readback.ctypes.data + i * block for i in range(n)]
    assert decode.batch_transfer_sync_read(target, dsts, peers, [block] * n) == 0
    assert np.array_equal(readback, local[:n * block])
    assert decode.batch_transfer_sync(target, dsts[:1], peers[:1], [block],
                                      te_module.TransferOpcode.Write) == 0


def test_rejects_addresses_outside_registered_buffers(pair):
    prefill, decode = pair
    remote = np.zeros(MB, np.uint8)
    base = remote.ctypes.data
    assert prefill.register_memory(base, remote.nbytes) == 0
    local = np.ones(4096, np.uint8)
    target = session(prefill)
    assert decode.transfer_sync_write(target, local.ctypes.data, base - 4096, 4096) == -1
    assert decode.transfer_sync_write(target, local.ctypes.data, base + MB - 100, 4096) == -1
    assert decode.transfer_sync_write(target, local.ctypes.data, base + MB, 1) == -1
    assert decode.transfer_sync_read(target, local.ctypes.data, 0x1000, 16) == -1
    assert not remote.any()
    # one bad request fails the whole batch call
    assert decode.batch_transfer_sync_write(target, [local.ctypes.data] * 2,
                                            [base, base + 2 * MB], [16, 16]) == -1
    # malformed calls
    assert decode.transfer_sync_write(target, 0, base, 16) == -1
    assert decode.transfer_sync_write(target, local.ctypes.data, base, 0) == -1
    assert decode.batch_transfer_sync_read(target, [], [], []) == -1
    assert decode.batch_transfer_sync_read(target, [local.ctypes.data], [base, base], [1]) == -1
    assert decode.transfer_sync(target, local.ctypes.data, base, 16, "sideways") == -1
    # unreachable peer, uninitialized engine
    assert decode.transfer_sync_read("127.0.0.1:1", local.ctypes.data, base, 16) == -1
    assert compat.TransferEngine().transfer_sync_read(target, local.ctypes.data, base, 16) == -1


def test_peer_reregistration_refreshes_the_cache(pair):
    prefill, decode = pair
    first = np.zeros(MB, np.uint8)
    assert prefill.register_memory(first.ctypes.data, first.nbytes) == 0
    local = np.full(4096, 5, np.uint8)
    target = session(prefill)
    assert decode.transfer_sync_write(target, local.ctypes.data, first.ctypes.data, 4096) == 0
    assert prefill.unregister_memory(first.ctypes.data) == 0
    assert decode.transfer_sync_write(target, local.ctypes.data, first.ctypes.data, 4096) == -1
    second = np.zeros(MB, np.uint8)
    assert prefill.register_memory(second.ctypes.data, second.nbytes) == 0
    assert decode.transfer_sync_write(target, local.ctypes.data, second.ctypes.data, 4096) == 0
    assert (second[:4096] == 5).all()
    # the first buffer is still the one registered at initialize
    assert decode.get_first_buffer_address(target) == prefill.get_first_buffer_address(target)
    assert decode.get_first_buffer_address(target) not in (0, second.ctypes.data)
    assert decode.get_first_buffer_address("127.0.0.1:1") == 0


def test_managed_buffers(te_module):
    prefill, decode = make_engine(te_module, "auto"), make_engine(te_module, "auto")
    try:
        address = prefill.allocate_managed_buffer(MB)
        assert address != 0
        assert prefill.allocate_managed_buffer(0) == 0
        local = np.arange(4096, dtype=np.uint8)
        target = session(prefill)
        assert decode.transfer_sync_write(target, local.ctypes.data, address + 10, 4096) == 0
        assert ctypes.string_at(address + 10, 4096) == local.tobytes()
        # memfd memory: a same-host peer maps it (shm)
        handle = next(b.handle for b in decode._peers[target] if b.base == address)
        assert decode._engine.segment_route(handle) == "shm"
        assert prefill.read_bytes_from_buffer(address + 10, 4) == local[:4].tobytes()
        assert prefill.write_bytes_to_buffer(address, b"abcdef", 3) == 0
        assert ctypes.string_at(address, 4) == b"abc\0"
        assert prefill.write_bytes_to_buffer(address, b"ab", 3) == -1
        assert prefill.free_managed_buffer(address, MB) == 0
        assert prefill.free_managed_buffer(address, MB) == -1
        # A shm mapping outlives its owner's registration, but the next transfer through it
        # sees that the owner unexported a buffer and fails, as Mooncake's does.
        assert decode.transfer_sync_write(target, local.ctypes.data, address, 16) == -1
        assert decode.transfer_sync_read(target, local.ctypes.data, address, 16) == -1
        assert decode.get_first_buffer_address(target) not in (0, address)
    finally:
        prefill.close()
        decode.close()


def test_initialize_registers_a_first_buffer(te_module, monkeypatch):
    """As Mooncake's engine, initialize registers a 2 GiB buffer that peers find with
    get_first_buffer_address; PASS_ALLOC=1 skips it."""
    prefill, decode = make_engine(te_module, "auto"), make_engine(te_module, "auto")
    monkeypatch.setenv("PASS_ALLOC", "1")
    bare = make_engine(te_module, "auto")
    try:
        target = session(prefill)
        first = decode.get_first_buffer_address(target)
        assert first != 0 and first == prefill.get_first_buffer_address(target)
        assert decode.get_first_buffer_address(session(decode)) not in (0, first)
        assert bare.get_first_buffer_address(session(bare)) == 0
        assert decode.get_first_buffer_address(session(bare)) == 0
        # the whole 2 GiB is reachable, at both ends
        local = np.arange(4096, dtype=np.uint8)
        for offset in (0, (2 << 30) - 4096):
            assert decode.transfer_sync_write(target, local.ctypes.data, first + offset,
                                              4096) == 0
            assert ctypes.string_at(first + offset, 4096) == local.tobytes()
        assert decode.transfer_sync_write(target, local.ctypes.data, first + (2 << 30) - 16,
                                          32) == -1
        # it lives as long as the engine: free_managed_buffer refuses it
        assert prefill.free_managed_buffer(first, 2 << 30) == -1
        assert decode.transfer_sync_read(target, local.ctypes.data, first, 16) == 0
        # buffers registered later come after it
        extra = prefill.allocate_managed_buffer(MB)
        assert extra != 0
        assert decode.get_first_buffer_address(target) == first
        assert prefill.free_managed_buffer(extra, MB) == 0
    finally:
        for engine in (prefill, decode, bare):
            engine.close()


@pytest.mark.parametrize("free", ["free_managed_buffer", "unregister_memory"])
def test_same_host_write_after_free_fails(te_module, free):
    """A same-host peer that mapped a managed buffer fails its next transfer into it once the
    owner frees (or unregisters) it, as Mooncake's engine does; other buffers stay usable."""
    prefill, decode = make_engine(te_module, "shm"), make_engine(te_module, "shm")
    try:
        target = session(prefill)
        kept, freed = prefill.allocate_managed_buffer(MB), prefill.allocate_managed_buffer(MB)
        local = np.full(64, 7, np.uint8)
        assert decode.transfer_sync_write(target, local.ctypes.data, freed, 64) == 0
        assert decode.batch_transfer_sync_write(target, [local.ctypes.data] * 2, [kept, freed],
                                                [64, 64]) == 0
        handle = next(b.handle for b in decode._peers[target] if b.base == freed)
        assert decode._engine.segment_route(handle) == "shm"
        if free == "free_managed_buffer":
            assert prefill.free_managed_buffer(freed, MB) == 0
        else:
            assert prefill.unregister_memory(freed) == 0
        assert decode.transfer_sync_write(target, local.ctypes.data, freed, 64) == -1
        assert decode.batch_transfer_sync_write(target, [local.ctypes.data] * 2, [kept, freed],
                                                [64, 64]) == -1
        assert decode.transfer_sync_write(target, local.ctypes.data, kept + 64, 64) == 0
        assert ctypes.string_at(kept + 64, 64) == local.tobytes()
        # a buffer registered after the free is reached as usual
        again = prefill.allocate_managed_buffer(MB)
        assert decode.transfer_sync_write(target, local.ctypes.data, again, 64) == 0
        assert ctypes.string_at(again, 64) == local.tobytes()
    finally:
        prefill.close()
        decode.close()


# ---- the asynchronous API of larder.TransferEngine --------------------------------------------


def test_native_submit_poll_wait_results_release():
    with larder.TransferEngine("tcp") as engine, larder.TransferEngine("tcp") as peer:
        target = np.zeros(1 << 16, np.uint8)
        peer.register_segment("kv", target)
        handle = engine.open_segment(peer.address, "kv")
        src = np.arange(1 << 12, dtype=np.uint8)
        writes = [larder.TransferRequest("write", src.ctypes.data + i * 256, handle, i * 1024, 256)
                  for i in range(16)]
        batch = engine.submit(writes, timeout=5)
        assert batch > 0
        engine.wait(batch, 5)
        assert engine.poll(batch)
        results = engine.results(batch)
        assert len(results) == 16 and all(r.ok and r.bytes == 256 for r in results)
        assert all(np.array_equal(target[i * 1024:i * 1024 + 256], src[i * 256:(i + 1) * 256])
                   for i in range(16))
        engine.release(batch)
        for call in (engine.poll, engine.results, engine.release, lambda b: engine.wait(b, 1)):
            with pytest.raises(larder.NotFoundError):
                call(batch)
        # one bad request: wait raises its error, results tell which, release still frees it
        out = np.zeros(64, np.uint8)
        reads = [larder.TransferRequest("read", out.ctypes.data, handle, 0, 64),
                 larder.TransferRequest("read", out.ctypes.data, handle, 1 << 16, 64)]
        batch = engine.submit(reads)
        with pytest.raises(larder.OutOfRangeError, match="request 1"):
            engine.wait(batch)
        results = engine.results(batch)
        assert results[0].ok and isinstance(results[1].error, larder.OutOfRangeError)
        assert np.array_equal(out, src[:64])
        engine.release(batch)
        with pytest.raises(larder.InvalidArgumentError):
            engine.submit([])
        with pytest.raises(larder.InvalidArgumentError):
            engine.wait(12345, -1)
    with pytest.raises(larder.FailedPreconditionError):
        engine.submit(writes)
    with pytest.raises(larder.FailedPreconditionError):
        engine.poll(1)


@pytest.fixture
def remote_peer():
    """A peer process exporting 1 MiB of application memory over tcp: (process, info)."""
    ctx = multiprocessing.get_context("spawn")
    to_test, from_test = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=pd_workers.peer_worker,
                       args=(str(SHIM_DIR), "tcp", MB, to_test, from_test))
    proc.start()
    info = to_test.get(timeout=120)
    assert "error" not in info, info
    yield proc, info
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGCONT)
        from_test.put({"stop": True})
        proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
        proc.join()


def stop_process(pid, timeout=10.0):
    """SIGSTOP `pid` and wait until the kernel reports it stopped: the signal is only queued when
    kill returns, and a peer that runs on a moment longer can still answer a request."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):  # every thread of it
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


def test_native_wait_on_a_stopped_peer(remote_peer):
    """A peer that stops answering (SIGSTOP): the batch runs until its requests' deadline, wait
    with a timeout raises DeadlineExceededError meanwhile, and the blocking wait releases the
    GIL."""
    proc, info = remote_peer
    with larder.TransferEngine("tcp") as engine:
        handle = engine.open_segment(info["session"], f"mem@0x{info['base']:x}")
        local = np.ones(4096, np.uint8)
        assert engine.write(handle, 0, local) == 4096  # connections are up
        stop_process(proc.pid)
        batch = engine.submit([larder.TransferRequest("write", local.ctypes.data, handle, 0,
                                                      4096)], timeout=2)
        assert not engine.poll(batch)
        with pytest.raises(larder.DeadlineExceededError, match="still running"):
            engine.wait(batch, 0.05)
        with pytest.raises(larder.FailedPreconditionError):
            engine.results(batch)
        with pytest.raises(larder.FailedPreconditionError):
            engine.release(batch)
        errors, ticks = [], []

        def waiter():
            try:
                engine.wait(batch)
            except larder.LarderError as e:
                errors.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        while t.is_alive():
            ticks.append(1)
            t.join(0.001)
        # With the GIL held through the 2 s wait this thread would not run at all; a loaded
        # machine still gives it many turns of 1 ms sleeps.
        assert len(ticks) > 10
        assert len(errors) == 1 and isinstance(errors[0], larder.DeadlineExceededError)
        assert engine.poll(batch)
        assert isinstance(engine.results(batch)[0].error, larder.DeadlineExceededError)
        engine.release(batch)


# ---- mooncake.engine: the asynchronous calls --------------------------------------------------


def test_batch_transfer_async(te_module, pair):
    prefill, decode = pair
    remote = np.zeros(4 * MB, np.uint8)
    base = remote.ctypes.data
    assert prefill.register_memory(base, remote.nbytes) == 0
    target = session(prefill)
    n, block = 16, 64 * 1024
    local = (np.arange(n * block) % 251).astype(np.uint8)
    srcs = [local.ctypes.data + i * block for i in range(n)]
    peers = [base + (n - 1 - i) * block for i in range(n)]
    batch = decode.batch_transfer_async_write(target, srcs, peers, [block] * n)
    assert 0 < batch < INVALID
    assert decode.get_batch_transfer_status([batch]) == 0
    for i in range(n):
        j = n - 1 - i
        assert np.array_equal(remote[j * block:(j + 1) * block], local[i * block:(i + 1) * block])
    assert decode.get_batch_transfer_status([batch]) == -1  # freed
    back = np.zeros(n * block, np.uint8)
    dsts = [back.ctypes.data + i * block for i in range(n)]
    ids = [decode.batch_transfer_async_read(target, dsts[:8], peers[:8], [block] * 8),
           decode.batch_transfer_async(target, dsts[8:], peers[8:], [block] * 8,
                                       te_module.TransferOpcode.Read, transport_hint="tcp")]
    assert len(set(ids)) == 2 and all(0 < i < INVALID for i in ids)
    assert decode.get_batch_transfer_status(ids) == 0
    assert np.array_equal(back, local)
    assert decode.get_batch_transfer_status([]) == 0
    # transfer_submit_write / transfer_check_status
    batch = decode.transfer_submit_write(target, local.ctypes.data, base + 3 * MB, block)
    assert 0 < batch < INVALID
    assert wait_status(decode, batch) == 1
    assert np.array_equal(remote[3 * MB:3 * MB + block], local[:block])
    assert decode.transfer_check_status(batch) == -1  # freed


def wait_status(engine, batch, timeout=60.0):
    """transfer_check_status once the batch has ended: waits on the engine's batch (with a
    deadline) rather than polling."""
    native = engine._batches[batch]
    try:
        native.engine.wait(native.batch, timeout)
    except larder.DeadlineExceededError as e:
        if "still running" in str(e):
            pytest.fail(f"batch {batch} still pending after {timeout} s")
    except larder.LarderError:
        pass  # a failed request: transfer_check_status says which code
    return engine.transfer_check_status(batch)


def test_batch_transfer_async_rejects_bad_input(te_module, pair):
    prefill, decode = pair
    remote = np.zeros(MB, np.uint8)
    base = remote.ctypes.data
    assert prefill.register_memory(base, remote.nbytes) == 0
    target = session(prefill)
    local_buffer = np.ones(4096, np.uint8)  # kept alive: the engine reads it
    local = local_buffer.ctypes.data
    write = decode.batch_transfer_async_write
    assert write(target, [local, local], [base], [16, 16]) == 0  # list lengths differ
    assert write(target, [local], [base], [16, 16]) == 0
    assert write(target, [], [], []) == 0
    assert write(target, [0], [base], [16]) == 0
    assert write(target, [local], [base], [0]) == 0
    assert write(target, [local], [base + MB - 8], [16]) == 0  # outside the peer's buffer
    assert decode.batch_transfer_async(target, [local], [base], [16], 7) == 0
    assert write("127.0.0.1:1", [local], [base], [16]) == INVALID  # unreachable
    # As in Mooncake, transfer_submit_write fails as batch_transfer_async does: 0 when refused,
    # 2**64 - 1 when the peer cannot be reached.
    assert decode.transfer_submit_write(target, local, base - 4096, 16) == 0
    assert decode.transfer_submit_write("127.0.0.1:1", local, base, 16) == INVALID
    assert not remote.any()
    for unknown in (0, INVALID, 12345):
        assert decode.get_batch_transfer_status([unknown]) == -1
        assert decode.transfer_check_status(unknown) == -1
    # an unknown id fails the call, the valid ids in it are still waited for and freed
    batch = write(target, [local], [base], [16])
    assert decode.get_batch_transfer_status([batch, 12345]) == -1
    assert (remote[:16] == 1).all()
    assert decode.transfer_check_status(batch) == -1
    # batches of an engine that initialize replaced are gone
    batch = write(target, [local], [base], [16])
    assert decode.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert decode.get_batch_transfer_status([batch]) == -1


def test_transport_hints(te_module, pair):
    prefill, decode = pair
    remote = np.zeros(MB, np.uint8)
    base = remote.ctypes.data
    assert prefill.register_memory(base, remote.nbytes) == 0
    target = session(prefill)
    local_buffer = np.full(4096, 9, np.uint8)  # kept alive: the engine reads it
    local = local_buffer.ctypes.data
    write, read = te_module.TransferOpcode.Write, te_module.TransferOpcode.Read
    calls = [
        lambda h: decode.transfer_sync_write(target, local, base, 16, h),
        lambda h: decode.transfer_sync_read(target, local, base, 16, transport_hint=h),
        lambda h: decode.transfer_sync(target, local, base, 16, write, transport_hint=h),
        lambda h: decode.batch_transfer_sync_write(target, [local], [base], [16], h),
        lambda h: decode.batch_transfer_sync_read(target, [local], [base], [16], h),
        lambda h: decode.batch_transfer_sync(target, [local], [base], [16], read, None, h),
        lambda h: decode.get_batch_transfer_status(
            [decode.batch_transfer_async_write(target, [local], [base], [16], h)]),
        lambda h: decode.get_batch_transfer_status(
            [decode.batch_transfer_async_read(target, [local], [base], [16], h)]),
        lambda h: decode.get_batch_transfer_status(
            [decode.batch_transfer_async(target, [local], [base], [16], write, h)]),
        lambda h: wait_status(decode, decode.transfer_submit_write(target, local, base, 16, h))
        - 1,
    ]
    for call in calls:
        for hint in HINTS:  # advisory: the engine picks the route
            assert call(hint) == 0, hint
        for bad in ("infiniband", "efa", None, 3):
            with pytest.raises(ValueError, match="transport hint"):
                call(bad)
    with pytest.raises(ValueError):
        te_module.TransferEngine().transfer_sync_write(target, local, base, 16, "efa")


def test_calls_before_initialize(te_module):
    engine = te_module.TransferEngine()
    local_buffer = np.zeros(64, np.uint8)  # kept alive: the engine reads it
    local = local_buffer.ctypes.data
    assert engine.batch_transfer_async_write("127.0.0.1:1", [local], [local], [16]) == 0
    assert engine.batch_transfer_async_read("127.0.0.1:1", [local], [local], [16]) == 0
    assert engine.transfer_submit_write("127.0.0.1:1", local, local, 16) == 0
    assert engine.get_batch_transfer_status([1]) == -1
    assert engine.transfer_check_status(1) == -1
    assert engine.send_probe("127.0.0.1:1") == -1
    assert engine.register_memory(local, 64, "cpu:0") == -1
    assert engine.batch_register_memory([local], [64], location="*") == -1
    assert engine.release_remote_segment("127.0.0.1:1") == 0
    assert engine.get_notifies() == []
    assert engine.warmup_efa_segment("127.0.0.1:1") == 0
    assert isinstance(engine.get_engine(), te_module.InnerTransferEngine)
    assert json.loads(engine.get_local_topology())


def test_module_surface(te_module, shim_path, master):
    for flag in ("SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_INTRA_NVLINK",
                 "SUPPORT_CUDA"):
        assert getattr(te_module, flag) is False
    assert te_module.TransferEngine.TransferOpcode is te_module.TransferOpcode
    assert (int(te_module.TransferOpcode.Read), int(te_module.TransferOpcode.Write)) == (0, 1)
    notify = te_module.TransferNotify()
    assert (notify.name, notify.msg) == ("", "")
    notify = te_module.TransferNotify("peer", "done")
    notify.msg = "again"
    assert (notify.name, notify.msg) == ("peer", "again")
    engine = make_engine(te_module)
    try:
        inner = engine.get_engine()
        assert type(inner) is te_module.InnerTransferEngine
        assert not isinstance(inner, te_module.TransferEngine)
        assert engine.get_engine_ptr() == 0
        topology = json.loads(engine.get_local_topology())
        assert topology and all(k.startswith("cpu:") and v == [[], []]
                                for k, v in topology.items())
        assert json.loads(engine.get_local_topology("mlx5_0")) == topology
        assert engine.get_notifies() == []
        assert engine.warmup_efa_segment(session(engine)) == 0
        # the store accepts the inner engine (and uses its own)
        from mooncake.store import MooncakeDistributedStore

        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                           master.address, inner) == 0
        store.close()
    finally:
        engine.close()


def test_notify_is_accepted(te_module, pair):
    prefill, decode = pair
    remote = np.zeros(MB, np.uint8)
    assert prefill.register_memory(remote.ctypes.data, remote.nbytes) == 0
    local = np.full(256, 3, np.uint8)
    target = session(prefill)
    notify = te_module.TransferNotify(target, "kv ready")
    assert decode.transfer_sync(target, local.ctypes.data, remote.ctypes.data, 256,
                                te_module.TransferOpcode.Write, notify) == 0
    assert decode.batch_transfer_sync(target, [local.ctypes.data], [remote.ctypes.data + 256],
                                      [256], te_module.TransferOpcode.Write, notify=notify) == 0
    assert (remote[:512] == 3).all()
    assert prefill.get_notifies() == [] and decode.get_notifies() == []


def test_register_memory_location_and_managed_ranges(te_module, pair):
    prefill, decode = pair
    buf = np.zeros(MB, np.uint8)
    assert prefill.register_memory(buf.ctypes.data, MB, "cpu:0") == 0
    assert prefill.batch_register_memory([buf.ctypes.data + 1], [10], "*") == -1  # overlaps
    assert prefill.unregister_memory(buf.ctypes.data) == 0
    # memory from allocate_managed_buffer is exported already: registering a range of it (as
    # SGLang and vLLM do with every pool) succeeds and changes nothing
    managed = prefill.allocate_managed_buffer(MB)
    assert prefill.batch_register_memory([managed, managed + 4096], [MB, 4096]) == 0
    assert prefill.register_memory(managed + MB - 16, 4096) == -1  # runs past its end
    assert prefill.batch_unregister_memory([managed, managed + 4096]) == 0
    local = np.full(64, 7, np.uint8)
    assert decode.transfer_sync_write(session(prefill), local.ctypes.data, managed, 64) == 0
    assert ctypes.string_at(managed, 64) == local.tobytes()
    assert prefill.free_managed_buffer(managed, MB) == 0


def test_send_probe_and_release_remote_segment(te_module, pair):
    prefill, decode = pair
    a, b = np.zeros(MB, np.uint8), np.zeros(MB, np.uint8)
    assert prefill.batch_register_memory([a.ctypes.data, b.ctypes.data], [MB, MB]) == 0
    target = session(prefill)
    assert decode.send_probe(target) == 0
    assert decode.send_probe("127.0.0.1:1") != 0
    assert decode.send_probe("not an address") != 0
    local_buffer = np.full(64, 1, np.uint8)  # kept alive: the engine reads it
    local = local_buffer.ctypes.data
    assert decode.release_remote_segment(target) == 0  # nothing cached yet
    assert decode.batch_transfer_sync_write(target, [local, local], [a.ctypes.data, b.ctypes.data],
                                            [64, 64]) == 0
    assert decode.release_remote_segment(target) == 2
    assert decode.release_remote_segment(target) == 0
    assert decode.transfer_sync_write(target, local, b.ctypes.data + 64, 64) == 0
    assert decode.release_remote_segment(target) == 1
    assert (a[:64] == 1).all() and (b[:128] == 1).all()


def test_dead_peer(te_module, pair, remote_peer):
    """A peer process that dies: transfers to it fail (-1) and the engine keeps working."""
    proc, info = remote_peer
    prefill, decode = pair
    dead, base = info["session"], info["base"]
    local = (np.arange(4096) % 199).astype(np.uint8)
    back = np.zeros(4096, np.uint8)
    assert decode.transfer_sync_write(dead, local.ctypes.data, base, 4096) == 0
    batch = decode.batch_transfer_async_read(dead, [back.ctypes.data], [base], [4096])
    assert decode.get_batch_transfer_status([batch]) == 0
    assert np.array_equal(back, local)
    assert decode.send_probe(dead) == 0
    proc.kill()
    proc.join()
    assert decode.transfer_sync_write(dead, local.ctypes.data, base, 4096) == -1
    assert decode.batch_transfer_sync_read(dead, [back.ctypes.data], [base], [16]) == -1
    batch = decode.batch_transfer_async_write(dead, [local.ctypes.data], [base], [4096])
    assert batch == INVALID or decode.get_batch_transfer_status([batch]) == -1
    batch = decode.transfer_submit_write(dead, local.ctypes.data, base, 4096)
    assert batch == INVALID or wait_status(decode, batch) == -1
    assert decode.send_probe(dead) != 0
    # the engine still serves live peers
    remote = np.zeros(MB, np.uint8)
    assert prefill.register_memory(remote.ctypes.data, MB) == 0
    alive = session(prefill)
    assert decode.transfer_sync_write(alive, local.ctypes.data, remote.ctypes.data, 4096) == 0
    batch = decode.batch_transfer_async_write(alive, [local.ctypes.data],
                                              [remote.ctypes.data + 4096], [4096])
    assert decode.get_batch_transfer_status([batch]) == 0
    assert np.array_equal(remote[:4096], local) and np.array_equal(remote[4096:8192], local)


def test_timed_out_transfers(te_module, remote_peer, monkeypatch):
    """A peer that stops answering: transfers end at Mooncake's deadline (MC_TRANSFER_TIMEOUT,
    at least 5 s): transfer_check_status says -2, get_batch_transfer_status -1."""
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")  # raised to Mooncake's minimum, 5 s
    proc, info = remote_peer
    engine = make_engine(te_module)
    try:
        target, base = info["session"], info["base"]
        local_buffer = np.ones(4096, np.uint8)  # kept alive: the engine reads it
        local = local_buffer.ctypes.data
        assert engine.transfer_sync_write(target, local, base, 4096) == 0
        stop_process(proc.pid)
        start = time.monotonic()
        single = engine.transfer_submit_write(target, local, base, 4096)
        batch = engine.batch_transfer_async_write(target, [local], [base + 4096], [4096])
        assert engine.transfer_check_status(single) == 0
        assert engine.get_batch_transfer_status([batch]) == -1
        assert wait_status(engine, single) == -2
        assert time.monotonic() - start >= 4.5
        assert engine.transfer_check_status(single) == -1  # freed
    finally:
        engine.close()

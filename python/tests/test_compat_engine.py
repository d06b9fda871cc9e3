# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.compat.mooncake.TransferEngine in one process (two engines); the two-process PD
pattern is in test_pd.py."""

import ctypes

import numpy as np
import pytest

from larder.compat import mooncake as compat

MB = 1 << 20


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
    monkeypatch.setattr(compat, "_warned_protocols", set())
    engine = te_module.TransferEngine()
    with pytest.warns(RuntimeWarning, match="'rdma'"):
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert engine._engine.routes == ["local", "shm", "tcp"]
    engine.close()


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
    assert decode.get_first_buffer_address(target) == second.ctypes.data
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
        handle = decode._peers[target][0].handle
        assert decode._engine.segment_route(handle) == "shm"
        assert prefill.read_bytes_from_buffer(address + 10, 4) == local[:4].tobytes()
        assert prefill.write_bytes_to_buffer(address, b"abcdef", 3) == 0
        assert ctypes.string_at(address, 4) == b"abc\0"
        assert prefill.write_bytes_to_buffer(address, b"ab", 3) == -1
        assert prefill.free_managed_buffer(address, MB) == 0
        assert prefill.free_managed_buffer(address, MB) == -1
        # A shm mapping outlives its owner's registration: only a refresh of the peer's buffer
        # list (which get_first_buffer_address does) makes later transfers fail.
        assert decode.get_first_buffer_address(target) == 0
        assert decode.transfer_sync_write(target, local.ctypes.data, address, 16) == -1
    finally:
        prefill.close()
        decode.close()

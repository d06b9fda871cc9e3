# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""setup()'s lifecycle and naming in the Mooncake layer, as Mooncake's users meet them: the
segment name is the host as given with a port of Mooncake's range, a taken port is replaced
(so several stores of one process set up with the same address all work), a store set up (or
failed) must be closed before the next setup, and the copying writes are bounded by
local_buffer_size."""

import socket

import numpy as np
import pytest

MB = 1 << 20
INVALID = -600
PORTS = range(12300, 14301)


def mooncake_setup(module, address, local_hostname, local_buffer_size=16 * MB):
    s = module.MooncakeDistributedStore()
    code = s.setup(local_hostname, "P2PHANDSHAKE", 16 * MB, local_buffer_size, "tcp", "",
                   address)
    return s, code


def test_hostname_without_port_gets_one_of_mooncakes_range(mooncake_store, master):
    s, code = mooncake_setup(mooncake_store, master.address, "localhost")
    assert code == 0
    host, port = s.get_hostname().split(":")
    assert host == "localhost" and int(port) in PORTS
    # The name is what the master knows, so it places replicas by it.
    config = mooncake_store.ReplicateConfig()
    config.preferred_segment = s.get_hostname()
    assert s.put("setup/a", b"v", config) == 0
    assert s.get_replica_desc("setup/a")[0].segment_name == s.get_hostname()
    assert s.close() == 0
    assert s.get_hostname() == ""


def test_a_taken_port_is_replaced(mooncake_store, master):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        probe.listen()
        port = probe.getsockname()[1]
        # Another process holds the port: the store serves on another one of the range.
        s, code = mooncake_setup(mooncake_store, master.address, f"127.0.0.1:{port}")
        assert code == 0
        host, served = s.get_hostname().split(":")
        assert host == "127.0.0.1" and int(served) in PORTS
        s.close()


def test_stores_of_one_process_with_one_address(mooncake_store, master):
    # Mooncake's tests set up store after store with "localhost:12345" and never close them.
    first, code = mooncake_setup(mooncake_store, master.address, "localhost:12345")
    assert code == 0
    second, code = mooncake_setup(mooncake_store, master.address, "localhost:12345")
    assert code == 0
    assert first.get_hostname() != second.get_hostname()
    assert second.put("setup/two", b"v") == 0
    assert first.get("setup/two") == b"v"
    second.close()
    first.close()


def test_setup_again_needs_close(mooncake_store, master):
    s, code = mooncake_setup(mooncake_store, master.address, "127.0.0.1")
    assert code == 0
    name = s.get_hostname()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   master.address) == INVALID
    assert s.setup_dummy(16 * MB, 16 * MB, "localhost:12345") == INVALID
    assert s.health_check() == 0 and s.get_hostname() == name  # the first setup stands
    assert s.close() == 0
    # A failed setup, too, must be closed before the next one.
    assert s.setup({"local_hostname": "127.0.0.1", "master_server_addr": master.address,
                    "global_segment_size": "50%"}) == INVALID
    assert s.setup({"local_hostname": "127.0.0.1", "master_server_addr": master.address,
                    "global_segment_size": "16MB"}) == INVALID
    assert s.close() == 0
    assert s.setup({"local_hostname": "127.0.0.1", "master_server_addr": master.address,
                    "global_segment_size": "16MB"}) == 0
    assert s.close() == 0


@pytest.mark.parametrize("local_buffer_size", [0, 4096])
def test_copying_writes_are_bounded_by_the_local_buffer(mooncake_store, master,
                                                        local_buffer_size, prefix):
    s, code = mooncake_setup(mooncake_store, master.address, "127.0.0.1", local_buffer_size)
    assert code == 0
    try:
        too_big = b"x" * (local_buffer_size + 1)
        assert s.put(prefix + "a", too_big) == INVALID
        assert s.is_exist(prefix + "a") == 0
        assert s.put_parts(prefix + "b", too_big[:1], too_big[1:]) == INVALID
        assert s.upsert(prefix + "c", too_big) == INVALID
        assert s.batch_is_exist([prefix + k for k in "abc"]) == [0, 0, 0]
        if local_buffer_size:
            fits = b"y" * local_buffer_size
            assert s.put_batch([prefix + "d", prefix + "e"], [fits, too_big]) == INVALID
            assert s.batch_is_exist([prefix + "d", prefix + "e"]) == [1, 0]
            assert s.get(prefix + "d") == fits
        # The zero-copy calls do not stage: they are not bounded by it.
        pool = np.full(2 * 4096, 7, np.uint8)
        assert s.register_buffer(pool.ctypes.data, pool.nbytes) == 0
        assert s.put_from(prefix + "zc", pool.ctypes.data, pool.nbytes) == 0
        assert s.unregister_buffer(pool.ctypes.data) == 0
    finally:
        s.close()


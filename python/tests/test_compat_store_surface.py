# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The rest of Mooncake's store surface through the shim: soft pins and ReplicateConfig's fields,
upserts, buffers, scatter-gather and ranged reads, replica descriptors, removals by force and by
regex, tenants, the client's HTTP server, and the calls' bad input."""

import ctypes
import json
import re
import time
import urllib.request

import numpy as np
import pytest

import larder
from conftest import INVALID, NOT_FOUND, setup_mooncake_store, wait_until
from workers import MB

HAS_LEASE = -706
NO_HANDLE = -200


@pytest.fixture
def mc(mooncake_store, master):
    s = setup_mooncake_store(mooncake_store, master.address)
    yield s
    s.close()


@pytest.fixture
def small_pool(mooncake_store, fresh_master):
    """A store whose 4 MiB segment is the whole pool of a master of the test's own."""
    s = setup_mooncake_store(mooncake_store, fresh_master.address, global_segment_size=4 * MB)
    yield s
    s.close()


def _soft_pin(module, ttl_ms=None):
    config = module.ReplicateConfig()
    config.soft_pin_action = module.SoftPinAction.ENABLE
    config.soft_pin_ttl_ms = ttl_ms
    return config


@pytest.fixture
def pool(mc):
    buffer = np.zeros(4 * MB, np.uint8)
    assert mc.register_buffer(buffer.ctypes.data, buffer.nbytes) == 0
    yield buffer
    assert mc.unregister_buffer(buffer.ctypes.data) == 0


def test_exports(mooncake_store):
    for name in ("MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction",
                 "MooncakeHostMemAllocator", "BufferPool", "RegisteredBufferPool",
                 "ReplicaDescriptor", "ReplicaStatus", "BufferHandle", "ObjectDataType"):
        assert hasattr(mooncake_store, name), name
    assert mooncake_store.COMPLETE == mooncake_store.ReplicaStatus.COMPLETE
    import mooncake

    assert mooncake.BufferPool is mooncake_store.BufferPool
    assert mooncake.RegisteredBufferPool is mooncake_store.BufferPool


def test_replicate_config_fields(mooncake_store):
    config = mooncake_store.ReplicateConfig()
    action = mooncake_store.SoftPinAction
    assert (action.PRESERVE, action.ENABLE, action.DISABLE) == (0, 1, 2)
    assert config.replica_num == 1
    assert config.with_soft_pin is False and config.with_hard_pin is False
    assert config.soft_pin_action == action.PRESERVE
    assert config.soft_pin_ttl_ms is None
    assert config.preferred_segment == "" and config.preferred_segments == []
    assert config.group_ids is None
    config.soft_pin_ttl_ms = 0
    config.soft_pin_ttl_ms = (1 << 64) - 1
    for bad in (-1, 1 << 64, 1.5, "10", True):
        with pytest.raises(TypeError):
            config.soft_pin_ttl_ms = bad
    assert config.soft_pin_ttl_ms == (1 << 64) - 1
    config.soft_pin_ttl_ms = None
    assert "replica_num=1" in str(config)


def test_soft_pin_requests_are_validated(mooncake_store, mc):
    config = mooncake_store.ReplicateConfig()
    config.soft_pin_ttl_ms = 1000  # a TTL without ENABLE
    assert mc.put("sp/a", b"v", config) == INVALID
    config.soft_pin_action = mooncake_store.SoftPinAction.DISABLE
    assert mc.put("sp/a", b"v", config) == INVALID
    config.soft_pin_action = mooncake_store.SoftPinAction.ENABLE
    assert mc.put("sp/a", b"v", config) == 0
    config.soft_pin_ttl_ms = None
    assert mc.put("sp/b", b"v", config) == 0  # the master's default TTL
    config.soft_pin_ttl_ms = 100 * 24 * 3600 * 1000  # past the master's maximum
    assert mc.put("sp/c", b"v", config) == INVALID
    assert mc.is_exist("sp/c") == 0


def test_soft_pinned_objects_are_evicted_last(mooncake_store, small_pool):
    """A full pool evicts unpinned objects first; soft-pinned ones stay while any is left."""
    s = small_pool
    soft = _soft_pin(mooncake_store)
    value = bytes(256 * 1024)
    pinned = [f"soft/{i}" for i in range(4)]
    for key in pinned:  # the oldest objects of the pool
        assert s.put(key, value, soft) == 0
    for i in range(64):  # 16 MiB through a 4 MiB pool
        assert s.put(f"plain/{i}", value) == 0
    assert s.batch_is_exist(pinned) == [1, 1, 1, 1]
    assert s.is_exist("plain/0") == 0  # evicted
    assert s.is_exist("plain/63") == 1


def test_soft_pin_ttl_unpins(mooncake_store, small_pool):
    s = small_pool
    value = bytes(256 * 1024)
    assert s.put("ttl/0", value, _soft_pin(mooncake_store, ttl_ms=3000)) == 0
    for i in range(64):  # while pinned, the pool evicts around it
        assert s.put(f"ttl-plain/{i}", value) == 0
    assert s.is_exist("ttl/0") == 1
    # Once the TTL lapses it is an unpinned object, and the oldest: the next puts evict it.
    deadline = time.monotonic() + 30
    i = 64
    while s.is_exist("ttl/0") == 1:
        assert time.monotonic() < deadline, "the soft pin never lapsed"
        assert s.put(f"ttl-plain/{i}", value) == 0
        i += 1
    assert s.is_exist("ttl/0") == 0


def test_upsert_family(mc, pool):
    assert mc.upsert("up/a", b"one") == 0
    assert mc.get("up/a") == b"one"
    assert mc.upsert("up/a", b"two") == 0  # same size
    assert mc.get("up/a") == b"two"
    assert mc.upsert("up/a", b"a longer value") == 0  # another size
    assert mc.get("up/a") == b"a longer value"
    assert mc.put("up/a", b"ignored") == 0  # put leaves a stored key alone
    assert mc.get("up/a") == b"a longer value"
    for i in range(10):
        assert mc.upsert("up/seq", str(i).encode()) == 0
    assert mc.get("up/seq") == b"9"
    assert mc.upsert_parts("up/parts", b"ab", memoryview(b"cd")) == 0
    assert mc.get("up/parts") == b"abcd"
    assert mc.upsert_batch(["up/a", "up/new"], [b"A", b"N"]) == 0
    assert mc.get_batch(["up/a", "up/new"]) == [b"A", b"N"]
    base = pool.ctypes.data
    pool[:8] = 7
    assert mc.upsert_from("up/from", base, 8) == 0
    pool[:8] = 8
    assert mc.upsert_from("up/from", base, 8) == 0
    assert mc.get("up/from") == bytes([8] * 8)
    assert mc.batch_upsert_from(["up/from", "up/b"], [base, base], [4, 4]) == [0, 0]
    assert mc.get("up/from") == bytes([8] * 4)
    assert mc.upsert("up/empty", b"") == INVALID


def test_get_buffer(mc):
    data = bytes(range(256)) * 64
    assert mc.put("gb/a", data) == 0
    buf = mc.get_buffer("gb/a")
    assert buf.size() == len(data) == len(buf)
    assert bytes(buf) == data
    assert memoryview(buf).nbytes == len(data)
    assert ctypes.string_at(buf.ptr(), 16) == data[:16]
    assert mc.get_buffer("gb/missing") is None
    buffers = mc.batch_get_buffer(["gb/a", "gb/missing", "gb/a"])
    assert buffers[1] is None and bytes(buffers[0]) == bytes(buffers[2]) == data
    assert buffers[0].ptr() != buffers[2].ptr()
    assert mc.batch_get_buffer([]) == []
    assert np.frombuffer(buffers[0], np.uint8)[255] == 255


def test_multi_buffers(mc, pool):
    base = pool.ctypes.data
    layers, piece = 4, 4096
    keys = [f"mb/{i}" for i in range(8)]
    ptrs = [[base + (layer * 16 + i) * piece for layer in range(layers)] for i in range(8)]
    sizes = [[piece] * layers for _ in range(8)]
    for i in range(8):
        for layer in range(layers):
            start = (layer * 16 + i) * piece
            pool[start:start + piece] = i * layers + layer
    assert mc.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * 8
    expected = b"".join(bytes([3 * 4 + layer]) * piece for layer in range(layers))
    assert mc.get("mb/3") == expected
    # read back into other slices, scattered differently (two halves of the object)
    dst = [[base + 2 * MB + i * 2 * layers * piece,
            base + 2 * MB + (i * 2 + 1) * layers * piece] for i in range(8)]
    half = [[layers * piece // 2, layers * piece // 2]] * 8
    assert mc.batch_get_into_multi_buffers(keys, dst, half) == [layers * piece] * 8
    got = pool[2 * MB + 3 * 2 * layers * piece:2 * MB + 3 * 2 * layers * piece + layers * piece]
    # slice one of key 3 holds its first half, contiguous in the destination
    assert got[:layers * piece // 2].tobytes() == expected[:layers * piece // 2]
    # bad input: each key gets its code
    assert mc.batch_get_into_multi_buffers(["mb/0"], [[base]], [[10]]) == [INVALID]
    assert mc.batch_get_into_multi_buffers(["mb/missing"], [[base]], [[piece]]) == [NOT_FOUND]
    assert mc.batch_put_from_multi_buffers(keys[:2], ptrs[:1], sizes[:1]) == [INVALID] * 2
    outside = np.zeros(piece, np.uint8)
    assert mc.batch_put_from_multi_buffers(["mb/x"], [[outside.ctypes.data]],
                                           [[piece]]) == [INVALID]
    assert mc.batch_put_from_multi_buffers([], [], []) == []


def test_get_into_ranges(mc, pool):
    base = pool.ctypes.data
    data = bytes(range(200))
    assert mc.put("gr/a", data) == 0
    assert mc.put("gr/b", b"B" * 50) == 0
    out = mc.get_into_ranges([base, base + 4096],
                             [["gr/a", "gr/b"], ["gr/missing"]],
                             [[[0, 100], [200]], [[0]]],
                             [[[10, 150], [0]], [[0]]],
                             [[[20, 50], [50]], [[5]]])
    assert out == [[[20, 50], [50]], [[NOT_FOUND]]]
    assert pool[:20].tobytes() == data[10:30]
    assert pool[100:150].tobytes() == data[150:200]
    assert pool[200:250].tobytes() == b"B" * 50
    # a range past the value fails alone; mismatched lists give INVALID for that key
    out = mc.get_into_ranges([base], [["gr/a", "gr/b"]], [[[0, 300], [0, 1]]],
                             [[[190, 0], [0]]], [[[20, 5], [1, 1]]])
    assert out[0][0][0] == INVALID and out[0][0][1] == 5
    assert out[0][1] == [INVALID]
    assert mc.get_into_ranges([base], [["gr/a"]], [], [], []) == []


def test_replica_descriptors(mooncake_store, mc):
    assert mc.put("rd/a", b"x" * 1000) == 0
    descriptors = mc.get_replica_desc("rd/a")
    assert len(descriptors) == 1
    d = descriptors[0]
    assert d.is_memory_replica() and not d.is_disk_replica()
    assert d.status == mooncake_store.ReplicaStatus.COMPLETE
    buffer = d.get_memory_descriptor().buffer_descriptor
    assert buffer.size == 1000 and buffer.buffer_address > 0
    assert buffer.transport_endpoint == mc.get_hostname()
    assert mc.get_replica_desc("rd/missing") == []
    both = mc.batch_get_replica_desc(["rd/a", "rd/missing"])
    assert list(both) == ["rd/a"]


def test_remove_force_and_regex(mc):
    assert mc.put_batch([f"rx/{i}" for i in range(5)] + ["other/0"], [b"v"] * 6) == 0
    assert mc.remove_by_regex(r"rx/[0-2]") == 3
    assert mc.batch_is_exist([f"rx/{i}" for i in range(5)]) == [0, 0, 0, 1, 1]
    assert mc.remove_by_regex(re.compile(r"rx/\d")) == 2  # a compiled pattern is accepted
    assert mc.remove_by_regex("rx/.*") == 0
    assert mc.remove_by_regex("(unclosed") == INVALID
    assert mc.remove_by_regex(42) == INVALID
    assert mc.is_exist("other/0") == 1
    assert mc.remove("other/0", force=True) == 0
    assert mc.remove("other/0", True) == NOT_FOUND
    assert mc.put_batch(["f/a", "f/b"], [b"a", b"b"]) == 0
    assert mc.batch_remove(["f/a", "f/x"], force=True) == [0, NOT_FOUND]


def test_batch_replica_clear(mc):
    """Mooncake's master keeps each object in a KV lease (5 s) after each put and read, and
    batch_replica_clear skips objects in theirs."""
    assert mc.put_batch(["rc/a", "rc/b"], [b"a", b"b"]) == 0
    assert mc.batch_replica_clear(["rc/a", "rc/missing"]) == []
    assert mc.batch_replica_clear(["rc/b"], mc.get_hostname()) == []
    assert mc.batch_is_exist(["rc/a", "rc/b"]) == [1, 1]
    assert mc.get("rc/a") == b"a"


@pytest.fixture
def short_lease(mooncake_store, master, monkeypatch):
    """A store whose KV lease is 1 s (MOONCAKE_DEFAULT_KV_LEASE_TTL, in ms)."""
    monkeypatch.setenv("MOONCAKE_DEFAULT_KV_LEASE_TTL", "1000")
    s = setup_mooncake_store(mooncake_store, master.address)
    yield s
    s.close()


def test_batch_replica_clear_after_the_kv_lease(short_lease):
    mc = short_lease
    assert mc.put_batch(["rcl/a", "rcl/b"], [b"a", b"b"]) == 0
    wait_until(lambda: mc.batch_replica_clear(["rcl/a", "rcl/missing"]) == ["rcl/a"],
               "rcl/a's KV lease to end")
    assert mc.batch_replica_clear(["rcl/b"], "no-such-segment") == []
    assert mc.get("rcl/b") == b"b"  # a read renews the lease
    assert mc.batch_replica_clear(["rcl/b"], mc.get_hostname()) == []
    wait_until(lambda: mc.batch_replica_clear(["rcl/b"], mc.get_hostname()) == ["rcl/b"],
               "rcl/b's KV lease to end")
    assert mc.batch_is_exist(["rcl/a", "rcl/b"]) == [0, 0]


def test_batch_replica_clear_on_one_segment_keeps_the_other_replica(short_lease, mooncake_store,
                                                                    master):
    """Mooncake's batch_replica_clear(keys, segment_name): only the replicas on that segment go;
    the key stays readable from its other replica, and goes with its last one."""
    mc = short_lease
    other = setup_mooncake_store(mooncake_store, master.address)
    try:
        config = mooncake_store.ReplicateConfig()
        config.replica_num = 2
        assert mc.put("rc2/k", b"two replicas", config=config) == 0
        wait_until(lambda: mc.batch_replica_clear(["rc2/k"], mc.get_hostname()) == ["rc2/k"],
                   "rc2/k's KV lease to end")
        assert other.get("rc2/k") == b"two replicas"
        assert mc.get("rc2/k") == b"two replicas"
        # None left on that segment: nothing to clear there.
        assert mc.batch_replica_clear(["rc2/k"], mc.get_hostname()) == []
        # The reads renewed the KV lease; their own leases end when their releases reach the
        # master (a moment after each read).
        wait_until(lambda: mc.batch_replica_clear(["rc2/k"], other.get_hostname()) == ["rc2/k"],
                   "rc2/k's KV lease to end")
        assert mc.is_exist("rc2/k") == 0
    finally:
        other.close()


def test_tenants_are_namespaces(mooncake_store, master):
    a = setup_mooncake_store(mooncake_store, master.address, tenant_id="tenant-a")
    b = setup_mooncake_store(mooncake_store, master.address, tenant_id="tenant-b")
    default = setup_mooncake_store(mooncake_store, master.address)  # "default"
    try:
        assert a.put("tn/k", b"A") == 0
        assert b.put("tn/k", b"B") == 0
        assert default.put("tn/k", b"D") == 0
        assert default.put("\x00tenant-a\x00tn/k", b"spoof") == 0  # cannot reach tenant-a
        assert (a.get("tn/k"), b.get("tn/k"), default.get("tn/k")) == (b"A", b"B", b"D")
        assert a.is_exist("\x00tenant-a\x00tn/k") == 0
        assert a.remove_by_regex("tn/.*") == 1
        assert (a.get("tn/k"), b.get("tn/k"), default.get("tn/k")) == (b"", b"B", b"D")
        assert b.remove_all() >= 1
        assert b.get("tn/k") == b"" and default.get("tn/k") == b"D"
        assert default.get("\x00tenant-a\x00tn/k") == b"spoof"
    finally:
        for s in (a, b, default):
            s.close()


def test_setup_keywords(mooncake_store, master, tmp_path):
    s = mooncake_store.MooncakeDistributedStore()
    disk = tmp_path / "ssd"
    assert s.setup("127.0.0.1:0", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   master.address, None, enable_ssd_offload=True,
                   ssd_offload_path=str(disk), tenant_id="default") == 0
    # enable_ssd_offload makes the store its host's disk holder on that directory: it holds the
    # directory's lock, so a second store on it is refused.
    assert (disk / "IDENTITY").is_file() and (disk / "LOCK").is_file()
    second = mooncake_store.MooncakeDistributedStore()
    assert second.setup("127.0.0.1:0", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                        master.address, None, enable_ssd_offload=True,
                        ssd_offload_path=str(disk)) != 0
    # enable_ssd_offload without a directory is a bad parameter
    third = mooncake_store.MooncakeDistributedStore()
    assert third.setup("127.0.0.1:0", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                       master.address, None, enable_ssd_offload=True) == -600
    assert s.health_check() == 0
    s.close()
    # a port given in local_hostname is the port served
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert s.setup(f"127.0.0.1:{port}", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   master.address) == 0
    assert s.get_hostname() == f"127.0.0.1:{port}"
    s.close()
    assert s.setup({"local_hostname": "127.0.0.1", "master_server_addr": master.address,
                    "global_segment_size": "16MB", "client_http_port": " 0 ",
                    "enable_client_http_server": " false "}) == 0
    s.close()
    assert s.setup({"local_hostname": "127.0.0.1", "master_server_addr": master.address,
                    "client_http_port": "many"}) == INVALID
    s.close()  # a failed setup, too, must be closed before the next (as in Mooncake)
    assert s.init_all("tcp", "", 16 * MB) in (0, -900)  # the environment's master
    s.close()


def test_client_http_server(mooncake_store, master):
    s = setup_mooncake_store(mooncake_store, master.address, enable_client_http_server=True,
                             client_http_port=0)
    try:
        port = s._http.port
        url = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(url + "/health", timeout=5).read() == b"OK\n"
        assert s.put("http/a", b"x" * 4096) == 0
        assert s.get("http/a") == b"x" * 4096
        metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        read = sum(int(x.split()[-1]) for x in metrics.splitlines()
                   if x.startswith("larder_client_route_bytes_total{")
                   and 'direction="read"' in x)
        assert read >= 4096, metrics
        version = json.loads(urllib.request.urlopen(url + "/version", timeout=5).read())
        assert version["version"] == larder.__version__
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url + "/nothing", timeout=5)
    finally:
        s.close()


def test_tensor_round_trip(mc):
    torch = pytest.importorskip("torch")
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    assert mc.put_tensor("tt/a", t) == 0
    assert torch.equal(mc.get_tensor("tt/a"), t)
    assert mc.upsert_tensor("tt/a", t * 2) == 0
    assert torch.equal(mc.get_tensor("tt/a"), t * 2)
    assert mc.put_tensor_with_tp("tt/tp", t, tp_size=2, split_dim=1) == 0
    assert torch.equal(mc.get_tensor_with_tp("tt/tp", tp_rank=1, tp_size=2, split_dim=1),
                       t.chunk(2, 1)[1])
    assert mc.get_tensor("tt/missing") is None
    assert mc.put_tensor("tt/bad", "not a tensor") == INVALID


def test_bad_input_never_raises(mc, pool):
    """Wrong types, negative sizes, unregistered memory and mismatched lists: Mooncake's codes,
    never an exception, and the store keeps serving."""
    base = pool.ctypes.data
    outside = np.zeros(4096, np.uint8).ctypes.data
    cases = [
        (mc.put, (123, b"v"), INVALID),
        (mc.put, ("bi/a", 42), INVALID),
        (mc.put, ("bi/a", b"v", "not a config"), INVALID),
        (mc.upsert, (None, b"v"), INVALID),
        (mc.put_from, ("bi/a", base, -1), INVALID),
        (mc.put_from, ("bi/a", "addr", 10), INVALID),
        (mc.put_from, ("bi/a", outside, 10), INVALID),
        (mc.get_into, ("bi/a", base, -5), INVALID),
        (mc.get_into, ("bi/a", outside, 10), None),  # missing key or unregistered: negative
        (mc.batch_put_from, (["a", "b"], [base], [1, 1]), [INVALID, INVALID]),
        (mc.batch_get_into, (["a"], [base, base], [1]), [INVALID]),
        (mc.batch_put_from_multi_buffers, (["a"], [[base, base]], [[1]]), [INVALID]),
        (mc.batch_put_from_multi_buffers, (["a"], [base], [[1]]), [INVALID]),
        (mc.batch_get_into_multi_buffers, (["a"], "nope", [[1]]), [INVALID]),
        (mc.get_size, (b"bytes-key",), None),
        (mc.remove, (7,), None),
        (mc.register_buffer, (base, -1), INVALID),
        (mc.unregister_buffer, ("x",), INVALID),
    ]
    for fn, args, expected in cases:
        got = fn(*args)
        if expected is None:
            assert isinstance(got, int) and got < 0, (fn.__name__, args, got)
        else:
            assert got == expected, (fn.__name__, args, got)
    assert mc.get_buffer(42) is None
    assert mc.batch_get_buffer([1, 2]) == [None, None]
    assert mc.get(None) == b""
    assert mc.batch_is_exist([None])[0] < 0
    assert mc.get_replica_desc(5) == []
    # the store still serves
    assert mc.put("bi/ok", b"fine") == 0
    assert mc.get("bi/ok") == b"fine"


def test_calls_after_close(mooncake_store, master):
    s = setup_mooncake_store(mooncake_store, master.address)
    assert s.put("ac/a", b"v") == 0
    assert s.close() == 0
    assert s.close() == 0
    assert s.put("ac/a", b"v") == INVALID
    assert s.get("ac/a") == b""
    assert s.get_buffer("ac/a") is None
    assert s.batch_put_from_multi_buffers(["a"], [[1 << 20]], [[8]]) == [INVALID]
    assert s.batch_get_into_multi_buffers(["a"], [[1 << 20]], [[8]]) == [INVALID]
    assert s.get_into_ranges([1 << 20], [["a"]], [[[0]]], [[[0]]], [[[8]]]) == [[[INVALID]]]
    assert s.remove_by_regex(".*") == INVALID
    assert s.alloc_from_mem_pool(4096) == 0
    assert s.health_check() == 1

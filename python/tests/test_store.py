# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.Store: every method, its buffer forms, and its errors."""

import json
import threading
import urllib.request

import numpy as np
import pytest

import larder
from conftest import Master, wait_until


# ---- construction and lifetime ----


def test_create_and_properties(store):
    assert store.segment_name.startswith("127.0.0.1:")
    assert store.client_id
    assert not store.closed
    assert store.segment_name in repr(store)


def test_options_from_keywords_and_environment(master, monkeypatch):
    monkeypatch.setenv("LARDER_MASTER", master.address)
    monkeypatch.setenv("LARDER_SEGMENT_NAME", "from-env")
    with larder.Store(global_segment_size="8MiB", heartbeat_interval="500ms", rpc_timeout=2.5,
                      transfer_timeout=3, replica_num=1, protocol="auto") as s:
        assert s.segment_name == "from-env"
    with larder.Store(master.address, segment_name="explicit", global_segment_size=8 << 20) as s:
        assert s.segment_name == "explicit"


def test_contributing_nothing(master, prefix):
    with larder.Store(master.address, global_segment_size=0) as reader, \
            larder.Store(master.address, global_segment_size="8MiB") as owner:
        assert reader.segment_name == ""
        owner.put(prefix + "k", b"v")
        assert reader.get(prefix + "k") == b"v"


@pytest.mark.parametrize("kwargs,error", [
    ({"global_segment_size": "lots"}, larder.InvalidArgumentError),
    ({"global_segment_size": -5}, larder.InvalidArgumentError),
    ({"replica_num": 0}, larder.InvalidArgumentError),
    ({"rpc_timeout": -1}, larder.InvalidArgumentError),
    ({"rpc_timeout": "whenever"}, larder.InvalidArgumentError),
    ({"protocol": "pigeon"}, larder.InvalidArgumentError),
    ({"local_hostname": "not-an-ip"}, larder.InvalidArgumentError),
    ({"rpc_timeout": []}, TypeError),
])
def test_bad_options(master, kwargs, error):
    with pytest.raises(error):
        larder.Store(master.address, **kwargs)


def test_bad_environment(master, monkeypatch):
    monkeypatch.setenv("LARDER_GLOBAL_SEGMENT_SIZE", "huge")
    with pytest.raises(larder.InvalidArgumentError, match="LARDER_GLOBAL_SEGMENT_SIZE"):
        larder.Store(master.address)


def test_master_unreachable():
    with pytest.raises(larder.UnavailableError, match="no larder-master answered within 300 ms"):
        larder.Store("127.0.0.1:1", rpc_timeout=1, connect_timeout="300ms")


def test_close_and_context_manager(master, prefix):
    s = larder.Store(master.address, global_segment_size="8MiB")
    with s as entered:
        assert entered is s
        s.put(prefix + "k", b"v")
    assert s.closed
    assert "closed" in repr(s)
    s.close()  # idempotent
    for call in (lambda: s.get(prefix + "k"), lambda: s.put(prefix + "k", b"v"),
                 lambda: s.segment_name, lambda: s.batch_exist([prefix + "k"])):
        with pytest.raises(larder.FailedPreconditionError):
            call()


# ---- copying API ----


@pytest.mark.parametrize("make", [
    lambda b: b,
    bytearray,
    memoryview,
    lambda b: np.frombuffer(b, dtype=np.uint8).copy(),
    lambda b: np.frombuffer(b, dtype=np.float32).copy(),
], ids=["bytes", "bytearray", "memoryview", "numpy-u8", "numpy-f32"])
def test_put_get_buffer_kinds(store, prefix, make):
    value = bytes(range(256)) * 64
    store.put(prefix + "k", make(value))
    assert store.get(prefix + "k") == value
    assert store.get_size(prefix + "k") == len(value)


def test_put_existing_key_is_not_rewritten(store, prefix):
    store.put(prefix + "k", b"first")
    store.put(prefix + "k", b"second")
    assert store.get(prefix + "k") == b"first"


def test_put_options(store, prefix):
    store.put(prefix + "pinned", b"v", pin=True, replica_num=1,
              preferred_segments=[store.segment_name])
    assert store.get(prefix + "pinned") == b"v"


def test_put_errors(store, prefix):
    with pytest.raises(larder.InvalidArgumentError):
        store.put(prefix + "empty", b"")
    with pytest.raises(larder.InvalidArgumentError):
        store.put("", b"value")
    with pytest.raises((larder.InvalidArgumentError, larder.ResourceExhaustedError)):
        store.put(prefix + "too-big", bytes(64 << 20))  # larger than any segment
    with pytest.raises(TypeError):
        store.put(prefix + "k", "a str is not bytes")
    with pytest.raises(ValueError):  # not C-contiguous
        store.put(prefix + "k", np.zeros((8, 8), np.uint8)[:, ::2])


def test_get_missing(store, prefix):
    with pytest.raises(larder.NotFoundError):
        store.get(prefix + "missing")
    with pytest.raises(LookupError):
        store.get(prefix + "missing")


def test_batch_put_and_get(store, prefix):
    keys = [f"{prefix}{i}" for i in range(10)]
    values = [bytes([i]) * (100 + i) for i in range(10)]
    assert store.batch_put(keys, values) == [None] * 10
    got = store.batch_get(keys + [prefix + "missing"])
    assert got[:10] == values
    assert isinstance(got[10], larder.NotFoundError)
    with pytest.raises(larder.NotFoundError):
        larder.check(got)
    results = store.batch_put([prefix + "a", prefix + "b"], [b"x", b""])
    assert results[0] is None and isinstance(results[1], larder.InvalidArgumentError)
    with pytest.raises(larder.InvalidArgumentError):
        store.batch_put(keys, values[:3])
    assert store.batch_put([], []) == []
    assert store.batch_get([]) == []


# ---- zero-copy API ----


def test_register_put_from_get_into_objects(store, prefix):
    pool = np.zeros(1 << 20, np.uint8)
    store.register_buffer(pool)
    try:
        pool[:4096] = np.arange(4096) % 251
        store.put_from(prefix + "whole", pool[:4096])
        store.put_from(prefix + "prefix", pool, 100)
        assert store.get(prefix + "whole") == pool[:4096].tobytes()
        assert store.get(prefix + "prefix") == pool[:100].tobytes()
        dst = pool[8192:16384]
        assert store.get_into(prefix + "whole", dst) == 4096
        assert np.array_equal(dst[:4096], pool[:4096])
        assert store.get_into(prefix + "prefix", pool[20000:], 100) == 100
    finally:
        store.unregister_buffer(pool)


def test_register_put_from_get_into_addresses(store, prefix):
    pool = np.zeros(1 << 16, np.uint8)
    base = pool.ctypes.data
    store.register_buffer(base, pool.nbytes)
    pool[:10] = 7
    store.put_from(prefix + "k", base, 10, pin=True)
    assert store.get_into(prefix + "k", base + 1000, 64) == 10
    assert pool[1000:1010].tolist() == [7] * 10
    store.unregister_buffer(base)


def test_registered_object_kept_alive(store, prefix):
    buf = bytearray(b"z" * 4096)
    address = np.frombuffer(buf, np.uint8).ctypes.data
    store.register_buffer(buf)
    with pytest.raises(BufferError):  # the registration holds a view: no resizing meanwhile
        buf.extend(b"more")
    del buf  # still registered, still alive
    store.put_from(prefix + "k", address, 4096)
    assert store.get(prefix + "k") == b"z" * 4096
    store.unregister_buffer(address)


def test_zero_copy_errors(store, prefix):
    pool = np.zeros(1 << 16, np.uint8)
    other = np.zeros(1 << 12, np.uint8)
    store.register_buffer(pool)
    try:
        with pytest.raises(larder.InvalidArgumentError):  # overlaps
            store.register_buffer(pool[100:200])
        with pytest.raises(larder.FailedPreconditionError):  # not registered
            store.put_from(prefix + "k", other)
        store.put_from(prefix + "k", pool[:1000])
        with pytest.raises(larder.FailedPreconditionError):
            store.get_into(prefix + "k", other)
        with pytest.raises(larder.InvalidArgumentError):  # value larger than the buffer
            store.get_into(prefix + "k", pool[:10])
        with pytest.raises(larder.NotFoundError):
            store.get_into(prefix + "missing", pool)
        with pytest.raises(larder.InvalidArgumentError):  # size beyond the buffer
            store.put_from(prefix + "k2", pool[:10], 11)
        with pytest.raises(larder.InvalidArgumentError):  # negative size
            store.put_from(prefix + "k2", pool, -1)
        with pytest.raises(TypeError):  # an address needs a size
            store.put_from(prefix + "k2", pool.ctypes.data)
        with pytest.raises(BufferError):  # get_into needs writable memory
            store.get_into(prefix + "k", b"\0" * 4096)
    finally:
        store.unregister_buffer(pool)
    with pytest.raises(larder.NotFoundError):
        store.unregister_buffer(pool)
    with pytest.raises(larder.InvalidArgumentError):
        store.register_buffer(0, 100)
    with pytest.raises(larder.InvalidArgumentError):
        store.register_buffer(bytearray())


def test_batch_zero_copy(store, prefix):
    page = 4096
    pool = np.zeros(256 * page, np.uint8)
    base = pool.ctypes.data
    store.register_buffer(base, pool.nbytes)
    try:
        keys = [f"{prefix}p{i}" for i in range(64)]
        for i in range(64):
            pool[i * page:(i + 1) * page] = i
        ptrs = [base + i * page for i in range(64)]
        assert store.batch_put_from(keys, ptrs, [page] * 64) == [None] * 64
        dst = [base + (128 + i) * page for i in range(64)]
        assert store.batch_get_into(keys, dst, [page] * 64) == [page] * 64
        assert np.array_equal(pool[128 * page:192 * page], pool[:64 * page])
        # numpy integer addresses and sizes (e.g. from an index array) are addresses, not buffers
        np_ptrs = base + np.arange(64, dtype=np.uint64) * page
        assert store.batch_get_into(keys, list(np_ptrs), list(np.full(64, page))) == [page] * 64
        assert store.get_into(keys[1], np.uint64(base), np.int64(page)) == page
        assert pool[0] == 1
        # object form, no sizes
        views = [pool[(200 + i) * page:(201 + i) * page] for i in range(4)]
        assert store.batch_get_into(keys[:4], views) == [page] * 4
        assert store.batch_put_from([prefix + "o1", prefix + "o2"], views[:2]) == [None, None]
        # per-key errors
        results = store.batch_get_into([keys[0], prefix + "missing"], dst[:2], [page, page])
        assert results[0] == page and isinstance(results[1], larder.NotFoundError)
        outside = np.zeros(page, np.uint8)
        results = store.batch_put_from([prefix + "x", prefix + "y"], [base, outside], [page, None])
        assert results[0] is None and isinstance(results[1], larder.FailedPreconditionError)
        # whole-call errors
        with pytest.raises(larder.InvalidArgumentError):
            store.batch_get_into(keys, dst[:3], [page] * 3)
        with pytest.raises(larder.InvalidArgumentError):
            store.batch_put_from(keys[:2], ptrs[:2], [page])
        with pytest.raises(TypeError):
            store.batch_get_into(keys[:2], ptrs[:2])  # addresses without sizes
    finally:
        store.unregister_buffer(base)


# ---- metadata ----


def test_exist_size_remove(fresh_master, prefix):
    store = larder.Store(fresh_master.address, global_segment_size="8MiB")
    store.put(prefix + "a", b"12345")
    assert store.exist(prefix + "a") is True
    assert store.exist(prefix + "b") is False
    assert store.batch_exist([prefix + "a", prefix + "b"]) == [True, False]
    # A key the master cannot hold (over --max-key-size, 4096) is an error, not an absent key.
    oversize = prefix + "k" * 5000
    with pytest.raises(larder.InvalidArgumentError):
        store.exist(oversize)
    absent, error = store.batch_exist([prefix + "b", oversize])
    assert absent is False and isinstance(error, larder.InvalidArgumentError)
    assert store.get_size(prefix + "a") == 5
    with pytest.raises(larder.NotFoundError):
        store.get_size(prefix + "b")
    store.remove(prefix + "a")  # get_size takes no lease
    assert store.exist(prefix + "a") is False
    with pytest.raises(larder.NotFoundError):
        store.remove(prefix + "a")
    store.batch_put([prefix + "c", prefix + "d"], [b"c", b"d"])
    results = store.batch_remove([prefix + "c", prefix + "d", prefix + "e"])
    assert results[:2] == [None, None] and isinstance(results[2], larder.NotFoundError)
    store.put(prefix + "read", b"v")
    assert store.get(prefix + "read") == b"v"
    store.remove(prefix + "read")  # the read's lease ended with its copy
    assert store.exist(prefix + "read") is False
    store.close()


def test_batch_remove_keeps_what_was_used_recently(store, prefix):
    """unused_for: objects put or read within that long stay (UnavailableError), the rest go."""
    old, read = prefix + "old", prefix + "read"
    store.batch_put([old, read], [b"o", b"r"])
    kept = store.batch_remove([old, read], unused_for=60)
    assert all(isinstance(r, larder.UnavailableError) for r in kept), kept
    assert store.batch_exist([old, read]) == [True, True]
    wait_until(lambda: store.batch_remove([old], unused_for=0.5) == [None],
               "an object put 0.5 s ago to go")
    assert store.get(read) == b"r"  # a read is a use too
    assert isinstance(store.batch_remove([read], unused_for=30)[0], larder.UnavailableError)
    assert store.batch_remove([read], unused_for=0) == [None]
    with pytest.raises(larder.InvalidArgumentError):
        store.batch_remove([read], unused_for=-1)
    with pytest.raises(larder.InvalidArgumentError):
        store.batch_remove([read], unused_for=86401)


def test_remove_all(fresh_master):
    with larder.Store(fresh_master.address, global_segment_size="8MiB") as s:
        s.batch_put([f"k{i}" for i in range(5)], [b"v"] * 5)
        assert s.remove_all() == 5
        assert s.batch_exist([f"k{i}" for i in range(5)]) == [False] * 5
        assert s.remove_all() == 0


def test_route_to(master, store):
    assert store.route_to(store.segment_name) == "local"
    with larder.Store(master.address, global_segment_size="8MiB", protocol="tcp") as other:
        assert store.route_to(other.segment_name) in ("shm", "tcp")
        assert other.route_to(store.segment_name) == "tcp"
    with pytest.raises(larder.NotFoundError):
        store.route_to("no-such-segment")


# ---- concurrency and the GIL ----


def test_threads_share_a_store(store, prefix):
    errors = []

    def work(t):
        try:
            for i in range(50):
                key = f"{prefix}{t}-{i}"
                store.put(key, key.encode())
                assert store.get(key) == key.encode()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_master_down(fresh_master, prefix):
    s = larder.Store(fresh_master.address, global_segment_size="8MiB", rpc_timeout=1)
    s.put(prefix + "k", b"v")
    fresh_master.stop()
    with pytest.raises(larder.UnavailableError):
        s.get(prefix + "k")
    with pytest.raises(larder.UnavailableError):
        s.put(prefix + "k2", b"v")
    with pytest.raises(larder.UnavailableError):
        s.exist(prefix + "k")
    results = s.batch_get_into([prefix + "k"], [bytearray(16)])
    assert isinstance(results[0], larder.UnavailableError)
    assert all(isinstance(r, larder.UnavailableError) for r in s.batch_exist([prefix + "k"] * 2))
    s.close()  # does not hang without a master



def _disk_demotions(http_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/summary", timeout=5) as reply:
        return json.load(reply)["disk"]["demoted"]


def test_disk_write_through(tmp_path, prefix):
    """A put with disk_write_through is written to the holder's disk when it ends, even on a
    master that demotes nothing by itself (--disk-demote-watermark 1); a plain put is not."""
    m = Master("--disk-demote-watermark", "1", http=True)
    try:
        with larder.Store(m.address, global_segment_size="32MiB", rpc_timeout=5,
                          disk_path=str(tmp_path / "disk"), disk_capacity="64MiB") as s:
            s.put(prefix + "behind", b"b" * 4096)
            s.put(prefix + "through", b"t" * 4096, disk_write_through=True)
            wait_until(lambda: _disk_demotions(m.http_port) >= 1, "the write-through demotion")
            assert _disk_demotions(m.http_port) == 1
            assert s.get(prefix + "through") == b"t" * 4096
    finally:
        m.stop()

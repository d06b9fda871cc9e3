# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""LMCache's Mooncake connectors replayed against the shim: the remote connector
(mooncakestore_connector.py) in both of its modes, and the native MooncakeBackend.

The writer is an LMCache worker in a process of its own (consumer_workers.Writer): 7-positional
setup, a ReplicateConfig with preferred_segment = get_hostname(), its pinned buffer registered.
The test process is another worker that reads the chunks back as LMCache does and compares them
with what was stored, over tcp (protocol "tcp") and over shm (protocol "shm"), asserting the
route taken.
"""

import math
import types
import uuid

import pytest

import consumer_workers as cw
from conftest import SHIM_DIR, larder_protocol, module_master, shim_first
from workers import MB, page_hash

torch = pytest.importorskip("torch")

META = cw.LMC_META_SIZE
FULL = cw.LMC_KV_SHAPE[2]  # tokens of a full chunk


@pytest.fixture(scope="module")
def mc():
    with shim_first() as shim_dir:
        yield cw.import_mooncake_store(str(shim_dir))


lm_master = module_master()


def lmcache_worker(mc, master, protocol):
    """The connector's __init__ in this process; returns (store, config, pinned buffer)."""
    store = mc.MooncakeDistributedStore()
    store.setup("localhost", "http://127.0.0.1:8080/metadata", 32 * MB, 32 * MB, protocol, "",
                master.address)  # LMCache ignores the code; get_hostname() tells
    assert store.get_hostname(), "setup failed"
    rc = mc.ReplicateConfig()
    rc.replica_num = 1
    rc.preferred_segment = store.get_hostname()
    buf = torch.zeros(64 * cw.LMC_CHUNK_CAPACITY, dtype=torch.uint8)
    assert store.register_buffer(buf.data_ptr(), buf.numel()) == 0
    return store, rc, buf


@pytest.fixture(scope="module", params=[("tcp", "tcp"), ("shm", "shm")], ids=["tcp", "shm"])
def workers(request, mc, lm_master):
    protocol, route = request.param
    with larder_protocol(route):
        writer = cw.Writer(SHIM_DIR, "lmcache", lm_master.address, protocol, 64 * MB)
        with writer.closed_on_error():
            store, rc, buf = lmcache_worker(mc, lm_master, protocol)
    yield types.SimpleNamespace(writer=writer, store=store, config=rc, buf=buf, route=route)
    store.unregister_buffer(buf.data_ptr())
    store.close()
    writer.close()


def chunk_keys(tag, n, worker=0):
    uid = uuid.uuid4().hex[:8]
    return [cw.lmc_key(page_hash(tag, uid, i), worker) for i in range(n)]


def assert_route(w, before, payload):
    cw.assert_read_route(w.store, w.writer, w.route, before, payload)


def test_setup_and_registration(workers):
    """7-positional setup returns 0, preferred_segment is the writer's own "host:port" segment
    name, and registering the pinned buffer returns 0."""
    codes = workers.writer.call("w_lmc_setup_codes")
    assert codes["setup"] == 0 and codes["register"] == 0
    assert codes["preferred_segment"] == workers.writer.hostname
    host, _, port = workers.writer.hostname.rpartition(":")
    assert host and port.isdigit()


def test_chunk_meta_mode(workers):
    """save_chunk_meta=True: put_parts(key, 28-byte RemoteMetadata, kv_bytes); batched_get reads
    batch_get_buffer(keys) (None per miss), takes memoryview(buffer) of 28 + length bytes and
    torch.frombuffer(buffer, dtype, offset=28, count) into the memory object."""
    w = workers
    keys = chunk_keys("meta", 6)
    chunks = [(k, FULL, dtype) for k, dtype in zip(keys[:4], cw.LMC_DTYPES)]
    chunks += [(keys[4], 17, "bfloat16"), (keys[5], 1, "float16")]  # partial last chunks
    assert w.writer.call("w_lmc_put_with_meta", chunks) == [0] * 6
    assert w.store.is_exist(keys[0]) == 1  # exists(): truthy
    missing = cw.lmc_key(page_hash("meta-missing", uuid.uuid4().hex))
    assert w.store.is_exist(missing) == 0  # falsy: a miss

    before = cw.route_bytes(w.store)
    buffers = w.store.batch_get_buffer(keys[:3] + [missing] + keys[3:])
    assert len(buffers) == 7 and buffers[3] is None
    buffers = buffers[:3] + buffers[4:]
    payload = 0
    for (key, tokens, dtype_name), buffer in zip(chunks, buffers):
        assert buffer is not None, key
        view = memoryview(buffer)
        length, fmt, meta_dtype, shape = cw.lmc_deserialize_meta(view[:META])
        assert len(view) == length + META == len(buffer)
        assert (fmt, meta_dtype) == (cw.LMC_FMT_KV_2LTD, dtype_name)
        assert shape == (2, 4, tokens, 32)
        dtype = getattr(torch, meta_dtype)
        t = torch.frombuffer(buffer, dtype=dtype, offset=META,
                             count=math.prod(shape)).reshape(shape)
        memory_obj = torch.empty(shape, dtype=dtype)
        memory_obj.copy_(t)
        assert torch.equal(memory_obj, cw.lmc_chunk(key, tokens, dtype_name)), key
        payload += len(view)
        del t, view
    del buffers, buffer  # LMCache drops them once copied (a held buffer keeps a read lease)
    assert_route(w, before, payload)
    assert w.store.batch_get_buffer([]) == []


def test_zero_copy_mode(workers):
    """save_chunk_meta=False: put_from(key, ptr, nbytes, replica_config); batched_get calls
    batch_get_into with the full chunk capacity per key and reads a short chunk's true length
    (reshape_partial_chunk), <= 0 meaning a miss."""
    w = workers
    keys = chunk_keys("zc", 5)
    tokens = [FULL, FULL, FULL, 40, 3]
    chunks = [(k, t, "float32") for k, t in zip(keys, tokens)]
    assert w.writer.call("w_lmc_put_zero_copy", chunks) == [0] * 5
    missing = cw.lmc_key(page_hash("zc-missing", uuid.uuid4().hex))
    cap = cw.LMC_CHUNK_CAPACITY
    all_keys = keys + [missing]
    ptrs = [w.buf.data_ptr() + i * cap for i in range(len(all_keys))]
    before = cw.route_bytes(w.store)
    n_read = w.store.batch_get_into(all_keys, ptrs, [cap] * len(all_keys))
    assert n_read[:5] == [cw.lmc_chunk_nbytes(t, "float32") for t in tokens]
    assert n_read[5] <= 0 and n_read[5] == cw.OBJECT_NOT_FOUND
    for i, (key, t, dtype_name) in enumerate(chunks):
        # reshape_partial_chunk: the token count from the bytes read
        got_tokens = n_read[i] // (2 * 4 * 32 * 4)
        assert got_tokens == t
        got = w.buf[i * cap:i * cap + n_read[i]].view(torch.float32).reshape(2, 4, got_tokens, 32)
        assert torch.equal(got, cw.lmc_chunk(key, t, dtype_name)), key
    assert_route(w, before, sum(n_read[:5]))


def test_native_backend(workers):
    """MooncakeBackend: batch_put_from(keys, ptrs, sizes, replica_config) (0 per key);
    contains / batched_contains (is_exist == 1); get_into and batch_get_into, <= 0 a miss."""
    w = workers
    keys = chunk_keys("native", 8)
    chunks = [(k, FULL if i < 7 else 9, "bfloat16") for i, k in enumerate(keys)]
    assert w.writer.call("w_lmc_native_put", chunks) == [0] * 8
    missing = cw.lmc_key(page_hash("native-missing", uuid.uuid4().hex))
    assert w.store.is_exist(keys[0]) == 1
    assert [r == 1 for r in w.store.batch_is_exist(keys + [missing])] == [True] * 8 + [False]

    cap = cw.LMC_CHUNK_CAPACITY
    base = w.buf.data_ptr()
    before = cw.route_bytes(w.store)
    one = w.store.get_into(keys[0], base, cap)
    assert one == cw.lmc_chunk_nbytes(FULL, "bfloat16")
    got = w.buf[:one].view(torch.bfloat16).reshape(2, 4, FULL, 32)
    assert torch.equal(got, cw.lmc_chunk(keys[0], FULL, "bfloat16"))
    assert w.store.get_into(missing, base, cap) == cw.OBJECT_NOT_FOUND

    n_read = w.store.batch_get_into(keys, [base + (8 + i) * cap for i in range(8)], [cap] * 8)
    assert n_read == [cw.lmc_chunk_nbytes(t, "bfloat16") for _, t, _ in chunks]
    for i, (key, t, dtype_name) in enumerate(chunks):
        off = (8 + i) * cap
        got = w.buf[off:off + n_read[i]].view(torch.bfloat16).reshape(2, 4, t, 32)
        assert torch.equal(got, cw.lmc_chunk(key, t, dtype_name)), key
    assert_route(w, before, one + sum(n_read))
    # a destination smaller than the object is refused, not truncated
    assert w.store.get_into(keys[0], base, 100) < 0


def test_close_sequence(mc, lm_master):
    """close(): unregister_buffer(ptr) == 0, then close() == 0; the writer's own close sequence
    too, after which its chunks are gone."""
    writer = cw.Writer(SHIM_DIR, "lmcache", lm_master.address, "tcp", 16 * MB)
    try:
        keys = chunk_keys("close", 2)
        assert writer.call("w_lmc_native_put", [(k, FULL, "float16") for k in keys]) == [0, 0]
        store, _, buf = lmcache_worker(mc, lm_master, "tcp")
        try:
            assert store.batch_is_exist(keys) == [1, 1]
            assert writer.call("w_lmc_close") == {"unregister": 0, "close": 0}
            assert store.batch_is_exist(keys) == [0, 0]  # they lived in the writer's segment
            assert store.unregister_buffer(buf.data_ptr()) == 0
            # the buffer is no longer registered: a zero-copy read into it is refused
            assert store.put("close-check", b"x" * 64) == 0
            assert store.get_into("close-check", buf.data_ptr(), 64) < 0
        finally:
            assert store.close() == 0
    finally:
        writer.close()

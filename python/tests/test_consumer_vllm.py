# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""vLLM's MooncakeStoreConnector (kv_connector/v1/mooncake/store/worker.py) replayed against the
shim.

The writer is a vLLM worker in a process of its own (consumer_workers.Writer): 7-positional
setup, a ReplicateConfig with a preferred_segment, its per-layer K and V caches registered; its
sending thread stores blocks as scatter lists (one slice per layer, K and V) with
batch_is_exist, then batch_put_from_multi_buffers of the missing keys, and backs off on
NO_AVAILABLE_HANDLE (-200). The test process is the loading side: lookups (batch_is_exist),
batch_get_replica_desc (tier log), batch_get_into_multi_buffers into its own KV caches, tensors,
and the reset (remove_all(force=True)). Over tcp (protocol "tcp") and over shm (protocol "rdma",
vLLM's default, which Larder runs as "auto").
"""

import types
import uuid
import warnings

import pytest

import consumer_workers as cw
from conftest import SHIM_DIR, Master, larder_protocol, module_master, shim_first
from workers import MB, page_hash

PROTOCOLS = [("tcp", "tcp"), ("rdma", "shm")]
IDS = ["tcp", "shm"]
OBJECT = 2 * cw.VLLM_LAYERS * cw.VLLM_BLOCK


@pytest.fixture(scope="module")
def mc():
    with shim_first() as shim_dir:
        yield cw.import_mooncake_store(str(shim_dir))


# long leases: test_reset_remove_all_force's held buffer must still be leased when the writer
# tries to remove it, however slow the machine (a release ends a lease at once)
vl_master = module_master("--lease-ttl", "60s")


def loader(mc, master, protocol, global_segment_size=16 * MB, tenant_id=None):
    """The loading worker in this process: setup (non-zero raises) and its KV caches."""
    store = mc.MooncakeDistributedStore()
    kwargs = {"tenant_id": tenant_id} if tenant_id else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "rdma" runs as "auto"
        ret = store.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, 16 * MB, protocol,
                          "", master.address, **kwargs)
    if ret != 0:
        raise RuntimeError(f"setup: {ret}")
    kv = cw.VLLMKVCaches(store)
    assert kv.register_codes == [0] * len(kv.segments)
    return store, kv


@pytest.fixture(scope="module", params=PROTOCOLS, ids=IDS)
def workers(request, mc, vl_master):
    protocol, route = request.param
    with larder_protocol(route):
        writer = cw.Writer(SHIM_DIR, "vllm", vl_master.address, protocol, 64 * MB, "self", False,
                           None)
        with writer.closed_on_error():
            store, kv = loader(mc, vl_master, protocol)
    yield types.SimpleNamespace(writer=writer, store=store, kv=kv, route=route,
                                protocol=protocol)
    store.close()
    writer.close()


def block_keys(tag, n, tp_rank=0):
    uid = uuid.uuid4().hex[:8]
    return [cw.vllm_key(page_hash(tag, uid, i), tp_rank) for i in range(n)]


def load(store, kv, keys, block_ids, tp_rank=0):
    """KVCacheStoreRecvingThread: lists rotated by tp_rank, one batch_get_into_multi_buffers;
    >= 0 counts as loaded. Returns the results in the keys' order."""
    addrs, sizes = kv.scatter(block_ids)
    n = len(keys)
    rot = tp_rank % n if n else 0
    r_keys, r_addrs, r_sizes = (x[rot:] + x[:rot] for x in (list(keys), addrs, sizes))
    res = store.batch_get_into_multi_buffers(r_keys, r_addrs, r_sizes)
    assert len(res) == n
    return res[n - rot:] + res[:n - rot] if rot else res


def assert_route(w, before, payload):
    cw.assert_read_route(w.store, w.writer, w.route, before, payload)


def test_store_then_load(workers):
    """The sending thread stores 24 blocks (then 32 overlapping: only the 8 new are put); the
    loader reads them into other blocks of its caches with batch_get_into_multi_buffers."""
    w = workers
    assert w.writer.call("w_vllm_register_codes") == [0] * (2 * cw.VLLM_LAYERS)
    keys = block_keys("load", 32)
    first = w.writer.call("w_vllm_store", keys[:24], list(range(24)))
    assert first["res"] == [0] * 24 and first["missing"] == 24 and not first["pressure"]
    second = w.writer.call("w_vllm_store", keys, list(range(32)))
    assert second["missing"] == 8 and second["res"] == [0] * 8

    block_ids = list(range(63, 31, -1))
    before = cw.route_bytes(w.store)
    res = load(w.store, w.kv, keys, block_ids, tp_rank=1)
    assert all(v >= 0 for v in res)  # vLLM's success test
    assert res == [OBJECT] * 32  # and the true byte count
    assert w.kv.check(keys, block_ids) == 0
    assert_route(w, before, 32 * OBJECT)
    assert w.store.get(keys[5]) == w.kv.expected_value(keys[5])  # slices in segment order

    missing = cw.vllm_key(page_hash("load-missing", uuid.uuid4().hex))
    res = load(w.store, w.kv, [keys[0], missing], [0, 1])
    assert res[0] == OBJECT and res[1] < 0


def test_lookup(workers):
    """The lookup server: a block hash counts only when batch_is_exist is 1 for every rank's
    key; one rank missing makes it a miss."""
    w = workers
    hashes = [page_hash("lookup", uuid.uuid4().hex, i) for i in range(6)]
    rank0 = [cw.vllm_key(h, 0) for h in hashes]
    rank1 = [cw.vllm_key(h, 1) for h in hashes[:4]]  # rank 1 stored only the first 4
    assert w.writer.call("w_vllm_store", rank0 + rank1, list(range(10)))["res"] == [0] * 10
    candidates = [cw.vllm_key(h, r) for h in hashes for r in (0, 1)]
    res = w.store.batch_is_exist(candidates)
    assert set(res) <= {0, 1}
    hits = 0
    for i in range(len(hashes)):
        if not (res[2 * i] == 1 and res[2 * i + 1] == 1):
            break
        hits += 1
    assert hits == 4


def test_replica_descriptors(workers):
    """The tier log: batch_get_replica_desc(keys) maps each key to its replicas; the first is a
    memory replica whose buffer_descriptor.size is the object's size, at the writer's segment."""
    w = workers
    keys = block_keys("desc", 6)
    assert w.writer.call("w_vllm_store", keys, list(range(6)))["res"] == [0] * 6
    missing = cw.vllm_key(page_hash("desc-missing", uuid.uuid4().hex))
    descs = w.store.batch_get_replica_desc(keys + [missing])
    for key in keys:
        replicas = descs.get(key) if hasattr(descs, "get") else descs[key]
        assert replicas, key
        first = replicas[0]
        tier = ("memory" if first.is_memory_replica() else
                "disk" if first.is_disk_replica() or first.is_local_disk_replica() else "unknown")
        assert tier == "memory"
        buffer = first.get_memory_descriptor().buffer_descriptor
        assert buffer.size == OBJECT
        assert buffer.transport_endpoint == w.writer.hostname
        assert buffer.buffer_address != 0
    assert not descs.get(missing)
    assert w.store.get_replica_desc(missing) == []


def test_tensors(workers):
    """put_tensor in the writer, get_tensor in the loader: torch.equal, dtype and shape kept;
    a missing key reads as None."""
    torch = pytest.importorskip("torch")
    w = workers
    uid = uuid.uuid4().hex[:8]
    items = [(f"tensor/{uid}/{dtype}", dtype, shape) for dtype, shape in
             [("float32", (4, 33)), ("bfloat16", (2, 3, 64)), ("int64", (17,)),
              ("bool", (5, 5)), ("int8", (3, 1, 2))]]
    assert w.writer.call("w_vllm_put_tensors", items) == [0] * len(items)
    for key, dtype, shape in items:
        got = w.store.get_tensor(key)
        assert got is not None, key
        assert got.dtype == getattr(torch, dtype) and tuple(got.shape) == shape
        assert torch.equal(got, cw.vllm_tensor(torch, key, dtype, shape)), key
    assert w.store.get_tensor(f"tensor/{uid}/missing") is None


@pytest.mark.parametrize("protocol,route", PROTOCOLS, ids=IDS)
def test_back_pressure(mc, protocol, route):
    """A pool with nothing to evict (one tiny segment, every object hard-pinned): the sending
    thread's batches fail with -200 per key (NO_AVAILABLE_HANDLE), which turns store pressure
    on; once space is freed (remove), the retried batch succeeds and pressure clears. The loader
    contributes no memory (vLLM's standalone-store mode: global_segment_size 0)."""
    master = Master()
    try:
        store, kv = loader(mc, master, protocol, global_segment_size=0)
        try:
            with cw.Writer(SHIM_DIR, "vllm", master.address, protocol, 2 * MB, "self", True,
                           None) as writer:
                batches = writer.call("w_vllm_fill_until_pressure", uuid.uuid4().hex, 8, 16)
                last = batches[-1]
                assert last["pressure"], [b["failed_codes"] for b in batches]
                assert last["failed_codes"] == [cw.NO_AVAILABLE_HANDLE]
                assert all(b["res"] == [0] * 8 for b in batches[:-1])
                assert len(batches) >= 2  # the pool held some batches before filling up
                assert all(v in (0, cw.NO_AVAILABLE_HANDLE) for v in last["res"])
                # the keys that failed were not stored
                failed = [k for k, v in zip(last["keys"], last["res"]) if v != 0]
                assert store.batch_is_exist(failed) == [0] * len(failed)

                # free the first two batches (the writer could not evict them), then retry the
                # failed range: it succeeds as a whole and clears the pressure
                assert store.batch_remove(batches[0]["keys"] + batches[1]["keys"]) == [0] * 16
                block_ids = list(range(48, 56))
                retry = writer.call("w_vllm_store", last["keys"], block_ids)
                assert retry["failed_codes"] == [] and not retry["pressure"], retry
                assert retry["res"] == [0] * len(failed)

                before = cw.route_bytes(store)
                res = load(store, kv, last["keys"], list(range(8)))
                assert res == [OBJECT] * 8
                assert kv.check(last["keys"], list(range(8))) == 0
                cw.assert_read_route(store, writer, route, before, 8 * OBJECT)
                assert writer.close() == 0
        finally:
            store.close()
    finally:
        master.stop()


@pytest.mark.parametrize("protocol,route", PROTOCOLS, ids=IDS)
def test_reset_remove_all_force(mc, vl_master, protocol, route):
    """The reset: remove_all(force=True) returns how many objects it removed, those just read
    included (their leases are released asynchronously, so they are usually still held: Larder
    has no way to hold a reader's lease from Python, and a plain remove's -706 cannot be made
    certain), and leaves nothing behind."""
    tenant = f"vllm-reset-{uuid.uuid4().hex[:6]}"  # so the count is this test's objects
    with cw.Writer(SHIM_DIR, "vllm", vl_master.address, protocol, 16 * MB, "self", False,
                   tenant) as writer:
        store, kv = loader(mc, vl_master, protocol, tenant_id=tenant)
        try:
            keys = block_keys("reset", 10)
            assert writer.call("w_vllm_store", keys, list(range(10)))["res"] == [0] * 10
            held = store.get_buffer(keys[3])
            assert held is not None and bytes(memoryview(held)) == kv.expected_value(keys[3])
            assert store.larder_store().route_to(writer.hostname) == route
            assert writer.call("w_vllm_reset", keys[:6]) == 10
            assert store.batch_is_exist(keys) == [0] * 10
            assert writer.call("w_batch_is_exist", keys) == [0] * 10
            del held
            assert writer.call("w_remove_all", True) == 0
            assert writer.close() == 0
        finally:
            assert store.close() == 0

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""SGLang HiCache's Mooncake backend (mooncake_store.py) replayed against the shim.

The writer is an SGLang rank in a process of its own (consumer_workers.Writer): it sets the store
up as SGLang does, warms it up, registers its host pools and backs pages up ("check, then put only
what is missing"). The test process is another rank that prefetches those pages into its own bf16
host pools and checks every byte, the route taken (shm with protocol "auto", tcp with "tcp") and
the bytes counted on it. Also: the setup variants SGLang uses (8 positional arguments, keywords,
its TypeError fallback), the client's metrics server, tenants, the master's /get_all_segments
probe (check_server), clear() (remove_all) and standalone mode (setup_dummy).
"""

import logging
import re
import types
import uuid
import warnings

import pytest

import consumer_workers as cw
from conftest import (SHIM_DIR, ClientDaemon, Master, have_client_daemon, larder_protocol,
                      module_master, shim_first)
from workers import MB, page_hash

torch = pytest.importorskip("torch")

PROTOCOLS = [pytest.param("tcp", "tcp", id="tcp"), pytest.param("auto", "shm", id="shm")]
G = cw.SGL_GEOMETRY
MHA_PAGE = G["mha_page"]
MLA_PAGE = G["layers"] * G["mla_slice"]


@pytest.fixture(scope="module")
def mc():
    """mooncake.store, imported through the shim as SGLang imports it."""
    with shim_first() as shim_dir:
        yield cw.import_mooncake_store(str(shim_dir))


# This module's own master: clear() (remove_all) must not reach other modules' keys.
sg_master = module_master()


def reader_rank(mc, master, protocol, **setup_kwargs):
    """An SGLang rank in this process: setup, warmup and bf16 host pools registered."""
    sgl = cw.SGLangMooncakeStore(mc)
    sgl.setup("127.0.0.1", 16 * MB, protocol, master.address, None, **setup_kwargs)
    sgl.warmup()
    pools = cw.SGLPools(sgl.store, **G, torch_dtype=torch.bfloat16)
    pools.register(sgl)
    return sgl, pools


@pytest.fixture(scope="module", params=[("tcp", "tcp"), ("auto", "shm")], ids=["tcp", "shm"])
def ranks(request, mc, sg_master):
    protocol, route = request.param
    with larder_protocol(route):
        writer = cw.Writer(SHIM_DIR, "sglang", sg_master.address, protocol, 64 * MB, {})
        with writer.closed_on_error():
            sgl, pools = reader_rank(mc, sg_master, protocol)
    yield types.SimpleNamespace(writer=writer, sgl=sgl, pools=pools, route=route,
                                protocol=protocol)
    sgl.store.close()
    assert writer.close() == 0


def hashes_for(tag, n):
    uid = uuid.uuid4().hex[:8]
    return [page_hash(tag, uid, i) for i in range(n)]


def assert_route(r, before, payload):
    """The reads went to the writer's segment over the expected route, and only over it."""
    cw.assert_read_route(r.sgl.store, r.writer, r.route, before, payload)


# ---- data paths ----


def test_mha_page_first(ranks):
    """Two overlapping write-backs of MHA pages ("{hash}_{tp}_k"/"_v", batch_is_exist then the
    3-argument batch_put_from of the missing keys only); the other rank's batch_exists and
    prefetch (batch_get_into, every result > 0 and the true length)."""
    r = ranks
    hashes = hashes_for("mha", 96)
    first = r.writer.call("w_sgl_mha_backup", hashes[:64], 0, 0)
    assert first["pages_ok"] == [True] * 64, first["results"]
    assert first["put_keys"] == cw.sgl_mha_keys(hashes[:64], 0)
    second = r.writer.call("w_sgl_mha_backup", hashes[32:], 0, 64)
    assert second["pages_ok"] == [True] * 64, second["results"]
    assert second["put_keys"] == cw.sgl_mha_keys(hashes[64:], 0)  # the 32 new pages only

    keys = cw.sgl_mha_keys(hashes, 0)
    missing = page_hash("mha-missing", uuid.uuid4().hex)
    assert r.sgl.batch_exists(cw.sgl_mha_keys(hashes + [missing] + hashes[:1], 0), 2) == 96
    assert r.sgl.batch_exists(cw.sgl_mha_keys(hashes[:10] + [missing] + hashes[10:], 0), 2) == 10
    # only the v half of a page stored: the page is a miss
    assert r.sgl.store.batch_is_exist([f"{missing}_0_k", keys[1]]) == [0, 1]

    slots = list(range(G["pages"] - 1, G["pages"] - 97, -1))  # other slots, reverse order
    ptrs, sizes, _ = r.pools.mha_meta(slots)
    before = cw.route_bytes(r.sgl.store)
    results = r.sgl.batch_get(keys, ptrs, sizes)
    assert results == [MHA_PAGE] * len(keys)
    assert cw.SGLangMooncakeStore.pages_ok(results, 2, get=True) == [True] * 96
    assert r.pools.check_mha(keys, slots) == 0
    assert_route(r, before, len(keys) * MHA_PAGE)

    # a page whose k is missing fails as a page; its v is still read
    results = r.sgl.batch_get([f"{missing}_0_k", keys[1]], ptrs[:2], sizes[:2])
    assert results[0] == cw.OBJECT_NOT_FOUND and results[1] == MHA_PAGE
    assert cw.SGLangMooncakeStore.pages_ok(results, 2, get=True) == [False]


def test_mla_page_first(ranks):
    """MLA page_first: one key per page, "{hash}__k", one pointer of layers x page bytes."""
    r = ranks
    hashes = hashes_for("mla", 48)
    out = r.writer.call("w_sgl_mla_backup", hashes, 0)
    assert out["pages_ok"] == [True] * 48, out["results"]
    keys = cw.sgl_mla_keys(hashes)
    assert r.sgl.batch_exists(keys, 1) == 48
    slots = list(range(50, 98))
    ptrs, sizes, _ = r.pools.mla_meta(slots)
    before = cw.route_bytes(r.sgl.store)
    results = r.sgl.batch_get(keys, ptrs, sizes)
    assert results == [MLA_PAGE] * 48
    assert r.pools.check_mla(keys, slots) == 0
    assert_route(r, before, 48 * MLA_PAGE)
    # a write-back of the same pages puts nothing
    again = r.writer.call("w_sgl_mla_backup", hashes, 0)
    assert again["put_keys"] == [] and again["pages_ok"] == [True] * 48


def test_mla_layer_first_multi_buffers(ranks):
    """MLA layer_first: each key is one slice per layer (batch_put_from_multi_buffers with a
    ReplicateConfig), read back per layer with batch_get_into_multi_buffers; the object is the
    slices in layer order."""
    r = ranks
    hashes = hashes_for("mla-lf", 32)
    out = r.writer.call("w_sgl_mla_layer_first_backup", hashes, 0)
    assert out["pages_ok"] == [True] * 32, out["results"]
    assert out["put_keys"] == cw.sgl_mla_keys(hashes)
    keys = cw.sgl_mla_keys(hashes)
    slots = list(range(100, 128)) + [0, 1, 2, 3]
    ptrs, sizes = r.pools.mla_lf_meta(slots)
    before = cw.route_bytes(r.sgl.store)
    results = r.sgl.batch_get(keys, ptrs, sizes)
    assert results == [MLA_PAGE] * 32
    assert cw.SGLangMooncakeStore.pages_ok(results, 1, get=True) == [True] * 32
    assert r.pools.check_mla_lf(keys, slots) == 0
    assert_route(r, before, 32 * MLA_PAGE)
    # the same object read whole (page_first pool, one pointer): the layers concatenated
    expected = b"".join(cw.page_bytes(cw.sgl_layer_key(keys[0], layer), G["mla_slice"]).tobytes()
                        for layer in range(G["layers"]))
    assert r.sgl.store.get(keys[0]) == expected
    ptrs1, sizes1, offs = r.pools.mla_meta([7])
    assert r.sgl.store.batch_get_into(keys[:1], ptrs1, sizes1) == [MLA_PAGE]
    assert r.pools.mla.at(offs[0], MLA_PAGE).tobytes() == expected


def test_hybrid_v2_aggregated_put(ranks):
    """batch_set_v2 of a hybrid model: per page the layer-first MLA key and the mamba
    "{hash}_{tp}_temporal" / "_conv_0" keys, scalars wrapped as [ptr] / [size], all in one
    batch_put_from_multi_buffers; read back in one batch_get_into_multi_buffers."""
    r = ranks
    hashes = hashes_for("v2", 16)
    out = r.writer.call("w_sgl_v2_backup", hashes, 0, 0)
    assert out["pages_ok"] == [True] * 16, out["results"]
    assert len(out["put_keys"]) == 48
    again = r.writer.call("w_sgl_v2_backup", hashes, 0, 0)
    assert again["put_keys"] == [] and again["pages_ok"] == [True] * 16
    slots = list(range(40, 56))
    keys, ptrs, sizes, fills = r.pools.v2_meta(hashes, 0, slots)
    assert all(isinstance(p, list) for p in ptrs)
    assert r.sgl.batch_exists(keys, 3) == 16
    before = cw.route_bytes(r.sgl.store)
    results = r.sgl.batch_get(keys, ptrs, sizes)
    assert results == [sum(s) for s in sizes]
    assert cw.SGLangMooncakeStore.pages_ok(results, 3, get=True) == [True] * 16
    assert r.pools.check_v2(fills) == 0
    assert_route(r, before, sum(results))


def test_group_ids(ranks, mc):
    """Group semantics: SGLang probes ReplicateConfig for group_ids, sets one per key and uses
    the 4-argument batch_put_from; a list whose length differs from the keys' is refused per
    key (INVALID_PARAMS) and stores nothing."""
    r = ranks
    assert cw.SGLangMooncakeStore.has_group_semantics(mc.ReplicateConfig)
    assert mc.ReplicateConfig().group_ids is None
    hashes = hashes_for("group", 8)
    out = r.writer.call("w_sgl_mla_backup", hashes, 100, True)
    assert out["pages_ok"] == [True] * 8, out["results"]
    keys = cw.sgl_mla_keys(hashes)
    ptrs, sizes, _ = r.pools.mla_meta(list(range(8)))
    assert r.sgl.batch_get(keys, ptrs, sizes) == [MLA_PAGE] * 8
    assert r.pools.check_mla(keys, list(range(8))) == 0
    bad = r.writer.call("w_sgl_mla_backup", hashes_for("group-bad", 4), 110, True, True)
    assert bad["results"] == [cw.INVALID_PARAMS] * 4
    assert bad["exist"] == [0] * 4


# ---- setup, metrics, tenants, clear ----


def test_setup_variants(mc, sg_master, caplog, tmp_path):
    """The setup() shapes SGLang uses: 8 positional arguments with transfer_engine=None,
    tenant_id, enable_ssd_offload with ssd_offload_path (the disk tier on that directory); an
    unknown keyword is a
    TypeError naming it, which SGLang's fallback drops before retrying."""
    sgl = cw.SGLangMooncakeStore(mc)
    assert sgl.setup("127.0.0.1", 16 * MB, "tcp", sg_master.address, None) == 0
    assert re.fullmatch(r"127\.0\.0\.1:\d+", sgl.store.get_hostname())
    sgl.warmup()
    assert sgl.store.close() == 0

    with pytest.raises(TypeError, match="some_future_option"):
        mc.MooncakeDistributedStore().setup(
            "127.0.0.1", "P2PHANDSHAKE", 16 * MB, cw.SGL_LOCAL_BUFFER, "tcp", "",
            sg_master.address, None, some_future_option=True)
    sgl = cw.SGLangMooncakeStore(mc)
    assert sgl.setup("127.0.0.1", 16 * MB, "tcp", sg_master.address, None,
                     tenant_id=f"variants-{uuid.uuid4().hex[:6]}", some_future_option=True) == 0
    assert sgl.dropped_kwargs == ["some_future_option"]  # tenant_id was accepted
    sgl.warmup()
    assert sgl.store.close() == 0

    caplog.set_level(logging.WARNING)
    sgl = cw.SGLangMooncakeStore(mc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sgl.setup("127.0.0.1", 16 * MB, "tcp", sg_master.address, None,
                         enable_ssd_offload=True, ssd_offload_path=str(tmp_path)) == 0
    assert sgl.dropped_kwargs == []
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    said += [str(w.message) for w in caught]
    assert not any("offload" in text for text in said), said
    assert (tmp_path / "IDENTITY").is_file()  # the store holds the directory as its disk tier
    sgl.warmup()
    assert sgl.store.close() == 0


def _route_metrics(port):
    status, body = cw.http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, body
    found = re.findall(r'^larder_client_route_bytes_total\{route="(\w+)",direction="(\w+)"\} '
                       r'(\d+)$', body, re.M)
    return {(route, direction): int(n) for route, direction, n in found}


def test_client_http_server(ranks, mc, sg_master):
    """enable_client_http_server / client_http_port: the client serves /health, /version and
    /metrics, whose bytes-by-route counters rise by what a prefetch read; close() stops it."""
    r = ranks
    port = cw.free_port()
    sgl = cw.SGLangMooncakeStore(mc)
    sgl.setup("127.0.0.1", 16 * MB, r.protocol, sg_master.address, None,
              enable_client_http_server=True, client_http_port=port)
    try:
        assert cw.http_get(f"http://127.0.0.1:{port}/health")[0] == 200
        status, body = cw.http_get(f"http://127.0.0.1:{port}/version")
        assert status == 200 and '"version"' in body
        pool = cw.HostPool(sgl.store, 16 * MHA_PAGE, torch.bfloat16)
        hashes = hashes_for("metrics", 8)
        out = r.writer.call("w_sgl_mha_backup", hashes, 0, 120)
        assert out["pages_ok"] == [True] * 8
        keys = cw.sgl_mha_keys(hashes, 0)
        before = _route_metrics(port)
        results = sgl.batch_get(keys, [pool.base + i * MHA_PAGE for i in range(16)],
                                [MHA_PAGE] * 16)
        assert results == [MHA_PAGE] * 16
        after = _route_metrics(port)
        key = (r.route, "read")
        assert after.get(key, 0) - before.get(key, 0) >= 16 * MHA_PAGE, (before, after)
        others = {k: v - before.get(k, 0) for k, v in after.items()
                  if k != key and v != before.get(k, 0)}
        assert not others, others
    finally:
        assert sgl.store.close() == 0
    assert cw.http_get(f"http://127.0.0.1:{port}/health", timeout=2)[0] is None


@pytest.mark.parametrize("protocol,route", PROTOCOLS)
def test_tenants_and_clear(mc, sg_master, protocol, route):
    """Stores with different tenant_id share the master but not keys: another tenant sees none
    of them (and may store the same names), remove_all (clear()) in one tenant leaves the
    other's keys, and the owner's clear() returns how many it removed."""
    tenant_a, tenant_b = (f"tenant-{t}-{uuid.uuid4().hex[:6]}" for t in "ab")
    hashes = hashes_for("tenant", 16)
    keys = cw.sgl_mha_keys(hashes, 0)
    with cw.Writer(SHIM_DIR, "sglang", sg_master.address, protocol, 16 * MB,
                   {"tenant_id": tenant_a}) as writer:
        out = writer.call("w_sgl_mha_backup", hashes, 0, 0)
        assert out["pages_ok"] == [True] * 16
        b, b_pools = reader_rank(mc, sg_master, protocol, tenant_id=tenant_b)
        a, a_pools = reader_rank(mc, sg_master, protocol, tenant_id=tenant_a)
        try:
            ptrs, sizes, _ = b_pools.mha_meta(range(16))
            assert b.batch_exists(keys, 2) == 0
            assert b.store.batch_is_exist(keys) == [0] * 32
            assert b.batch_get(keys, ptrs, sizes) == [cw.OBJECT_NOT_FOUND] * 32
            # tenant b stores three of the same names, with its own bytes
            assert b.store.put_batch(keys[:3], [b"b" * 100] * 3) == 0
            assert b.store.get(keys[0]) == b"b" * 100

            a_ptrs, a_sizes, _ = a_pools.mha_meta(range(16))
            before = cw.route_bytes(a.store)
            assert a.batch_exists(keys, 2) == 16
            assert a.batch_get(keys, a_ptrs, a_sizes) == [MHA_PAGE] * 32
            assert a_pools.check_mha(keys, range(16)) == 0
            assert a.store.larder_store().route_to(writer.hostname) == route
            assert cw.route_delta(before, cw.route_bytes(a.store)).get(route, 0) >= 32 * MHA_PAGE

            assert b.clear() == 4  # its warmup key and the three puts
            assert b.store.batch_is_exist(keys[:3]) == [0] * 3
            assert a.batch_exists(keys, 2) == 16  # tenant a keeps all of its keys
            # the writer's clear(): its 32 keys and both warmup keys of tenant a
            assert writer.call("w_sgl_clear") == 34
            assert a.batch_exists(keys, 2) == 0
        finally:
            a.store.close()
            b.store.close()
        assert writer.close() == 0


def test_check_server_get_all_segments(mc):
    """check_server(): GET http://<master ip>:<metrics port>/get_all_segments answers an empty
    body until a segment is mounted, then text naming it (one segment per line), and empty
    again once the client has closed."""
    master = Master(http=True)
    try:
        master_ip = master.address.split(":")[0]
        url = f"http://{master_ip}:{master.http_port}/get_all_segments"
        status, body = cw.http_get(url)
        assert (status, body) == (200, "")
        sgl = cw.SGLangMooncakeStore(mc)
        sgl.setup("127.0.0.1", 16 * MB, "tcp", master.address, None)
        try:
            # setup() returns once the segment is mounted: the master lists it at once.
            status, body = cw.http_get(url)
            assert status == 200
            assert sgl.store.get_hostname() in body.splitlines(), body
            assert body.endswith("\n")
            sgl.warmup()
        finally:
            sgl.store.close()
        # close() unmounts before it returns.
        assert cw.http_get(url) == (200, "")
    finally:
        master.stop()


def test_clear_in_default_tenant(ranks, sg_master):
    """clear() as SGLang calls it (remove_all(), default tenant) empties the store for both
    ranks; the count covers at least the pages this test stored."""
    r = ranks
    hashes = hashes_for("clear", 8)
    assert r.writer.call("w_sgl_mha_backup", hashes, 0, 0)["pages_ok"] == [True] * 8
    keys = cw.sgl_mha_keys(hashes, 0)
    assert r.sgl.batch_exists(keys, 2) == 8
    removed = r.sgl.clear()
    assert removed >= 16
    assert r.sgl.store.batch_is_exist(keys) == [0] * 16
    assert r.writer.call("w_batch_is_exist", keys) == [0] * 16
    assert r.sgl.clear() == 0


# ---- standalone mode ----


def test_standalone_setup_dummy(mc, sg_master):
    """standalone_storage: host pools from MooncakeHostMemAllocator (viewed through ctypes as
    torch tensors), setup_dummy(required_bytes, local buffer, client address) to a larder-client
    daemon, then the usual registration, warmup, write-back and prefetch."""
    if not have_client_daemon():
        pytest.skip("larder-client not built")
    daemon = ClientDaemon(sg_master.address)
    try:
        allocator = mc.MooncakeHostMemAllocator()
        pages = 32
        k_ptr, kv = cw.host_mem_tensor(allocator, 2 * pages * MHA_PAGE, torch.bfloat16,
                                       (2, pages, MHA_PAGE // 2))
        kv.view(torch.uint8).fill_(0)  # the memory is writable
        required_bytes = kv.numel() * kv.element_size()
        sgl = cw.SGLangMooncakeStore(mc)
        assert sgl.store.setup_dummy(required_bytes, cw.SGL_LOCAL_BUFFER, daemon.address) == 0
        try:
            sgl.register_mem_pool_host([kv])
            sgl.warmup()
            hashes = hashes_for("standalone", 8)
            keys = cw.sgl_mha_keys(hashes, 0)
            raw = kv.view(torch.uint8).view(-1).numpy()
            ptrs = []
            for i, key in enumerate(keys):  # pages 0..7, k then v
                half, page = i % 2, i // 2
                off = (half * pages + page) * MHA_PAGE
                raw[off:off + MHA_PAGE] = cw.page_bytes(key, MHA_PAGE)
                ptrs.append(k_ptr + off)
            results = sgl.batch_set(keys, ptrs, [MHA_PAGE] * 16)
            assert cw.SGLangMooncakeStore.pages_ok(results, 2, get=False) == [True] * 8
            dst = [k_ptr + (16 + i) * MHA_PAGE for i in range(16)]
            assert sgl.batch_get(keys, dst, [MHA_PAGE] * 16) == [MHA_PAGE] * 16
            for i, key in enumerate(keys):
                off = (16 + i) * MHA_PAGE
                assert raw[off:off + MHA_PAGE].tobytes() == cw.page_bytes(key, MHA_PAGE).tobytes()
            # another (embedded) client of the cluster sees the pages
            other = cw.SGLangMooncakeStore(mc)
            other.setup("127.0.0.1", 16 * MB, "tcp", sg_master.address, None)
            try:
                assert other.batch_exists(keys, 2) == 8
                assert other.store.get(keys[0]) == cw.page_bytes(keys[0], MHA_PAGE).tobytes()
            finally:
                other.store.close()
        finally:
            sgl.store.close()
    finally:
        daemon.stop()

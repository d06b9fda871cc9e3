# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The writer side of the consumer compatibility suites (test_consumer_*.py), and the call
sequences they replay.

A :class:`Writer` is a process of its own (multiprocessing "spawn") that imports the Mooncake API
through the shim, sets a store up as a serving framework does, and then runs the functions named
``w_*`` below on the test's request, one at a time, each returning a plain dict. The test process
is the reader: it reads what the writer stored (over shm or tcp) and checks every byte.

The consumers' own logic is replayed by small classes (``SGLangMooncakeStore``, ...) that follow
the consumer code quoted in docs (argument shapes, key naming, how return values are read); both
processes use them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import queue
import struct
import sys
import time
import traceback
import types

import numpy as np

from workers import MB, page_bytes, page_hash

KB = 1 << 10
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706


def import_mooncake_store(shim_dir: str):
    """``mooncake.store`` as an application imports it, checked to be the shim."""
    if shim_dir not in sys.path:
        sys.path.insert(0, shim_dir)
    import mooncake
    import mooncake.store

    assert getattr(mooncake, "IS_LARDER", False), "the shim is not first on sys.path"
    return mooncake.store


def route_bytes(store) -> dict:
    """Bytes this MooncakeDistributedStore moved so far, by route ("shm", "tcp", "local")."""
    stats = json.loads(store.larder_store().stats_json())
    return {route: int(c.get("bytes", 0)) for route, c in stats.get("routes", {}).items()}


def route_delta(before: dict, after: dict) -> dict:
    return {r: after.get(r, 0) - before.get(r, 0) for r in set(before) | set(after)
            if after.get(r, 0) != before.get(r, 0)}


def assert_read_route(store, writer, route: str, before: dict, payload: int) -> None:
    """What ``store`` read since ``before`` (its route_bytes then) came from ``writer``'s segment
    over ``route`` only, ``payload`` bytes at least."""
    to_writer = store.larder_store().route_to(writer.hostname)
    assert to_writer == route, (to_writer, route)  # (no assert rewriting outside test modules)
    delta = route_delta(before, route_bytes(store))
    assert set(delta) == {route}, delta
    assert delta[route] >= payload, delta


class HostPool:
    """Registered host memory, as a serving framework's host KV pool: a numpy uint8 array, or a
    torch tensor of ``torch_dtype`` (SGLang's bf16 host pools, LMCache's pinned buffer)."""

    def __init__(self, store, nbytes: int, torch_dtype=None, register: bool = True) -> None:
        self.tensor = None
        if torch_dtype is not None:
            import torch

            itemsize = torch.empty((), dtype=torch_dtype).element_size()
            self.tensor = torch.zeros(nbytes // itemsize, dtype=torch_dtype)
            self.bytes = self.tensor.view(torch.uint8).numpy()
            self.base = self.tensor.data_ptr()
            self.nbytes = self.tensor.numel() * self.tensor.element_size()
        else:
            self.bytes = np.zeros(nbytes, np.uint8)
            self.base = self.bytes.ctypes.data
            self.nbytes = self.bytes.nbytes
        self.store = store
        self.registered = False
        if register:
            rc = store.register_buffer(self.base, self.nbytes)
            assert rc == 0, f"register_buffer({self.nbytes} bytes): {rc}"
            self.registered = True

    def at(self, offset: int, size: int) -> np.ndarray:
        return self.bytes[offset:offset + size]

    def fill(self, offset: int, key: str, size: int) -> None:
        self.bytes[offset:offset + size] = page_bytes(key, size)

    def holds(self, offset: int, key: str, size: int) -> bool:
        return bool(np.array_equal(self.bytes[offset:offset + size], page_bytes(key, size)))


# ---- SGLang HiCache: python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py ----

SGL_LOCAL_BUFFER = 16 * MB  # SGLANG_MOONCAKE_LOCAL_BUFFER_SIZE's default
SGL_WARMUP_PREFIX = "sglang_mooncake_store_warmup_key"


def sgl_mha_keys(hashes, tp: int) -> list:
    """MHA page_first: f"{hash}_{tp}_k", f"{hash}_{tp}_v" per page (mha_suffix = tp rank)."""
    return [f"{h}_{tp}_{kv}" for h in hashes for kv in ("k", "v")]


def sgl_mla_keys(hashes) -> list:
    """MLA: f"{hash}__k" (mla_suffix is "" without PP, hence the double underscore)."""
    return [f"{h}__k" for h in hashes]


def sgl_layer_key(key: str, layer: int) -> str:
    """The content tag of one layer's slice of a layer-first object."""
    return f"{key}#layer{layer}"


class SGLangMooncakeStore:
    """SGLang's MooncakeStore, reduced to its calls into mooncake.store.

    ``setup`` takes SGLang's arguments and its TypeError fallback; ``batch_set`` is
    "check, then put only what is missing" (_put_batch_zero_copy_impl); ``batch_get`` is
    _get_batch_zero_copy_impl; ``batch_exists`` counts leading pages whose every key is 1.
    """

    def __init__(self, mc) -> None:
        self.mc = mc
        self.store = mc.MooncakeDistributedStore()
        self.dropped_kwargs: list = []
        self.last_put_keys: list = []

    def setup(self, local_hostname, global_segment_size, protocol, master, transfer_engine=None,
              device_name="", metadata_server="P2PHANDSHAKE", **setup_kwargs) -> int:
        args = (local_hostname, metadata_server, global_segment_size, SGL_LOCAL_BUFFER,
                protocol, device_name, master, transfer_engine)
        try:
            ret_code = self.store.setup(*args, **setup_kwargs)
        except TypeError as e:  # an older Mooncake: drop the keywords it names, then retry
            message = str(e)
            dropped = [name for name in setup_kwargs if name in message]
            if not dropped:
                raise
            if "tenant_id" in dropped:
                raise RuntimeError("this Mooncake does not support tenant_id") from e
            self.dropped_kwargs = dropped
            for name in dropped:
                setup_kwargs.pop(name)
            ret_code = self.store.setup(*args, **setup_kwargs)
        if ret_code:
            raise RuntimeError(f"Failed to setup Mooncake store, error code: {ret_code}")
        return ret_code

    def warmup(self) -> None:
        key = SGL_WARMUP_PREFIX + os.urandom(16).hex()
        value = bytes(4096)
        for _ in range(10):
            if self.store.put(key, value) == 0:
                break
        else:
            raise RuntimeError("Failed to warmup Mooncake store")
        assert self.store.is_exist(key) == 1
        assert self.store.get(key) == value

    def register_mem_pool_host(self, buffers) -> None:
        """register_buffer(data_ptr, numel * element_size) per host buffer; 0-byte ones skipped."""
        for t in buffers:
            nbytes = t.numel() * t.element_size()
            if nbytes == 0:
                continue
            ret_code = self.store.register_buffer(t.data_ptr(), nbytes)
            if ret_code:
                raise RuntimeError(f"register_buffer failed: {ret_code}")

    @staticmethod
    def has_group_semantics(config_cls) -> bool:
        return hasattr(config_cls, "group_ids") or hasattr(config_cls(), "group_ids")

    def _put(self, keys, ptrs, sizes, group_ids=None):
        config = None
        if group_ids:
            config = self.mc.ReplicateConfig()
            config.group_ids = group_ids
        if isinstance(ptrs[0], (list, tuple)):  # multi-buffer mode
            return self.store.batch_put_from_multi_buffers(keys, ptrs, sizes,
                                                           config or self.mc.ReplicateConfig())
        if config is not None:
            return self.store.batch_put_from(keys, ptrs, sizes, config)
        return self.store.batch_put_from(keys, ptrs, sizes)

    def batch_set(self, keys, ptrs, sizes, group_ids=None) -> list:
        """0 per key stored (or already there), the put's code otherwise."""
        exist = self.store.batch_is_exist(keys)
        if len(exist) != len(keys):
            raise RuntimeError(f"batch_is_exist returned {len(exist)} results for {len(keys)}")
        results = [0 if e == 1 else -1 for e in exist]
        missing = [i for i, e in enumerate(exist) if e != 1]
        self.last_put_keys = [keys[i] for i in missing]
        if missing:
            codes = self._put([keys[i] for i in missing], [ptrs[i] for i in missing],
                              [sizes[i] for i in missing],
                              [group_ids[i] for i in missing] if group_ids else None)
            for i, code in zip(missing, codes):
                results[i] = code
        return results

    def batch_get(self, keys, ptrs, sizes) -> list:
        if isinstance(ptrs[0], (list, tuple)):
            return self.store.batch_get_into_multi_buffers(keys, ptrs, sizes)
        return self.store.batch_get_into(keys, ptrs, sizes)

    def batch_exists(self, keys, key_multiplier: int) -> int:
        exist = self.store.batch_is_exist(keys)
        for page in range(len(keys) // key_multiplier):
            if not all(exist[page * key_multiplier + j] == 1 for j in range(key_multiplier)):
                return page
        return len(keys) // key_multiplier

    @staticmethod
    def pages_ok(results, key_multiplier: int, get: bool) -> list:
        """_batch_postprocess: a put page succeeds when every code is 0, a get page when every
        result is > 0 (bytes read)."""
        out = []
        for page in range(len(results) // key_multiplier):
            part = results[page * key_multiplier:(page + 1) * key_multiplier]
            out.append(all(r > 0 for r in part) if get else all(r == 0 for r in part))
        return out

    def clear(self) -> int:
        return self.store.remove_all()


class SGLPools:
    """The host pools of one SGLang rank (numpy here in the writer, torch bf16 in the reader).

    mha: page_first, K half then V half, ``pages`` pages of ``mha_page`` bytes each.
    mla: page_first, ``pages`` pages of ``layers * mla_slice`` bytes.
    mla_lf: layer_first [layer][page] of ``mla_slice`` bytes (one pointer per layer per page).
    temporal / conv: the mamba sidecar pools of the hybrid (v2) model, one slot per page.
    """

    def __init__(self, store, pages, mha_page, layers, mla_slice, temporal, conv,
                 torch_dtype=None) -> None:
        self.pages, self.mha_page, self.layers = pages, mha_page, layers
        self.mla_slice, self.temporal_size, self.conv_size = mla_slice, temporal, conv
        self.mla_page = layers * mla_slice
        self.mha = HostPool(store, 2 * pages * mha_page, torch_dtype, register=False)
        self.mla = HostPool(store, pages * self.mla_page, torch_dtype, register=False)
        self.mla_lf = HostPool(store, layers * pages * mla_slice, torch_dtype, register=False)
        self.temporal = HostPool(store, pages * temporal, torch_dtype, register=False)
        self.conv = HostPool(store, pages * conv, torch_dtype, register=False)
        self.all = [self.mha, self.mla, self.mla_lf, self.temporal, self.conv]

    def register(self, sgl: SGLangMooncakeStore) -> None:
        """SGLang's register_mem_pool_host / register_mem_host_pool_v2 over every pool (and a
        0-byte one, which SGLang skips)."""
        class _Tensor:  # numel / element_size / data_ptr, as SGLang reads a host tensor
            def __init__(self, base, nbytes):
                self._base, self._nbytes = base, nbytes

            def data_ptr(self):
                return self._base

            def numel(self):
                return self._nbytes

            def element_size(self):
                return 1

        tensors = [p.tensor if p.tensor is not None else _Tensor(p.base, p.nbytes)
                   for p in self.all]
        sgl.register_mem_pool_host(tensors + [_Tensor(self.mha.base, 0)])
        for p in self.all:
            p.registered = True

    # pointers and sizes, as the host pool's get_page_buffer_meta returns them

    def mha_meta(self, slots):
        ptrs, sizes, where = [], [], []
        for s in slots:
            for half in (0, 1):  # k, v
                off = (half * self.pages + s) * self.mha_page
                ptrs.append(self.mha.base + off)
                sizes.append(self.mha_page)
                where.append(off)
        return ptrs, sizes, where

    def mla_meta(self, slots):
        offs = [s * self.mla_page for s in slots]
        return ([self.mla.base + o for o in offs], [self.mla_page] * len(slots), offs)

    def mla_lf_offsets(self, slot):
        return [(layer * self.pages + slot) * self.mla_slice for layer in range(self.layers)]

    def mla_lf_meta(self, slots):
        """_pack_multi_buffer_meta: one list of layer pointers (and sizes) per key."""
        ptrs = [[self.mla_lf.base + o for o in self.mla_lf_offsets(s)] for s in slots]
        return ptrs, [[self.mla_slice] * self.layers for _ in slots]

    def fill_mha(self, keys, slots):
        _, _, where = self.mha_meta(slots)
        for key, off in zip(keys, where):
            self.mha.fill(off, key, self.mha_page)

    def check_mha(self, keys, slots) -> int:
        _, _, where = self.mha_meta(slots)
        return sum(not self.mha.holds(off, key, self.mha_page) for key, off in zip(keys, where))

    def fill_mla(self, keys, slots):
        for key, (_, _, offs) in zip(keys, (self.mla_meta([s]) for s in slots)):
            self.mla.fill(offs[0], key, self.mla_page)

    def check_mla(self, keys, slots) -> int:
        return sum(not self.mla.holds(s * self.mla_page, key, self.mla_page)
                   for key, s in zip(keys, slots))

    def fill_mla_lf(self, keys, slots):
        for key, s in zip(keys, slots):
            for layer, off in enumerate(self.mla_lf_offsets(s)):
                self.mla_lf.fill(off, sgl_layer_key(key, layer), self.mla_slice)

    def check_mla_lf(self, keys, slots) -> int:
        bad = 0
        for key, s in zip(keys, slots):
            for layer, off in enumerate(self.mla_lf_offsets(s)):
                bad += not self.mla_lf.holds(off, sgl_layer_key(key, layer), self.mla_slice)
        return bad

    def v2_meta(self, hashes, tp, slots):
        """batch_set_v2's aggregation: per page the layer-first MLA key (multi-buffer) and the
        mamba temporal and conv keys (one buffer each, wrapped as [ptr] / [size] because another
        entry of the call is multi-buffer)."""
        keys, ptrs, sizes, fills = [], [], [], []
        for h, s in zip(hashes, slots):
            lf_ptrs, lf_sizes = self.mla_lf_meta([s])
            keys.append(f"{h}__k")
            ptrs.append(lf_ptrs[0])
            sizes.append(lf_sizes[0])
            fills.append(("mla_lf", f"{h}__k", s))
            for name, pool, size in (("temporal", self.temporal, self.temporal_size),
                                     ("conv_0", self.conv, self.conv_size)):
                key = f"{h}_{tp}_{name}"
                keys.append(key)
                ptrs.append([pool.base + s * size])
                sizes.append([size])
                fills.append((name, key, s))
        return keys, ptrs, sizes, fills

    def fill_v2(self, fills):
        for kind, key, s in fills:
            if kind == "mla_lf":
                self.fill_mla_lf([key], [s])
            elif kind == "temporal":
                self.temporal.fill(s * self.temporal_size, key, self.temporal_size)
            else:
                self.conv.fill(s * self.conv_size, key, self.conv_size)

    def check_v2(self, fills) -> int:
        bad = 0
        for kind, key, s in fills:
            if kind == "mla_lf":
                bad += self.check_mla_lf([key], [s])
            elif kind == "temporal":
                bad += not self.temporal.holds(s * self.temporal_size, key, self.temporal_size)
            else:
                bad += not self.conv.holds(s * self.conv_size, key, self.conv_size)
        return bad


SGL_GEOMETRY = dict(pages=128, mha_page=16 * KB, layers=4, mla_slice=18 * KB, temporal=4 * KB,
                    conv=2 * KB)


def _init_sglang(state, master, protocol, global_segment_size, setup_kwargs):
    state.sgl = SGLangMooncakeStore(state.mc)
    state.sgl.setup("127.0.0.1", global_segment_size, protocol, master, None, **setup_kwargs)
    state.store = state.sgl.store
    state.sgl.warmup()
    state.pools = SGLPools(state.store, **SGL_GEOMETRY)
    state.pools.register(state.sgl)
    return state.store.get_hostname()


def w_sgl_mha_backup(state, hashes, tp, first_slot):
    """HiCache write-back of MHA page_first pages into slots first_slot...: batch_is_exist, then
    the 3-argument batch_put_from of the missing keys only."""
    keys = sgl_mha_keys(hashes, tp)
    slots = list(range(first_slot, first_slot + len(hashes)))
    state.pools.fill_mha(keys, slots)
    ptrs, sizes, _ = state.pools.mha_meta(slots)
    results = state.sgl.batch_set(keys, ptrs, sizes)
    return {"pages_ok": SGLangMooncakeStore.pages_ok(results, 2, get=False),
            "put_keys": list(state.sgl.last_put_keys), "results": results}


def w_sgl_mla_backup(state, hashes, first_slot, group=False, bad_group=False):
    """MLA page_first ("{hash}__k", one pointer per key); with ``group``, SGLang's group
    semantics (ReplicateConfig.group_ids, one per key, and the 4-argument batch_put_from)."""
    keys = sgl_mla_keys(hashes)
    slots = list(range(first_slot, first_slot + len(hashes)))
    state.pools.fill_mla(keys, slots)
    ptrs, sizes, _ = state.pools.mla_meta(slots)
    group_ids = None
    if group:
        assert SGLangMooncakeStore.has_group_semantics(state.mc.ReplicateConfig)
        group_ids = ["sglang-hicache:" + h for h in hashes]  # key_multiplier 1 for MLA
        if bad_group:  # one entry short: a replacement must refuse, not misgroup
            config = state.mc.ReplicateConfig()
            config.group_ids = group_ids[:-1]
            codes = state.store.batch_put_from(keys, ptrs, sizes, config)
            return {"results": codes, "exist": state.store.batch_is_exist(keys)}
    results = state.sgl.batch_set(keys, ptrs, sizes, group_ids)
    return {"pages_ok": SGLangMooncakeStore.pages_ok(results, 1, get=False),
            "put_keys": list(state.sgl.last_put_keys), "results": results}


def w_sgl_mla_layer_first_backup(state, hashes, first_slot):
    """MLA layer_first: one pointer per layer per key, batch_put_from_multi_buffers with a
    ReplicateConfig."""
    keys = sgl_mla_keys(hashes)
    slots = list(range(first_slot, first_slot + len(hashes)))
    state.pools.fill_mla_lf(keys, slots)
    ptrs, sizes = state.pools.mla_lf_meta(slots)
    results = state.sgl.batch_set(keys, ptrs, sizes)
    return {"pages_ok": SGLangMooncakeStore.pages_ok(results, 1, get=False),
            "put_keys": list(state.sgl.last_put_keys), "results": results}


def w_sgl_v2_backup(state, hashes, tp, first_slot):
    """A hybrid (MLA + mamba) model's batch_set_v2: every pool's keys in one
    batch_put_from_multi_buffers."""
    slots = list(range(first_slot, first_slot + len(hashes)))
    keys, ptrs, sizes, fills = state.pools.v2_meta(hashes, tp, slots)
    state.pools.fill_v2(fills)
    results = state.sgl.batch_set(keys, ptrs, sizes)
    return {"pages_ok": SGLangMooncakeStore.pages_ok(results, 3, get=False),
            "put_keys": list(state.sgl.last_put_keys), "results": results}


def w_sgl_clear(state):
    return state.sgl.clear()


# ---- LMCache: mooncakestore_connector.py (remote) and mooncake_backend.py (native) ----

LMC_META_SIZE = 28
LMC_DTYPES = ["float16", "float32", "bfloat16", "uint8"]  # RemoteMetadata's dtype table, by code
LMC_KV_SHAPE = (2, 4, 64, 32)  # [kv, layers, tokens, hidden]: one chunk of 64 tokens
LMC_FMT_KV_2LTD = 1


def lmc_key(chunk_hash: str, worker: int = 0) -> str:
    """CacheEngineKey.to_string(): fmt@model@world_size@worker_id@chunk_hash."""
    return f"vllm@meta-llama/Llama-3.1-8B-Instruct@1@{worker}@{chunk_hash}"


def lmc_serialize_meta(length: int, shape, dtype_name: str, fmt: int = LMC_FMT_KV_2LTD) -> bytes:
    """RemoteMetadata.serialize(): seven int32 (length, fmt, dtype, shape[0..3])."""
    return struct.pack("iiiiiii", length, fmt, LMC_DTYPES.index(dtype_name), *shape)


def lmc_deserialize_meta(view) -> tuple:
    length, fmt, dtype, *shape = struct.unpack_from("iiiiiii", view)
    return length, fmt, LMC_DTYPES[dtype], tuple(shape)


def lmc_chunk(key: str, tokens: int, dtype_name: str):
    """The deterministic KV chunk of ``key`` (a torch tensor of shape [2, 4, tokens, 32])."""
    import torch

    shape = (LMC_KV_SHAPE[0], LMC_KV_SHAPE[1], tokens, LMC_KV_SHAPE[3])
    dtype = getattr(torch, dtype_name)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = page_bytes(key, int(np.prod(shape)) * itemsize)
    if dtype_name in ("float16", "float32", "bfloat16"):
        # finite values only, so that torch.equal is meaningful
        values = torch.from_numpy((raw.astype(np.float32) - 128.0) / 16.0)
        return values[:int(np.prod(shape))].to(dtype).reshape(shape).contiguous()
    return torch.from_numpy(raw.copy()).view(dtype).reshape(shape)


def lmc_chunk_nbytes(tokens: int, dtype_name: str) -> int:
    itemsize = {"float16": 2, "float32": 4, "bfloat16": 2, "uint8": 1}[dtype_name]
    return LMC_KV_SHAPE[0] * LMC_KV_SHAPE[1] * tokens * LMC_KV_SHAPE[3] * itemsize


LMC_CHUNK_CAPACITY = lmc_chunk_nbytes(LMC_KV_SHAPE[2], "float32")  # one allocator slot


def _init_lmcache(state, master, protocol, global_segment_size):
    """The connector's __init__: 7-positional setup (its return value ignored), a
    ReplicateConfig placing replicas in this client's own segment, the pinned buffer
    registered."""
    import torch

    store = state.mc.MooncakeDistributedStore()
    state.setup_rc = store.setup("localhost", "http://127.0.0.1:8080/metadata",
                                 global_segment_size, 32 * MB, protocol, "", master)
    state.store = store
    rc = state.mc.ReplicateConfig()
    rc.replica_num = 1
    rc.preferred_segment = store.get_hostname()
    state.config = rc
    # local_cpu_backend.memory_allocator.pin_allocator.buffer: one uint8 tensor
    state.pin = torch.zeros(64 * LMC_CHUNK_CAPACITY, dtype=torch.uint8)
    state.register_rc = store.register_buffer(state.pin.data_ptr(), state.pin.numel())
    state.next_slot = 0
    return store.get_hostname()


def _lmc_alloc(state, chunk):
    """Copies ``chunk`` into the next slot of the pinned buffer; returns (ptr, nbytes)."""
    import torch

    slot = state.next_slot
    state.next_slot = (slot + 1) % 64
    nbytes = chunk.numel() * chunk.element_size()
    dst = state.pin[slot * LMC_CHUNK_CAPACITY:slot * LMC_CHUNK_CAPACITY + nbytes]
    dst.copy_(chunk.reshape(-1).view(torch.uint8))
    return dst.data_ptr(), nbytes


def w_lmc_setup_codes(state):
    return {"setup": state.setup_rc, "register": state.register_rc,
            "preferred_segment": state.config.preferred_segment}


def w_lmc_put_with_meta(state, chunks):
    """save_chunk_meta=True: put_parts(key, 28-byte RemoteMetadata, kv_bytes) per chunk
    (``chunks``: (key, tokens, dtype name)). LMCache ignores the code; we return it."""
    codes = []
    for key, tokens, dtype_name in chunks:
        t = lmc_chunk(key, tokens, dtype_name)
        kv_bytes = memoryview(t.reshape(-1).view(__import__("torch").uint8).numpy())
        meta = lmc_serialize_meta(len(kv_bytes), t.shape, dtype_name)
        assert len(meta) == LMC_META_SIZE
        codes.append(state.store.put_parts(key, meta, kv_bytes))
    return codes


def w_lmc_put_zero_copy(state, chunks):
    """save_chunk_meta=False: put_from(key, ptr, nbytes, replica_config) per chunk."""
    codes = []
    for key, tokens, dtype_name in chunks:
        ptr, nbytes = _lmc_alloc(state, lmc_chunk(key, tokens, dtype_name))
        codes.append(state.store.put_from(key, ptr, nbytes, state.config))
    return codes


def w_lmc_native_put(state, chunks):
    """MooncakeBackend: one batch_put_from(keys, ptrs, sizes, replica_config)."""
    keys, ptrs, sizes = [], [], []
    for key, tokens, dtype_name in chunks:
        ptr, nbytes = _lmc_alloc(state, lmc_chunk(key, tokens, dtype_name))
        keys.append(key)
        ptrs.append(ptr)
        sizes.append(nbytes)
    return state.store.batch_put_from(keys, ptrs, sizes, state.config)


def w_lmc_close(state):
    """close(): unregister_buffer(ptr), then store.close()."""
    unregister = state.store.unregister_buffer(state.pin.data_ptr())
    return {"unregister": unregister, "close": state.store.close()}


# ---- vLLM: distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py ----

VLLM_LAYERS = 4
VLLM_BLOCK = 8 * KB  # block_len of one layer's K (or V) for one block
VLLM_BLOCKS = 64


def vllm_key(block_hash: str, tp_rank: int = 0, prefix: str = "") -> str:
    """PoolKey: [{cache_prefix}@]{model}{namespace}@tp_rank:{t}@pcp{p}@dcp{d}@pp_rank:{pp}
    @group:{g}@{block_hash_hex}."""
    head = f"{prefix}@" if prefix else ""
    return f"{head}Qwen3-8B@tp_rank:{tp_rank}@pcp0@dcp0@pp_rank:0@group:0@{block_hash}"


def vllm_slice_key(key: str, segment: int) -> str:
    return f"{key}#seg{segment}"


class VLLMKVCaches:
    """The worker's registered KV caches: per layer one K and one V tensor of VLLM_BLOCKS
    blocks (the FlashAttention layout, K/V split), each registered once (deduplicated by
    storage). A key's value is the scatter list of its block in every segment."""

    def __init__(self, store, blocks=VLLM_BLOCKS, layers=VLLM_LAYERS, block_len=VLLM_BLOCK):
        self.block_len, self.blocks = block_len, blocks
        self.segments = [HostPool(store, blocks * block_len, register=False)
                         for _ in range(2 * layers)]
        bases = {}
        for seg in self.segments:  # register_kv_caches: dedupe by data_ptr
            bases.setdefault(seg.base, seg.nbytes)
        self.register_codes = [store.register_buffer(b, n) for b, n in bases.items()]
        self.object_size = len(self.segments) * block_len

    def scatter(self, block_ids):
        addrs = [[seg.base + b * self.block_len for seg in self.segments] for b in block_ids]
        sizes = [[self.block_len] * len(self.segments) for _ in block_ids]
        return addrs, sizes

    def fill(self, keys, block_ids):
        for key, b in zip(keys, block_ids):
            for i, seg in enumerate(self.segments):
                seg.fill(b * self.block_len, vllm_slice_key(key, i), self.block_len)

    def check(self, keys, block_ids) -> int:
        return sum(not seg.holds(b * self.block_len, vllm_slice_key(key, i), self.block_len)
                   for key, b in zip(keys, block_ids) for i, seg in enumerate(self.segments))

    def expected_value(self, key) -> bytes:
        return b"".join(page_bytes(vllm_slice_key(key, i), self.block_len).tobytes()
                        for i in range(len(self.segments)))


class VLLMStoreSender:
    """KVCacheStoreSendingThread's store step, with its back-pressure bookkeeping."""

    def __init__(self, store, config) -> None:
        self.store, self.config = store, config
        self.pressure_active = False

    def store_batch(self, keys, addrs, sizes) -> dict:
        exists = self.store.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exists) if e != 1]
        if not missing:
            return {"skipped": False, "res": [], "missing": 0, "failed_codes": []}
        res = self.store.batch_put_from_multi_buffers(
            [keys[i] for i in missing], [addrs[i] for i in missing],
            [sizes[i] for i in missing], self.config)  # always the 4-argument form
        failed = [i for i, v in enumerate(res) if v < 0]
        if failed:
            if NO_AVAILABLE_HANDLE in {res[i] for i in failed}:
                self.pressure_active = True  # _mark_request_skipped_for_pressure
        else:
            self.pressure_active = False  # _clear_store_pressure: any full success resumes
        return {"res": res, "missing": len(missing),
                "failed_codes": sorted({res[i] for i in failed})}


def _init_vllm(state, master, protocol, global_segment_size, preferred_segment, hard_pin,
               tenant_id):
    """MooncakeStoreWorker's __init__: 7-positional setup (non-zero raises), a ReplicateConfig
    with the configured preferred_segment, then register_kv_caches."""
    store = state.mc.MooncakeDistributedStore()
    if tenant_id:  # not part of vLLM's sequence: lets a test isolate remove_all's count
        ret = store.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, 16 * MB, protocol,
                          "", master, tenant_id=tenant_id)
    else:
        ret = store.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, 16 * MB, protocol,
                          "", master)
    if ret != 0:
        raise RuntimeError(f"setup: {ret}")
    state.store = store
    cfg = state.mc.ReplicateConfig()
    if preferred_segment:
        cfg.preferred_segment = store.get_hostname() if preferred_segment == "self" \
            else preferred_segment
    if hard_pin:  # not vLLM's: makes a full pool non-evictable, so puts see back-pressure
        cfg.with_hard_pin = True
    state.config = cfg
    state.kv = VLLMKVCaches(store)
    state.sender = VLLMStoreSender(store, cfg)
    return store.get_hostname()


def w_vllm_register_codes(state):
    return state.kv.register_codes


def w_vllm_store(state, keys, block_ids):
    """One sending-thread step: the blocks' KV into the store (only the missing keys)."""
    state.kv.fill(keys, block_ids)
    addrs, sizes = state.kv.scatter(block_ids)
    out = state.sender.store_batch(keys, addrs, sizes)
    out["pressure"] = state.sender.pressure_active
    return out


def w_vllm_fill_until_pressure(state, prefix, batch, max_batches):
    """Stores batches of ``batch`` new blocks until a batch reports NO_AVAILABLE_HANDLE (the
    pool is full); returns every batch's keys and outcome."""
    batches = []
    for n in range(max_batches):
        keys = [vllm_key(page_hash(prefix, n, i)) for i in range(batch)]
        block_ids = [(n * batch + i) % state.kv.blocks for i in range(batch)]
        state.kv.fill(keys, block_ids)
        addrs, sizes = state.kv.scatter(block_ids)
        out = state.sender.store_batch(keys, addrs, sizes)
        out["keys"] = keys
        out["pressure"] = state.sender.pressure_active
        batches.append(out)
        if state.sender.pressure_active:
            break
    return batches


def w_vllm_put_tensors(state, items):
    """put_tensor(key, tensor) per (key, dtype name, shape); returns the codes."""
    import torch

    codes = []
    for key, dtype_name, shape in items:
        codes.append(state.store.put_tensor(key, vllm_tensor(torch, key, dtype_name, shape)))
    return codes


def vllm_tensor(torch, key, dtype_name, shape):
    n = int(np.prod(shape))
    raw = page_bytes(key, n)
    if dtype_name == "bool":
        return torch.from_numpy(raw % 2 == 1).reshape(shape)
    if dtype_name in ("float32", "bfloat16", "float16"):
        return torch.from_numpy((raw.astype(np.float32) - 100.0) / 8.0).to(
            getattr(torch, dtype_name)).reshape(shape)
    return torch.from_numpy(raw.astype(np.int64) - 128).to(getattr(torch, dtype_name)).reshape(
        shape)


def w_vllm_reset(state, read_keys):
    """Reads ``read_keys`` and at once resets the store as vLLM does (remove_all(force=True)):
    a read's lease is released asynchronously once its copy ends, so some of those objects are
    usually still leased when remove_all runs. Returns remove_all's count."""
    for key in read_keys:
        assert state.store.get(key), key
    return state.store.remove_all(force=True)


def w_remove_all(state, force):
    return state.store.remove_all(force=force)


def w_batch_is_exist(state, keys):
    return state.store.batch_is_exist(keys)


# ---- the writer process ----

_INITS = {"sglang": _init_sglang, "lmcache": _init_lmcache, "vllm": _init_vllm}


def _serve(shim_dir, init, init_args, commands, replies):
    parent = os.getppid()
    state = types.SimpleNamespace(store=None)
    try:
        state.mc = import_mooncake_store(shim_dir)
        replies.put({"ready": _INITS[init](state, *init_args)})
    except BaseException:  # noqa: BLE001 (reported to the test)
        replies.put({"error": traceback.format_exc()})
        return
    while True:
        try:
            command = commands.get(timeout=1)
        except queue.Empty:
            if os.getppid() != parent:  # the test process is gone
                break
            continue
        if command is None:
            break
        name, args = command
        try:
            replies.put({"result": globals()[name](state, *args)})
        except BaseException:  # noqa: BLE001 (reported to the test)
            replies.put({"error": traceback.format_exc()})
    closed = state.store.close() if state.store is not None else 0
    replies.put({"closed": closed})


class WriterError(AssertionError):
    pass


class Writer:
    """A writer process: ``Writer(shim_dir, "sglang", master, protocol, ...)`` starts it and
    waits until its store is set up (``hostname`` is then its segment name); ``call(name,
    *args)`` runs ``name`` there and returns its result; ``close()`` closes the store there and
    returns close()'s code. Every wait has a deadline; a dead writer fails the call at once."""

    def __init__(self, shim_dir, init: str, *init_args, timeout: float = 120) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._commands, self._replies = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=_serve, daemon=True,
                                 args=(str(shim_dir), init, init_args, self._commands,
                                       self._replies))
        self._proc.start()
        self._closed = False
        try:
            self.hostname = self._reply(timeout)["ready"]
        except BaseException:
            self._stop()
            raise

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._replies.get(timeout=0.2)
                break
            except queue.Empty:
                if not self._proc.is_alive():
                    # it may have replied just before exiting
                    try:
                        reply = self._replies.get(timeout=1)
                        break
                    except queue.Empty:
                        raise WriterError(
                            f"the writer exited ({self._proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise WriterError(f"no reply from the writer within {timeout} s")
        if "error" in reply:
            raise WriterError("in the writer:\n" + reply["error"])
        return reply

    def call(self, name: str, *args, timeout: float = 120):
        self._commands.put((name, args))
        return self._reply(timeout)["result"]

    def close(self, timeout: float = 60) -> int:
        if self._closed:
            return 0
        self._closed = True
        self._commands.put(None)
        try:
            return self._reply(timeout)["closed"]
        finally:
            self._stop()

    def _stop(self) -> None:
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)

    @contextlib.contextmanager
    def closed_on_error(self):
        """Closes the writer when the block raises (the exception goes on)."""
        try:
            yield self
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._closed:
            self._closed = True
            self._commands.put(None)
            self._stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> tuple:
    """(status, body text) of a GET; (None, error text) when nothing answered."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def host_mem_tensor(allocator, size: int, torch_dtype, dims):
    """SGLang's MooncakeHostTensorAllocator: MooncakeHostMemAllocator().alloc(size), viewed as a
    torch tensor through ctypes (no free() is ever called)."""
    import torch

    ptr = allocator.alloc(size)
    assert isinstance(ptr, int) and ptr != 0, f"alloc({size}) returned {ptr!r}"
    c_array = (ctypes.c_byte * size).from_address(ptr)
    tensor = torch.frombuffer(c_array, dtype=torch.uint8, count=size).view(torch_dtype).view(dims)
    return ptr, tensor

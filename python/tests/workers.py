# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Worker processes of the multi-process tests (started with multiprocessing's "spawn").

Each worker imports the Mooncake API through the shim, as SGLang and vLLM code does, and reports
a dict on its result queue: counts to check, or {"error": traceback}.
"""

import ctypes
import hashlib
import sys
import traceback

import numpy as np

MB = 1 << 20


def page_bytes(key: str, size: int) -> np.ndarray:
    """The deterministic content of ``key``: whichever process writes it writes the same bytes."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def page_hash(*parts) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _import_mooncake(shim_dir: str):
    sys.path.insert(0, shim_dir)
    import mooncake
    from mooncake.engine import TransferEngine
    from mooncake.store import MooncakeDistributedStore

    assert getattr(mooncake, "IS_LARDER", False), "the shim is not first on sys.path"
    return MooncakeDistributedStore, TransferEngine


# ---- HiCache: SGLang's hierarchical cache writing through to the store, one process per TP rank


class _HostPool:
    """A registered host KV pool of fixed-size pages, as SGLang's HostKVCache."""

    def __init__(self, store, pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.buffer = np.zeros(pages * page_size, np.uint8)
        self.base = self.buffer.ctypes.data
        rc = store.register_buffer(self.base, self.buffer.nbytes)
        assert rc == 0, f"register_buffer: {rc}"

    def slot(self, index: int) -> np.ndarray:
        return self.buffer[index * self.page_size:(index + 1) * self.page_size]

    def address(self, index: int) -> int:
        return self.base + index * self.page_size


def _backup(store, pool: _HostPool, keys: list, report: dict, name: str) -> None:
    """HiCache's write-back: ask which pages the store already has, put only the missing ones."""
    exists = store.batch_is_exist(keys)
    assert all(e in (0, 1) for e in exists), f"{name}: batch_is_exist {set(exists)}"
    missing = [i for i, e in enumerate(exists) if e == 0]
    report[name + "_existing"] = len(keys) - len(missing)
    for slot, i in enumerate(missing):
        pool.slot(slot)[:] = page_bytes(keys[i], pool.page_size)
    codes = store.batch_put_from([keys[i] for i in missing],
                                 [pool.address(slot) for slot in range(len(missing))],
                                 [pool.page_size] * len(missing))
    report[name + "_put"] = sum(1 for c in codes if c == 0)
    report[name + "_put_errors"] = sorted({c for c in codes if c != 0})


def _prefetch(store, pool: _HostPool, keys: list, first_slot: int) -> tuple:
    """HiCache's prefetch: read pages into the host pool; returns (read, mismatched, codes)."""
    addresses = [pool.address(first_slot + i) for i in range(len(keys))]
    codes = store.batch_get_into(keys, addresses, [pool.page_size] * len(keys))
    mismatched = 0
    for i, key in enumerate(keys):
        if codes[i] == pool.page_size and not np.array_equal(
                pool.slot(first_slot + i), page_bytes(key, pool.page_size)):
            mismatched += 1
    return sum(1 for c in codes if c == pool.page_size), mismatched, codes


def hicache_worker(rank, nprocs, master, protocol, page_size, shim_dir, barrier, hostnames,
                   results):
    report = {"rank": rank}
    try:
        MooncakeDistributedStore, _ = _import_mooncake(shim_dir)
        store = MooncakeDistributedStore()
        rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MB, 16 * MB, protocol, "", master)
        assert rc == 0, f"setup: {rc}"
        warmup = f"warmup-{rank}"
        assert store.put(warmup, bytes(4096)) == 0 and store.is_exist(warmup) == 1
        assert store.get(warmup) == bytes(4096)
        pool = _HostPool(store, 1024, page_size)
        hostnames[rank] = store.get_hostname()
        tp = rank
        pages_per_batch = 128

        # MHA pages of this TP rank: "{hash}_{tp}_k" and "{hash}_{tp}_v". The second batch
        # overlaps the first by 64 pages, which must not be put again.
        own = [page_hash("mha", rank, i) for i in range(192)]

        def mha_keys(hashes, t):
            return [f"{h}_{t}_{kv}" for h in hashes for kv in ("k", "v")]

        _backup(store, pool, mha_keys(own[:pages_per_batch], tp), report, "mha1")
        _backup(store, pool, mha_keys(own[64:64 + pages_per_batch], tp), report, "mha2")
        barrier.wait(timeout=300)

        # MLA pages, one key per page ("{hash}__k"), shared by every rank: ranks back up in
        # turn, and each finds the 64 shared pages already stored by rank 0.
        shared = [page_hash("mla-shared", i) for i in range(64)]
        mine = [page_hash("mla", rank, i) for i in range(64)]
        for turn in range(nprocs):
            if turn == rank:
                _backup(store, pool, [f"{h}__k" for h in shared + mine], report, "mla")
            barrier.wait(timeout=300)

        # Read back another rank's pages, 128 pages per batch.
        other = (rank + 1) % nprocs
        report["route"] = store._store.route_to(hostnames[other])
        read = mismatched = 0
        for start in (0, 128):
            hashes = [page_hash("mha", other, i) for i in range(start, min(start + 128, 192))]
            keys = mha_keys(hashes, other)
            got, bad, _ = _prefetch(store, pool, keys, 512)
            read, mismatched = read + got, mismatched + bad
        mla = [f"{h}__k" for h in shared + [page_hash("mla", other, i) for i in range(64)]]
        got, bad, _ = _prefetch(store, pool, mla, 512)
        read, mismatched = read + got, mismatched + bad
        _, _, codes = _prefetch(store, pool, [mla[0], "no-such-page__k"], 512)
        report["missing_code"] = codes[1]
        report["read"] = read
        report["mismatched"] = mismatched
        barrier.wait(timeout=300)  # keep every segment mounted until all ranks have read
        assert store.close() == 0
    except BaseException:  # noqa: BLE001 (reported to the test)
        report["error"] = traceback.format_exc()
        barrier.abort()
    results.put(report)


# ---- PD disaggregation: a prefill process exports KV memory, decode moves bytes in and out


def prefill_worker(protocol, shim_dir, to_decode, from_decode, results):
    report = {"role": "prefill"}
    try:
        _, TransferEngine = _import_mooncake(shim_dir)
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
        pool = np.zeros(8 * MB, np.uint8)
        assert engine.register_memory(pool.ctypes.data, pool.nbytes) == 0
        managed = engine.allocate_managed_buffer(4 * MB)
        assert managed != 0
        to_decode.put({"session": f"127.0.0.1:{engine.get_rpc_port()}",
                       "pool": pool.ctypes.data, "pool_size": pool.nbytes, "managed": managed,
                       "managed_size": 4 * MB})
        check = from_decode.get(timeout=300)
        if "error" in check:
            raise RuntimeError("decode failed first")
        bad = 0
        for offset, length, key in check["pool_blocks"]:
            bad += not np.array_equal(pool[offset:offset + length], page_bytes(key, length))
        for offset, length, key in check["managed_blocks"]:
            got = ctypes.string_at(managed + offset, length)
            bad += got != page_bytes(key, length).tobytes()
        report["checked"] = len(check["pool_blocks"]) + len(check["managed_blocks"])
        report["mismatched"] = bad
        to_decode.put({"verified": True})
        engine.close()
    except BaseException:  # noqa: BLE001 (reported to the test)
        report["error"] = traceback.format_exc()
        to_decode.put({"error": True})
    results.put(report)


def decode_worker(protocol, shim_dir, from_prefill, to_prefill, results):
    report = {"role": "decode"}
    try:
        _, TransferEngine = _import_mooncake(shim_dir)
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
        peer = from_prefill.get(timeout=300)
        if "error" in peer:
            raise RuntimeError("prefill failed first")
        target, pool, managed = peer["session"], peer["pool"], peer["managed"]
        block, blocks = 64 * 1024, 64
        local = np.zeros(2 * blocks * block, np.uint8)
        assert engine.register_memory(local.ctypes.data, local.nbytes) == 0

        # KV blocks land at scattered offsets of the prefill pool (reverse order, gaps).
        pool_blocks = [((blocks - 1 - i) * 2 * block, block, f"pool-{i}") for i in range(blocks)]
        for i, (_, length, key) in enumerate(pool_blocks):
            local[i * block:(i + 1) * block] = page_bytes(key, length)
        rc = engine.batch_transfer_sync_write(
            target, [local.ctypes.data + i * block for i in range(blocks)],
            [pool + off for off, _, _ in pool_blocks], [block] * blocks)
        assert rc == 0, f"batch write: {rc}"
        readback = local.ctypes.data + blocks * block
        rc = engine.batch_transfer_sync_read(
            target, [readback + i * block for i in range(blocks)],
            [pool + off for off, _, _ in pool_blocks], [block] * blocks)
        assert rc == 0, f"batch read: {rc}"
        report["readback_equal"] = bool(np.array_equal(local[:blocks * block],
                                                       local[blocks * block:]))
        # single-request forms
        single = np.zeros(block, np.uint8)
        assert engine.transfer_sync_read(target, single.ctypes.data, pool + pool_blocks[3][0],
                                         block) == 0
        report["single_equal"] = bool(np.array_equal(single, local[3 * block:4 * block]))

        # the managed (memfd) buffer
        managed_blocks = [(i * block, block, f"managed-{i}") for i in range(16)]
        for i, (_, length, key) in enumerate(managed_blocks):
            local[i * block:(i + 1) * block] = page_bytes(key, length)
            assert engine.transfer_sync_write(target, local.ctypes.data + i * block,
                                              managed + i * block, length) == 0
        routes = {}
        for b in engine._peers[target]:
            if b.handle is not None:
                routes["managed" if b.base == managed else "pool"] = \
                    engine._engine.segment_route(b.handle)
        report["routes"] = routes

        # addresses outside what the prefill registered (the two buffers may be adjacent)
        end = max(pool + peer["pool_size"], managed + peer["managed_size"])
        start = min(pool, managed)
        report["outside"] = [
            engine.transfer_sync_write(target, local.ctypes.data, end, 16),
            engine.transfer_sync_write(target, local.ctypes.data, end - 8, 16),
            engine.transfer_sync_read(target, local.ctypes.data, start - 4096, 16),
        ]
        to_prefill.put({"pool_blocks": pool_blocks, "managed_blocks": managed_blocks})
        assert from_prefill.get(timeout=300).get("verified")
        engine.close()
    except BaseException:  # noqa: BLE001 (reported to the test)
        report["error"] = traceback.format_exc()
        to_prefill.put({"error": True})
    results.put(report)

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Worker processes of test_consumer_pd.py and of the dead-peer tests of test_compat_engine.py
(started with multiprocessing's "spawn"; helpers shared with workers.py).

The prefill and decode workers replay, call for call, how SGLang's mooncake disaggregation
backend (python/sglang/srt/disaggregation/mooncake/conn.py and its transfer_engine wrapper) and
vLLM's MooncakeConnector (vllm/distributed/kv_transfer/kv_connector/v1/mooncake) drive
``mooncake.engine.TransferEngine``. A multiprocessing queue stands in for their ZMQ side
channels. Each worker reports a dict on its result queue: facts to check, or {"error": traceback}.
"""

import contextlib
import ctypes
import struct
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from workers import MB, _import_mooncake, page_bytes

KB = 1 << 10
QUEUE_TIMEOUT = 300


def _device_host(role: str) -> None:
    """Device mode: this worker's engine gets Larder's device transport (LARDER_PROTOCOL wins
    over the Mooncake protocol) and a host id of its own, so its peer is another host, reached
    over tcp through staging; its thread is bound to device 0, as a framework binds its GPU."""
    import os

    import larder

    os.environ["LARDER_PROTOCOL"] = "device,tcp"
    os.environ["LARDER_HOST_ID"] = f"pd-{role}-host"
    larder.set_current_device(0)


def _engine(shim_dir, protocol):
    _, TransferEngine = _import_mooncake(shim_dir)
    engine = TransferEngine()
    # SGLang: initialize(hostname, "P2PHANDSHAKE", "rdma", ib_device or ""); vLLM passes its
    # mooncake_protocol (default "rdma") and device_name. A non-zero return raises there.
    ret = engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "")
    if ret != 0:
        raise RuntimeError(f"TransferEngine initialization failed: {ret}")
    return engine


def _session(engine) -> str:
    return f"127.0.0.1:{engine.get_rpc_port()}"


class _Buffers:
    """Buffers of one side: numpy arrays (memory the application owns, which peers reach over
    tcp), managed buffers from allocate_managed_buffer (memfds: same-host peers map them), the way
    SGLang's custom memory pools take memory from Mooncake's allocator, or (``managed ==
    "device"``) device memory, as a GPU KV pool is: the emulated device's, from the engine's own
    device transport. The emulator's device memory is host memory, so the test may fill and check
    it through views, as a framework would with its own copies."""

    def __init__(self, engine, sizes, managed) -> None:
        self.ptrs, self.lens, self.views, self.regions = [], [], [], []
        for size in sizes:
            if managed == "device":
                region = engine.larder_engine().allocate_segment_memory(size)
                assert region.kind == "device", region.kind
                self.regions.append(region)
                ptr = region.address
                view = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
            elif managed:
                ptr = engine.allocate_managed_buffer(size)
                assert ptr != 0, "allocate_managed_buffer failed"
                view = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
            else:
                view = np.zeros(size, np.uint8)
                ptr = view.ctypes.data
            self.ptrs.append(ptr)
            self.lens.append(size)
            self.views.append(view)


def _routes(engine, target) -> list:
    """The routes of the segment handles the engine opened to ``target``."""
    return sorted({engine._engine.segment_route(b.handle) for b in engine._peers.get(target, [])
                   if b.handle is not None})


def contiguous_runs(src, dst) -> list:
    """(src start, dst start, count) of the runs where both index lists step by one: SGLang's
    group_concurrent_contiguous and vLLM's block coalescing."""
    runs, start = [], 0
    for i in range(1, len(src) + 1):
        if i == len(src) or src[i] != src[i - 1] + 1 or dst[i] != dst[i - 1] + 1:
            runs.append((src[start], dst[start], i - start))
            start = i
    return runs


def _receive(queue, failed: str) -> dict:
    """The other side's next message. Raises RuntimeError(``failed``) when it says it failed."""
    message = queue.get(timeout=QUEUE_TIMEOUT)
    if "error" in message:
        raise RuntimeError(failed)
    return message


def _fail(report, queue) -> None:
    report["error"] = traceback.format_exc()
    queue.put({"error": True})


@contextlib.contextmanager
def _reporting(role, peer, results):
    """The report of a worker's run as ``role``: put on ``results`` when the block ends, with the
    traceback when it raised (the other side then hears of the failure on ``peer``)."""
    report = {"role": role}
    try:
        yield report
    except BaseException:  # noqa: BLE001 (reported to the test)
        _fail(report, peer)
    results.put(report)


# ---- a peer that a test kills or stops ------------------------------------------------------


def peer_worker(shim_dir, protocol, size, to_test, from_test):
    """Registers ``size`` bytes, reports where they are, then serves until told to stop (or is
    killed)."""
    report = {"role": "peer"}
    try:
        engine = _engine(shim_dir, protocol)
        memory = np.zeros(size, np.uint8)
        assert engine.register_memory(memory.ctypes.data, size) == 0
        to_test.put({"session": _session(engine), "base": memory.ctypes.data, "size": size})
        from_test.get(timeout=QUEUE_TIMEOUT)
        engine.close()
    except BaseException:  # noqa: BLE001 (reported to the test)
        _fail(report, to_test)


# ---- SGLang: mooncake disaggregation backend --------------------------------------------------

SGL_LAYERS = 4
SGL_PAGES = 64  # pages per K (or V) buffer of one layer
SGL_ITEM = 16 * KB  # bytes of one page of one layer's K (or V)
SGL_AUX_ITEM = 512
SGL_AUX_SLOTS = 16
SGL_WEIGHTS = [MB, 256 * KB, 3 * MB + 12345, 4096, 2 * MB]

# The decode side's page allocations per room (request); prefill pages are its own. Room 2 holds
# a corrupted page index (far outside the buffers): its transfer fails and blacklists the session.
# Room 3 then fails without any transfer; room 4 probes the session, which recovers it.
SGL_ROOMS = [
    {"room": 0, "src": list(range(0, 10)), "dst": [5, 6, 7, 8, 20, 21, 40, 41, 42, 43], "aux": 1},
    {"room": 1, "src": [10, 11, 12, 13, 14, 30], "dst": [0, 1, 2, 3, 4, 63], "aux": 2},
    {"room": 2, "src": [15], "dst": [1 << 30], "aux": 3},
    {"room": 3, "src": [16, 17], "dst": [50, 51], "aux": 4},
    {"room": 4, "src": [18, 19, 20, 21], "dst": [10, 11, 12, 30], "aux": 5},
]
SGL_EXPECTED = {0: "Success", 1: "Success", 2: "Failed", 3: "Failed", 4: "Success"}


def _sgl_page_key(room, layer, kv, position):
    return f"sgl/room{room}/layer{layer}/{kv}/{position}"


def _sgl_aux_key(room):
    return f"sgl/aux/room{room}"


class _SGLangSender:
    """The prefill side of conn.py: per-layer K and V batches on a thread pool, contiguous pages
    merged, ret != 0 marks the session failed; a failed session fails later rooms at once until
    send_probe(session) == 0 (SGLANG_ENABLE_FAILED_SESSION_PROBE)."""

    def __init__(self, engine, src_k, src_v, src_aux) -> None:
        self.engine = engine
        self.src_k, self.src_v, self.src_aux = src_k, src_v, src_aux
        self.executor = ThreadPoolExecutor(4)
        self.session_failures: dict = {}
        self.failed_sessions: set = set()
        self.transfer_calls = 0
        self.descriptors = 0
        self.counted = threading.Lock()  # the pool's threads count concurrently

    def _transfer_data(self, session, blocks) -> int:
        srcs, dsts, lens = zip(*blocks)
        with self.counted:
            self.transfer_calls += 1
            self.descriptors += len(blocks)
        try:
            return self.engine.batch_transfer_sync_write(session, list(srcs), list(dsts),
                                                         list(lens))
        except Exception:  # noqa: BLE001 (SGLang turns exceptions into -1)
            return -1

    def send_kvcache(self, session, dst_k, dst_v, src_pages, dst_pages) -> int:
        runs = contiguous_runs(src_pages, dst_pages)
        params = [(self.src_k[i], dst_k[i]) for i in range(SGL_LAYERS)]
        params += [(self.src_v[i], dst_v[i]) for i in range(SGL_LAYERS)]

        def process_layer(src_ptr, dst_ptr):
            blocks = [(src_ptr + s * SGL_ITEM, dst_ptr + d * SGL_ITEM, SGL_ITEM * n)
                      for s, d, n in runs]
            return self._transfer_data(session, blocks)

        futures = [self.executor.submit(process_layer, *p) for p in params]
        status = 0
        for f in futures:
            if f.result() != 0:
                status = -1
        return status

    def send_aux(self, session, dst_aux, src_slot, dst_slot) -> int:
        return self.engine.transfer_sync_write(session, self.src_aux + src_slot * SGL_AUX_ITEM,
                                               dst_aux + dst_slot * SGL_AUX_ITEM, SGL_AUX_ITEM)

    def transfer_room(self, session, peer, room, probe_enabled) -> str:
        if session in self.failed_sessions:
            if not probe_enabled or self.engine.send_probe(session) != 0:
                return "Failed"  # KVPoll.Failed without touching the engine
            self.failed_sessions.discard(session)
            self.session_failures.pop(session, None)
        ret = self.send_kvcache(session, peer["dst_k"], peer["dst_v"], room["src"], room["dst"])
        if ret == 0:
            ret = self.send_aux(session, peer["dst_aux"], room["room"], room["aux"])
        if ret != 0:
            self.session_failures[session] = self.session_failures.get(session, 0) + 1
            if self.session_failures[session] >= 1:
                self.failed_sessions.add(session)
            return "Failed"
        return "Success"


def _own_memory(managed):
    """The prefill's KV: application memory, or device memory in device mode."""
    return "device" if managed == "device" else False


def sglang_prefill(shim_dir, protocol, managed, to_decode, from_decode, results):
    with _reporting("prefill", to_decode, results) as report:
        if managed == "device":
            _device_host("prefill")
        engine = _engine(shim_dir, protocol)
        kv = _Buffers(engine, [SGL_PAGES * SGL_ITEM] * (2 * SGL_LAYERS), _own_memory(managed))
        aux = _Buffers(engine, [SGL_AUX_ITEM * SGL_AUX_SLOTS], _own_memory(managed))
        # register_buffer_to_engine: one batch_register over the deduped KV and aux buffers.
        pairs = sorted(set(zip(kv.ptrs + aux.ptrs, kv.lens + aux.lens)))
        report["register"] = engine.batch_register_memory([p for p, _ in pairs],
                                                          [n for _, n in pairs])
        for room in SGL_ROOMS:
            for layer in range(SGL_LAYERS):
                for kv_index, name in ((layer, "k"), (SGL_LAYERS + layer, "v")):
                    for position, page in enumerate(room["src"]):
                        start = page * SGL_ITEM
                        kv.views[kv_index][start:start + SGL_ITEM] = page_bytes(
                            _sgl_page_key(room["room"], layer, name, position), SGL_ITEM)
            slot = room["room"] * SGL_AUX_ITEM
            aux.views[0][slot:slot + SGL_AUX_ITEM] = page_bytes(_sgl_aux_key(room["room"]),
                                                                SGL_AUX_ITEM)
        # The remote-weight seed: weights the new instance reads with batch_transfer_async_read.
        weights = _Buffers(engine, SGL_WEIGHTS, managed)
        for i, view in enumerate(weights.views):
            view[:] = page_bytes(f"sgl/weight{i}", view.size)
        assert engine.batch_register_memory(weights.ptrs, weights.lens) == 0
        to_decode.put({"session": _session(engine), "weights": list(zip(weights.ptrs,
                                                                        weights.lens))})

        peer = _receive(from_decode, "decode failed first")
        session = peer["session"]
        count = SGL_LAYERS
        peer = {"dst_k": list(struct.unpack(f"{count}Q", peer["dst_k_ptrs"])),
                "dst_v": list(struct.unpack(f"{count}Q", peer["dst_v_ptrs"])),
                "dst_aux": struct.unpack("Q", peer["dst_aux_ptrs"])[0]}
        sender = _SGLangSender(engine, kv.ptrs[:SGL_LAYERS], kv.ptrs[SGL_LAYERS:], aux.ptrs[0])
        # Room 3 arrives before the failed session is probed; room 4 after.
        statuses, calls = {}, {}
        for room in SGL_ROOMS:
            statuses[room["room"]] = sender.transfer_room(session, peer, room,
                                                          probe_enabled=room["room"] >= 4)
            calls[room["room"]] = sender.transfer_calls
        report["calls"] = calls
        report["descriptors"] = sender.descriptors
        report["probe_dead"] = engine.send_probe("127.0.0.1:1")
        report["routes"] = _routes(engine, session)
        sender.executor.shutdown()
        to_decode.put({"statuses": statuses})
        _receive(from_decode, "decode failed")  # the weights stay until decode read them
        report["statuses"] = statuses
        engine.close()


def sglang_decode(shim_dir, protocol, managed, from_prefill, to_prefill, results):
    with _reporting("decode", to_prefill, results) as report:
        if managed == "device":
            _device_host("decode")
        engine = _engine(shim_dir, protocol)
        session = _session(engine)
        kv = _Buffers(engine, [SGL_PAGES * SGL_ITEM] * (2 * SGL_LAYERS), managed)
        aux = _Buffers(engine, [SGL_AUX_ITEM * SGL_AUX_SLOTS], managed)
        # SGLang registers its pools whatever allocated them (a no-op for managed memory).
        report["register"] = engine.batch_register_memory(kv.ptrs + aux.ptrs, kv.lens + aux.lens)
        seed = _receive(from_prefill, "prefill failed first")
        to_prefill.put({
            "session": session,
            "dst_k_ptrs": struct.pack(f"{SGL_LAYERS}Q", *kv.ptrs[:SGL_LAYERS]),
            "dst_v_ptrs": struct.pack(f"{SGL_LAYERS}Q", *kv.ptrs[SGL_LAYERS:]),
            "dst_aux_ptrs": struct.pack("Q", aux.ptrs[0]),
        })

        # Remote weights: read the seed's tensors asynchronously, two batches, then wait.
        weights = [np.zeros(n, np.uint8) for _, n in seed["weights"]]
        assert engine.batch_register_memory([w.ctypes.data for w in weights],
                                            [w.size for w in weights]) == 0
        halves = (range(0, 2), range(2, len(weights)))
        batch_ids = [engine.batch_transfer_async_read(
            seed["session"], [weights[i].ctypes.data for i in half],
            [seed["weights"][i][0] for i in half], [weights[i].size for i in half])
            for half in halves]
        report["weight_batches_valid"] = all(0 < b < (1 << 64) - 1 for b in batch_ids)
        report["weight_status"] = engine.get_batch_transfer_status(batch_ids)
        report["weights_equal"] = all(np.array_equal(w, page_bytes(f"sgl/weight{i}", w.size))
                                      for i, w in enumerate(weights))
        report["weight_routes"] = _routes(engine, seed["session"])

        outcome = _receive(from_prefill, "prefill failed")
        statuses = outcome["statuses"]
        report["statuses"] = statuses
        # Every byte: the pages and aux slots of successful rooms hold what prefill wrote, all
        # the rest is still zero (room 3 was never sent, room 2's only page is out of range).
        expected_kv = [np.zeros(n, np.uint8) for n in kv.lens]
        expected_aux = np.zeros(aux.lens[0], np.uint8)
        for room in SGL_ROOMS:
            if statuses[room["room"]] != "Success":
                continue
            for layer in range(SGL_LAYERS):
                for kv_index, name in ((layer, "k"), (SGL_LAYERS + layer, "v")):
                    for position, page in enumerate(room["dst"]):
                        start = page * SGL_ITEM
                        expected_kv[kv_index][start:start + SGL_ITEM] = page_bytes(
                            _sgl_page_key(room["room"], layer, name, position), SGL_ITEM)
            slot = room["aux"] * SGL_AUX_ITEM
            expected_aux[slot:slot + SGL_AUX_ITEM] = page_bytes(_sgl_aux_key(room["room"]),
                                                                SGL_AUX_ITEM)
        report["kv_mismatched"] = [i for i, (view, want) in enumerate(zip(kv.views, expected_kv))
                                   if not np.array_equal(view, want)]
        report["aux_equal"] = bool(np.array_equal(aux.views[0], expected_aux))
        to_prefill.put({"done": True})
        assert engine.batch_unregister_memory(kv.ptrs + aux.ptrs) == 0
        engine.close()


# ---- vLLM: MooncakeConnector (P2P push from prefill into decode's blocks) ---------------------

VLLM_LAYERS = 3
VLLM_BLOCKS = 48
VLLM_BLOCK = 32 * KB
# Decode's block ids per request; prefill's own blocks are allocated in order. The last request
# names a block far past decode's cache: its batch fails and the request ends in ERROR.
VLLM_REQUESTS = {
    "req-0": [0, 1, 2, 3, 4, 5, 6, 7],
    "req-1": [20, 21, 9, 10, 11],
    "req-2": [47],
    "req-3": [30, 32, 34, 35, 36],
    "req-4": [12, 13, 14, 15, 16, 17, 18, 19],
    "req-5": [40, 41, 1 << 30],
}
VLLM_ERROR = "req-5"


def _vllm_block_key(req, region, position):
    return f"vllm/{req}/region{region}/{position}"


def vllm_prefill(shim_dir, protocol, managed, to_decode, from_decode, results):
    with _reporting("prefill", to_decode, results) as report:
        if managed == "device":
            _device_host("prefill")
        engine = _engine(shim_dir, protocol)
        # One K and one V cache per layer, vLLM's kv_caches_base_addr order.
        caches = _Buffers(engine, [VLLM_BLOCKS * VLLM_BLOCK] * (2 * VLLM_LAYERS),
                          _own_memory(managed))
        if engine.batch_register_memory(caches.ptrs, caches.lens) != 0:
            raise RuntimeError("Mooncake memory registration failed.")
        src_blocks, next_block = {}, 0
        for req, dst in VLLM_REQUESTS.items():
            src_blocks[req] = list(range(next_block, next_block + len(dst)))
            next_block += len(dst)
            for region, view in enumerate(caches.views):
                for position, block in enumerate(src_blocks[req]):
                    start = block * VLLM_BLOCK
                    view[start:start + VLLM_BLOCK] = page_bytes(
                        _vllm_block_key(req, region, position), VLLM_BLOCK)
        to_decode.put({"ready": True})
        meta = _receive(from_decode, "decode failed first")
        remote_session = f"{meta['remote_hostname']}:{meta['remote_port']}"
        descriptors = {}

        def send_blocks(req):
            src_ptrs, dst_ptrs, lengths = [], [], []
            runs = contiguous_runs(src_blocks[req], meta["requests"][req])
            for local_base, remote_base in zip(caches.ptrs, meta["kv_caches_base_addr"]):
                for s, d, n in runs:
                    src_ptrs.append(local_base + s * VLLM_BLOCK)
                    dst_ptrs.append(remote_base + d * meta["block_len"])
                    lengths.append(n * VLLM_BLOCK)
            descriptors[req] = len(src_ptrs)
            ret = engine.batch_transfer_sync_write(remote_session, src_ptrs, dst_ptrs, lengths)
            return req, "FINISH" if ret == 0 else "ERROR"

        with ThreadPoolExecutor(4) as senders:  # vLLM's num_workers sender threads
            answers = dict(senders.map(send_blocks, list(meta["requests"])))
        report["descriptors"] = descriptors
        report["routes"] = _routes(engine, remote_session)
        to_decode.put({"answers": answers})
        _receive(from_decode, "decode failed")
        engine.close()


def vllm_decode(shim_dir, protocol, managed, from_prefill, to_prefill, results):
    with _reporting("decode", to_prefill, results) as report:
        if managed == "device":
            _device_host("decode")
        engine = _engine(shim_dir, protocol)
        rpc_port = engine.get_rpc_port()
        caches = _Buffers(engine, [VLLM_BLOCKS * VLLM_BLOCK] * (2 * VLLM_LAYERS), managed)
        if engine.batch_register_memory(caches.ptrs, caches.lens) != 0:
            raise RuntimeError("Mooncake memory registration failed.")
        _receive(from_prefill, "prefill failed first")
        to_prefill.put({"remote_hostname": "127.0.0.1", "remote_port": rpc_port,
                        "kv_caches_base_addr": caches.ptrs, "block_len": VLLM_BLOCK,
                        "requests": VLLM_REQUESTS})
        outcome = _receive(from_prefill, "prefill failed")
        answers = outcome["answers"]
        report["answers"] = answers
        # Every byte of every cache: FINISH requests' blocks hold prefill's data; the blocks of a
        # request that ended in ERROR may or may not have been written; all else is zero.
        mismatched = []
        for region, view in enumerate(caches.views):
            expected = np.zeros(view.size, np.uint8)
            unknown = []
            for req, dst in VLLM_REQUESTS.items():
                for position, block in enumerate(dst):
                    if block >= VLLM_BLOCKS:
                        continue
                    start = block * VLLM_BLOCK
                    if answers[req] == "FINISH":
                        expected[start:start + VLLM_BLOCK] = page_bytes(
                            _vllm_block_key(req, region, position), VLLM_BLOCK)
                    else:
                        unknown.append((start, req, position))
            got = view.copy()
            for start, req, position in unknown:
                written = page_bytes(_vllm_block_key(req, region, position), VLLM_BLOCK)
                if np.array_equal(got[start:start + VLLM_BLOCK], written):
                    got[start:start + VLLM_BLOCK] = 0
            if not np.array_equal(got, expected):
                mismatched.append(region)
        report["mismatched"] = mismatched
        to_prefill.put({"done": True})
        engine.close()

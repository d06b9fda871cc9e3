# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Prefill/decode disaggregation as SGLang's and vLLM's Mooncake connectors drive
``mooncake.engine.TransferEngine``, replayed between two real processes (pd_workers.py).

Each test runs three times: over tcp (application memory, protocol "tcp"), over shm (protocol
"rdma", which Larder runs as "auto", with the decode side's KV memory from
allocate_managed_buffer; memory the application owns is always reached over tcp), and with the
KV in device memory on both ends (the emulated device; LARDER_PROTOCOL=device,tcp and a host id
per worker, so the bytes cross "hosts" over tcp through pinned staging: route "tcp-staged").
"""

import pytest

import pd_workers
from conftest import SHIM_DIR, run_prefill_decode

MODES = [
    pytest.param("tcp", False, "tcp", id="tcp"),
    pytest.param("rdma", True, "shm", id="shm"),
    pytest.param("tcp", "device", "tcp-staged", id="device"),
]


def run_pair(prefill, decode, protocol, managed) -> dict:
    """Runs the two workers to the end; returns their reports by role, failing on errors."""
    return run_prefill_decode(prefill, decode, str(SHIM_DIR), protocol, managed)


@pytest.mark.parametrize("protocol,managed,route", MODES)
def test_sglang_disaggregation(protocol, managed, route):
    """conn.py: decode registers its KV and aux pools and publishes its session and pointers;
    prefill pushes each room with one batch_transfer_sync_write per layer's K and V (contiguous
    pages merged) on a thread pool, then the aux slot; a failed transfer blacklists the session
    until send_probe answers 0. Plus the remote-weight loader: batch_transfer_async_read and
    get_batch_transfer_status."""
    reports = run_pair(pd_workers.sglang_prefill, pd_workers.sglang_decode, protocol, managed)
    prefill, decode = reports["prefill"], reports["decode"]
    assert prefill["register"] == 0 and decode["register"] == 0
    assert decode["statuses"] == pd_workers.SGL_EXPECTED, decode
    batches = 2 * pd_workers.SGL_LAYERS
    # room 2 failed and blacklisted the session: room 3 made no transfer at all
    assert prefill["calls"] == {0: batches, 1: 2 * batches, 2: 3 * batches, 3: 3 * batches,
                                4: 4 * batches}, prefill
    # merged runs per batch: room 0 has 3, room 1 2, room 2 1, room 4 2
    assert prefill["descriptors"] == batches * (3 + 2 + 1 + 2), prefill
    assert prefill["probe_dead"] != 0
    assert decode["kv_mismatched"] == [] and decode["aux_equal"], decode
    assert decode["weight_batches_valid"] and decode["weight_status"] == 0, decode
    assert decode["weights_equal"], decode
    assert prefill["routes"] == [route] and decode["weight_routes"] == [route], reports


@pytest.mark.parametrize("protocol,managed,route", MODES)
def test_vllm_mooncake_connector(protocol, managed, route):
    """MooncakeConnector: decode registers its per-layer K and V caches and sends its host, rpc
    port, base addresses and block ids; prefill coalesces contiguous blocks and pushes every
    request with batch_transfer_sync_write from four sender threads; ret != 0 answers ERROR."""
    reports = run_pair(pd_workers.vllm_prefill, pd_workers.vllm_decode, protocol, managed)
    prefill, decode = reports["prefill"], reports["decode"]
    expected = {req: "FINISH" for req in pd_workers.VLLM_REQUESTS}
    expected[pd_workers.VLLM_ERROR] = "ERROR"
    assert decode["answers"] == expected, decode
    regions = 2 * pd_workers.VLLM_LAYERS
    runs = {"req-0": 1, "req-1": 2, "req-2": 1, "req-3": 3, "req-4": 1, "req-5": 2}
    assert prefill["descriptors"] == {req: n * regions for req, n in runs.items()}, prefill
    assert decode["mismatched"] == [], decode
    assert prefill["routes"] == [route], prefill

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Prefill/decode disaggregation through Mooncake's TransferEngine API: a "prefill" process
registers KV memory, a "decode" process writes and reads it by the prefill's virtual addresses."""

import multiprocessing

import pytest

import workers
from conftest import SHIM_DIR


@pytest.mark.parametrize("protocol,managed_route", [("auto", "shm"), ("tcp", "tcp")])
def test_pd_pattern(protocol, managed_route):
    ctx = multiprocessing.get_context("spawn")
    to_decode, to_prefill, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=workers.prefill_worker,
                    args=(protocol, str(SHIM_DIR), to_decode, to_prefill, results)),
        ctx.Process(target=workers.decode_worker,
                    args=(protocol, str(SHIM_DIR), to_decode, to_prefill, results)),
    ]
    for p in procs:
        p.start()
    try:
        reports = {r["role"]: r for r in (results.get(timeout=600) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert not errors, "\n".join(errors)
    decode, prefill = reports["decode"], reports["prefill"]
    assert decode["readback_equal"] and decode["single_equal"], decode
    assert decode["outside"] == [-1, -1, -1], decode
    # Application memory (register_memory) is reached over tcp; managed memory is a memfd that a
    # same-host peer maps when shm is enabled.
    assert decode["routes"] == {"pool": "tcp", "managed": managed_route}, decode
    assert prefill["checked"] == 64 + 16 and prefill["mismatched"] == 0, prefill
    assert all(p.exitcode == 0 for p in procs)

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Prefill/decode disaggregation through Mooncake's TransferEngine API: a "prefill" process
registers KV memory, a "decode" process writes and reads it by the prefill's virtual addresses."""

import pytest

import workers
from conftest import SHIM_DIR, run_prefill_decode


@pytest.mark.parametrize("protocol,managed_route", [("auto", "shm"), ("tcp", "tcp")])
def test_pd_pattern(protocol, managed_route):
    reports = run_prefill_decode(workers.prefill_worker, workers.decode_worker, protocol,
                                 str(SHIM_DIR))
    decode, prefill = reports["decode"], reports["prefill"]
    assert decode["readback_equal"] and decode["single_equal"], decode
    assert decode["outside"] == [-1, -1, -1], decode
    # Application memory (register_memory) is reached over tcp; managed memory is a memfd that a
    # same-host peer maps when shm is enabled.
    assert decode["routes"] == {"pool": "tcp", "managed": managed_route}, decode
    assert prefill["checked"] == 64 + 16 and prefill["mismatched"] == 0, prefill

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""SGLang HiCache's use of the store, through the Mooncake API, with one process per TP rank.

Each process registers a host pool, backs pages up 128 at a time (batch_is_exist, then
batch_put_from of the missing pages only), and prefetches another rank's pages with
batch_get_into, comparing every byte. Runs over shm between processes (protocol "auto") and over
tcp.
"""

import multiprocessing

import pytest

import workers
from conftest import SHIM_DIR

NPROCS = 3
PAGE = 16 * 1024


@pytest.mark.parametrize("protocol,route", [("auto", "shm"), ("tcp", "tcp")])
def test_hicache_pattern(master, protocol, route):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        hostnames = manager.dict()
        barrier = ctx.Barrier(NPROCS)
        results = ctx.Queue()
        procs = [ctx.Process(target=workers.hicache_worker,
                             args=(rank, NPROCS, master.address, protocol, PAGE, str(SHIM_DIR),
                                   barrier, hostnames, results))
                 for rank in range(NPROCS)]
        for p in procs:
            p.start()
        try:
            reports = sorted((results.get(timeout=600) for _ in procs), key=lambda r: r["rank"])
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, "\n".join(errors)
    for r in reports:
        assert r["mha1_existing"] == 0 and r["mha1_put"] == 256, r
        assert r["mha2_existing"] == 128 and r["mha2_put"] == 128, r  # 64 pages x (k, v)
        assert r["mla_existing"] == (0 if r["rank"] == 0 else 64), r
        assert r["mla_put"] == (128 if r["rank"] == 0 else 64), r
        assert not (r["mha1_put_errors"] or r["mha2_put_errors"] or r["mla_put_errors"]), r
        assert r["read"] == 192 * 2 + 128, r
        assert r["mismatched"] == 0, r
        assert r["missing_code"] == -704, r
        assert r["route"] == route, r
    assert all(p.exitcode == 0 for p in procs)

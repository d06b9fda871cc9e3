# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""batch_get_into throughput from Python, set up like the C++ `larder-bench store --op get`.

``--clients`` processes each contribute a segment, store a working set of ``--value-size``
values in the *next* client's segment (so every read crosses a process boundary), then read
random batches of ``--batch`` keys of their own working set into a registered host pool for
``--duration`` seconds. Rates count only the time inside batch_get_into, summed over clients, as
the C++ benchmark does; every batch is checked outside the timed call (all bytes of the first
batches, then a sample of each value). Each client measures, in turn (``--apis``):

* ``store``: larder.Store.batch_get_into;
* ``compat``: MooncakeDistributedStore.batch_get_into;
* ``multi``: batch_get_into_multi_buffers, each value scattered over ``--slices`` ranges (one
  per layer of a layer-first pool);
* ``buffer``: batch_get_buffer, each value in a buffer of its own (no registered pool).

They take turns in rounds of ``--round`` seconds, so that all of them see the same machine.

    PYTHONPATH=build/python python3 python/bench/bench_get_into.py
    build/bin/larder-bench store --op get --value-size 64K --batch 128      # the C++ figure
"""

import argparse
import multiprocessing
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

import numpy as np

import larder
from larder.compat.mooncake import MooncakeDistributedStore, ReplicateConfig


def start_master():
    bin_dir = os.environ.get("LARDER_BIN_DIR") or str(
        pathlib.Path(larder.__file__).resolve().parents[2] / "bin")
    proc = subprocess.Popen(
        [os.path.join(bin_dir, "larder-master"), "--host", "127.0.0.1", "--port", "0",
         "--http-port", "-1", "--parent-watch"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for line in proc.stdout:
        if line.startswith(b"READY "):
            return proc, line.split()[1].decode()
    raise SystemExit("larder-master did not start")


def fill_byte(key_index: int) -> int:
    return key_index % 251 + 1


def client(rank, args, master, names, barrier, results):
    n, batch, size = args.clients, args.batch, args.value_size
    store = larder.Store(master, global_segment_size=args.segment_size, protocol=args.protocol)
    names[rank] = store.segment_name
    barrier.wait()
    pool = np.zeros(batch * size, np.uint8)
    pages = pool.reshape(batch, size)
    store.register_buffer(pool)
    base = pool.ctypes.data
    ptrs = [base + j * size for j in range(batch)]
    sizes = [size] * batch
    prefix = f"ws/{rank}/"
    count = args.keys
    for start in range(0, count, batch):
        indices = range(start, min(start + batch, count))
        for j, k in enumerate(indices):
            pages[j] = fill_byte(k)
        larder.check(store.batch_put_from([f"{prefix}{k}" for k in indices],
                                          ptrs[:len(indices)], sizes[:len(indices)],
                                          preferred_segments=[names[(rank + 1) % n]]))
    barrier.wait()

    rng = random.Random(rank)
    mc = MooncakeDistributedStore()
    assert mc.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, args.protocol, "", master) == 0
    # multi: value j goes to slices j, batch + j, 2 * batch + j, ... of the pool, as a layer-first
    # pool keeps page j of each layer in that layer's region.
    piece = size // args.slices
    slice_ptrs = [[base + (layer * batch * piece) + j * piece for layer in range(args.slices)]
                  for j in range(batch)]
    slice_sizes = [[piece] * args.slices for _ in range(batch)]
    held = []

    def as_pages(got):
        """The batch's values as rows of `pages` (multi and buffer lay them out otherwise)."""
        if isinstance(got[0], int):
            return got
        held[:] = got
        return [len(b) if b is not None else -1 for b in got]

    calls = {
        "store": lambda keys: store.batch_get_into(keys, ptrs, sizes),
        "compat": lambda keys: mc.batch_get_into(keys, ptrs, sizes),
        "multi": lambda keys: mc.batch_get_into_multi_buffers(keys, slice_ptrs, slice_sizes),
        "buffer": lambda keys: mc.batch_get_buffer(keys),
    }
    assert mc.register_buffer(base, pool.nbytes) == 0  # the same pool, for the compat calls
    reports = {api: {"times": [], "wrong": 0, "errors": 0} for api in args.apis}
    # The APIs take turns in rounds of --round seconds (each client in step, at a barrier), so
    # that all of them see the same machine; the first batches of each are warm-up.
    warmup = {api: 10 for api in args.apis}
    rounds = max(1, int(args.duration / args.round))
    for _ in range(rounds):
        for api in args.apis:
            call, report = calls[api], reports[api]
            barrier.wait()
            end = time.perf_counter() + args.round
            while time.perf_counter() < end:
                picked = [rng.randrange(count) for _ in range(batch)]
                keys = [f"{prefix}{k}" for k in picked]
                start = time.perf_counter()
                got = call(keys)
                took = time.perf_counter() - start
                if any(g != size for g in as_pages(got)):
                    report["errors"] += 1
                    continue
                expected = np.array([fill_byte(k) for k in picked], np.uint8)
                # Every byte during warm-up, then every 512th byte: checking 8 MiB with numpy
                # costs more CPU than the read, and the clients share the machine's cores. The
                # checks read the values where they landed, without gathering them (no copy).
                step = 1 if warmup[api] else 512
                if api == "multi":  # slice l of value j: layers[l, j]
                    layers = pool[:args.slices * batch * piece].reshape(args.slices, batch, piece)
                    bad = (layers[:, :, ::step] != expected[None, :, None]).any(axis=(0, 2))
                elif api == "buffer":
                    bad = [bool((np.frombuffer(b, np.uint8)[::step] != e).any())
                           for b, e in zip(held, expected)]
                else:
                    bad = (pages[:, ::step] != expected[:, None]).any(axis=1)
                report["wrong"] += int(np.count_nonzero(bad))
                if warmup[api]:
                    warmup[api] -= 1
                    continue
                report["times"].append(took)
    barrier.wait()  # every segment stays mounted until all clients are done
    mc.close()
    store.close()
    results.put((rank, reports))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", help="ip:port of a running larder-master (default: start one)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (at least 2)")
    parser.add_argument("--segment-size", default="1GiB", help="bytes each client contributes")
    parser.add_argument("--value-size", default="64KiB", help="bytes per value")
    parser.add_argument("--batch", type=int, default=128, help="keys per batch_get_into")
    parser.add_argument("--working-set", default=None,
                        help="bytes of values per client (default: min(segment/2, 256MiB))")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per API")
    parser.add_argument("--round", type=float, default=0.5,
                        help="seconds of one API before the next takes its turn")
    parser.add_argument("--protocol", default="auto", help="store protocol (auto, tcp, ...)")
    parser.add_argument("--apis", default="store,compat,multi,buffer",
                        help="what to measure, in order: store, compat, multi, buffer")
    parser.add_argument("--slices", type=int, default=4,
                        help="ranges per value for multi (the value size must divide by it)")
    args = parser.parse_args()
    args.apis = [a.strip() for a in args.apis.split(",") if a.strip()]
    if any(a not in ("store", "compat", "multi", "buffer") for a in args.apis):
        parser.error("--apis takes store, compat, multi, buffer")
    if args.clients < 2:
        parser.error("--clients must be at least 2 (values go to another client's segment)")
    args.segment_size = larder.parse_size(args.segment_size)
    args.value_size = larder.parse_size(args.value_size)
    if args.value_size % args.slices:
        parser.error("--value-size must be a multiple of --slices")
    working_set = (larder.parse_size(args.working_set) if args.working_set
                   else min(args.segment_size // 2, 256 << 20))
    args.keys = max(args.batch, min(working_set // args.value_size, 65536))

    master_proc = None
    master = args.master
    if master is None:
        master_proc, master = start_master()
    ctx = multiprocessing.get_context("spawn")
    try:
        with ctx.Manager() as manager:
            names = manager.dict()
            barrier = ctx.Barrier(args.clients)
            results = ctx.Queue()
            procs = [ctx.Process(target=client, args=(r, args, master, names, barrier, results))
                     for r in range(args.clients)]
            for p in procs:
                p.start()
            reports = [results.get(timeout=args.duration * 4 + 600) for _ in procs]
            for p in procs:
                p.join(60)
    finally:
        if master_proc is not None:
            master_proc.stdin.close()
            master_proc.wait(15)

    batch_bytes = args.batch * args.value_size
    print(f"batch_get_into, {args.batch} x {args.value_size} B per batch, {args.clients} clients, "
          f"protocol {args.protocol}, {args.keys} keys per client")
    for api in args.apis:
        gbps = 0.0
        all_times, wrong, errors = [], 0, 0
        for _, r in reports:
            times = r[api]["times"]
            gbps += batch_bytes * len(times) / sum(times) / 1e9
            all_times += times
            wrong += r[api]["wrong"]
            errors += r[api]["errors"]
        all_times.sort()
        p50 = statistics.median(all_times) * 1e6
        p99 = all_times[int(len(all_times) * 0.99)] * 1e6
        print(f"  {api:<8} {gbps:7.2f} GB/s  ({gbps / args.clients:.2f} per client)  "
              f"p50 {p50:7.0f} us  p99 {p99:7.0f} us  batches {len(all_times)}  "
              f"errors {errors}  wrong {wrong}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

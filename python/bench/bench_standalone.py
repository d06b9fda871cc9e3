# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Standalone mode's cost: batch gets through a larder-client daemon vs. a process that owns its
segment, measured in one run.

Starts a larder-master and a larder-client daemon. An *owner* store (larder.Store, its own
segment) and an *attached* store (larder.Store.attach, the daemon's segment) each store
``--keys`` values of ``--value-size`` bytes in their segment, then read random batches of
``--batch`` keys into registered memory (shared with the daemon for the attached store), in
alternating rounds of ``--round`` seconds, so both see the same machine. Prints GB/s and the
median batch time of each, and attached/owner. Every batch is checked (a sample of each value).

    PYTHONPATH=build/python python3 python/bench/bench_standalone.py
"""

import argparse
import ctypes
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time
import uuid

import numpy as np

import larder


def start(binary: str, *args: str):
    bin_dir = os.environ.get("LARDER_BIN_DIR") or str(
        pathlib.Path(larder.__file__).resolve().parents[2] / "bin")
    proc = subprocess.Popen([os.path.join(bin_dir, binary), *args, "--parent-watch"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    for line in proc.stdout:
        if line.startswith(b"READY "):
            return proc, line.decode().split()
    raise SystemExit(f"{binary} did not start")


def fill(key_index: int) -> int:
    return key_index % 251 + 1


class Reader:
    def __init__(self, name, store, base, args):
        self.name, self.store, self.args = name, store, args
        size, batch = args.value_size, args.batch
        self.pages = np.ctypeslib.as_array((ctypes.c_uint8 * (batch * size)).from_address(base))
        self.pages = self.pages.reshape(batch, size)
        self.ptrs = [base + j * size for j in range(batch)]
        self.sizes = [size] * batch
        self.prefix = f"{name}/{uuid.uuid4().hex[:8]}/"
        self.times, self.errors, self.wrong = [], 0, 0
        self.rng = random.Random(name)

    def store_values(self):
        n, batch = self.args.keys, self.args.batch
        for start in range(0, n, batch):
            indices = range(start, min(start + batch, n))
            for j, k in enumerate(indices):
                self.pages[j] = fill(k)
            larder.check(self.store.batch_put_from([f"{self.prefix}{k}" for k in indices],
                                                   self.ptrs[:len(indices)],
                                                   self.sizes[:len(indices)]))

    def run(self, seconds: float, record: bool):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            picked = [self.rng.randrange(self.args.keys) for _ in range(self.args.batch)]
            keys = [f"{self.prefix}{k}" for k in picked]
            started = time.perf_counter()
            got = self.store.batch_get_into(keys, self.ptrs, self.sizes)
            took = time.perf_counter() - started
            if any(g != self.args.value_size for g in got):
                self.errors += 1
                continue
            expected = np.array([fill(k) for k in picked], np.uint8)[:, None]
            self.wrong += int(np.count_nonzero((self.pages[:, ::512] != expected).any(axis=1)))
            if record:
                self.times.append(took)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--value-size", default="64KiB")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--keys", type=int, default=2048, help="values per store")
    parser.add_argument("--segment-size", default="512MiB")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per store")
    parser.add_argument("--round", type=float, default=0.5, help="seconds per alternation")
    args = parser.parse_args()
    args.value_size = larder.parse_size(args.value_size)
    if args.keys * args.value_size > larder.parse_size(args.segment_size):
        parser.error("--keys x --value-size does not fit --segment-size")

    master, ready = start("larder-master", "--host", "127.0.0.1", "--port", "0",
                          "--http-port", "-1")
    address = ready[1]
    socket = f"@larder-bench-{uuid.uuid4().hex[:8]}"
    daemon, _ = start("larder-client", "--master", address, "--socket", socket,
                      "--segment-size", args.segment_size)
    pool_bytes = args.batch * args.value_size
    try:
        owner = larder.Store(address, global_segment_size=args.segment_size)
        owner_pool = np.zeros(pool_bytes, np.uint8)
        owner.register_buffer(owner_pool)
        attached = larder.Store.attach(socket)
        shared = attached.allocate_shared(pool_bytes)
        readers = [Reader("owner", owner, owner_pool.ctypes.data, args),
                   Reader("attached", attached, shared, args)]
        for r in readers:
            r.store_values()
            r.run(0.3, record=False)  # warm-up: map, fault in, open connections
        rounds = max(1, int(args.duration / args.round))
        for _ in range(rounds):
            for r in readers:
                r.run(args.round, record=True)
        print(f"batch_get_into, {args.batch} x {args.value_size} B per batch, "
              f"{args.keys} keys per store, {rounds} alternating rounds of {args.round}s")
        medians = {}
        for r in readers:
            gbps = pool_bytes * len(r.times) / sum(r.times) / 1e9
            medians[r.name] = statistics.median(r.times)
            print(f"  {r.name:<9} {gbps:6.2f} GB/s  p50 {medians[r.name] * 1e6:7.0f} us  "
                  f"batches {len(r.times)}  errors {r.errors}  wrong {r.wrong}")
        print(f"  attached / owner (median batch rate): "
              f"{medians['owner'] / medians['attached']:.2f}x")
        attached.close()
        owner.close()
    finally:
        for proc in (daemon, master):
            proc.stdin.close()
            proc.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())

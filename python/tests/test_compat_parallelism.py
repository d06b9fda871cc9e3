# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The ``*_with_parallelism`` tensor methods of the Mooncake layer and their spec classes
(ParallelAxis, TensorParallelism, ReadTarget), called as Mooncake's users call them: no
parallelism stores the tensor whole, one TP axis stores its shards as the ``*_with_tp`` methods
do, and reads gather or pick shards."""

import ctypes

import pytest

from conftest import setup_mooncake_store

torch = pytest.importorskip("torch")

INVALID = -600


@pytest.fixture
def mc(mooncake_store, master):
    s = setup_mooncake_store(mooncake_store, master.address)
    yield s
    s.close()


def tp(mooncake_store, rank, size, split_dim=None):
    axis = mooncake_store.ParallelAxis()
    axis.kind, axis.rank, axis.size, axis.split_dim = "tp", rank, size, split_dim
    parallelism = mooncake_store.TensorParallelism()
    parallelism.axes = [axis]
    return parallelism


def target(mooncake_store, mode, parallelism=None):
    t = mooncake_store.ReadTarget()
    t.mode, t.parallelism = mode, parallelism
    return t


class Registered:
    """A ctypes buffer registered with ``store`` for the zero-copy calls."""

    def __init__(self, store, size, data=b""):
        self.raw = ctypes.create_string_buffer(size)
        ctypes.memmove(self.raw, data, len(data))
        self.ptr, self.size, self.store = ctypes.addressof(self.raw), size, store
        assert store.register_buffer(self.ptr, size) == 0

    def close(self):
        assert self.store.unregister_buffer(self.ptr) == 0


def test_no_parallelism_stores_the_tensor_whole(mc, prefix):
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert mc.put_tensor_with_parallelism(prefix + "a", tensor) == 0
    assert torch.equal(mc.get_tensor(prefix + "a"), tensor)
    assert torch.equal(mc.get_tensor_with_parallelism(prefix + "a"), tensor)
    assert mc.batch_put_tensor_with_parallelism([prefix + "b0", prefix + "b1"],
                                                [tensor + 1, tensor + 2]) == [0, 0]
    got = mc.batch_get_tensor([prefix + "b0", prefix + "b1"])
    assert torch.equal(got[0], tensor + 1) and torch.equal(got[1], tensor + 2)
    assert mc.upsert_tensor_with_parallelism(prefix + "a", tensor * 2) == 0
    assert torch.equal(mc.get_tensor(prefix + "a"), tensor * 2)
    assert mc.batch_upsert_tensor_with_parallelism([prefix + "b0"], [tensor]) == [0]
    assert torch.equal(mc.get_tensor(prefix + "b0"), tensor)


def test_from_a_serialized_tensor(mooncake_store, mc, prefix):
    tensor = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    assert mc.put_tensor(prefix + "src", tensor) == 0
    size = mc.get_size(prefix + "src")
    buf = Registered(mc, size)
    assert mc.get_into(prefix + "src", buf.ptr, size) == size
    assert mc.put_tensor_with_parallelism_from(prefix + "f", buf.ptr, size) == 0
    assert torch.equal(mc.get_tensor(prefix + "f"), tensor)
    assert mc.batch_put_tensor_with_parallelism_from([prefix + "g"], [buf.ptr], [size]) == [0]
    assert mc.upsert_tensor_with_parallelism_from(prefix + "f", buf.ptr, size) == 0
    assert mc.batch_upsert_tensor_with_parallelism_from([prefix + "u"], [buf.ptr],
                                                        [size]) == [0]
    assert torch.equal(mc.get_tensor(prefix + "u"), tensor)
    # The buffer split into TP shards along dim 1.
    assert mc.put_tensor_with_parallelism_from(prefix + "s", buf.ptr, size,
                                               tp(mooncake_store, 0, 2, 1)) == 0
    assert torch.equal(mc.get_tensor(prefix + "s_tp_1"), tensor[:, 2:])
    assert mc.put_tensor_with_parallelism_from(prefix + "bad", buf.ptr, 10) == INVALID
    buf.close()


def test_tp_axis_stores_shards_and_reads_them(mooncake_store, mc, prefix):
    tensor = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    spec = tp(mooncake_store, 0, 3, 1)
    assert mc.put_tensor_with_parallelism(prefix + "w", tensor, spec) == 0
    chunks = torch.chunk(tensor, 3, dim=1)
    for rank, chunk in enumerate(chunks):
        assert torch.equal(mc.get_tensor(f"{prefix}w_tp_{rank}"), chunk)
        shard = mc.get_tensor_with_parallelism(
            prefix + "w", target(mooncake_store, "shard", tp(mooncake_store, rank, 3, 1)))
        assert torch.equal(shard, chunk)
    full = mc.get_tensor_with_parallelism(prefix + "w", target(mooncake_store, "full", spec))
    assert torch.equal(full, tensor)
    # The same spec as dicts.
    dict_spec = {"axes": [{"kind": "tp", "rank": 2, "size": 3, "split_dim": 1}]}
    got = mc.batch_get_tensor_with_parallelism(
        [prefix + "w", prefix + "w", prefix + "missing"],
        [{"mode": "shard", "parallelism": dict_spec}, None,
         {"mode": "full", "parallelism": dict_spec}])
    assert torch.equal(got[0], chunks[2]) and got[1] is None and got[2] is None


def test_reads_into_registered_memory(mooncake_store, mc, prefix):
    tensor = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    spec = tp(mooncake_store, 0, 2, 0)
    assert mc.put_tensor_with_parallelism(prefix + "r", tensor, spec) == 0
    buf = Registered(mc, 4096)
    full = mc.get_tensor_with_parallelism_into(prefix + "r", buf.ptr, buf.size,
                                               target(mooncake_store, "full", spec))
    assert torch.equal(full, tensor)
    shard = mc.batch_get_tensor_with_parallelism_into(
        [prefix + "r"], [buf.ptr], [buf.size],
        [target(mooncake_store, "shard", tp(mooncake_store, 1, 2, 0))])[0]
    assert torch.equal(shard, tensor[1:])
    assert mc.batch_get_tensor_with_parallelism_into([prefix + "r"], [buf.ptr], []) == [INVALID]
    buf.close()


def test_unsupported_specs_are_refused(mooncake_store, mc, prefix):
    tensor = torch.ones(4, 4)
    dp = mooncake_store.ParallelAxis()
    dp.kind, dp.rank, dp.size = "dp", 0, 2
    mixed = mooncake_store.TensorParallelism()
    mixed.axes = [dp, tp(mooncake_store, 0, 2, 1).axes[0]]
    assert mc.put_tensor_with_parallelism(prefix + "x", tensor, mixed) == INVALID
    assert mc.put_tensor_with_parallelism(prefix + "x", tensor,
                                          {"axes": [{"kind": "zz"}]}) == INVALID
    assert mc.put_tensor_with_parallelism(prefix + "x", tensor, None, None, (0, 2, 0)) == INVALID
    assert mc.batch_put_tensor_with_parallelism([prefix + "x", prefix + "y"],
                                                [tensor, tensor], [None]) == [INVALID, INVALID]
    assert mc.get_tensor(prefix + "x") is None and mc.get_tensor(prefix + "y") is None
    assert mc.get_tensor_with_parallelism(prefix + "x", target(mooncake_store, "sideways")) \
        is None


def test_before_setup(mooncake_store):
    s = mooncake_store.MooncakeDistributedStore()
    assert s.put_tensor_with_parallelism("k", torch.ones(2)) == INVALID
    assert s.batch_put_tensor_with_parallelism(["k"], [torch.ones(2)]) == [INVALID]
    assert s.get_tensor_with_parallelism("k") is None
    assert s.get_tensor_with_parallelism_into("k", 1, 1) is None

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.compat.mooncake._tensor: Mooncake's tensor object format and the *_tensor methods,
driven through an in-memory store (no master needed)."""

import ctypes
import importlib
import pathlib
import struct
import sys
import types

import pytest

torch = pytest.importorskip("torch")


def _load_from_source():
    """_tensor.py from the source tree, for builds whose package does not list it yet."""
    source = pathlib.Path(__file__).resolve().parents[1] / "larder" / "compat" / "mooncake"
    name = "_larder_mooncake_source"
    package = types.ModuleType(name)
    package.__path__ = [str(source)]
    sys.modules[name] = package
    return importlib.import_module(f"{name}._tensor")


try:
    from larder.compat.mooncake import _tensor
except ImportError:
    _tensor = _load_from_source()

INVALID = -600
NOT_FOUND = -704
ALREADY_EXISTS = -705
META = 304

# The documented layout, spelled out field by field so that a drift in _tensor's offsets fails.
FIELDS = {
    "magic": (0, "<I"), "version": (4, "<H"), "header_size": (6, "<H"), "dtype": (8, "<i"),
    "ndim": (12, "<i"), "layout_kind": (16, "<I"), "reserved_flags": (20, "<I"),
    "data_offset": (24, "<Q"), "data_bytes": (32, "<Q"), "global_shape": (40, "<8q"),
    "local_shape": (104, "<8q"), "axis_count": (168, "<I"), "layout_reserved": (172, "<I"),
}
AXIS_OFFSET, AXIS_SIZE, AXIS_FORMAT = 176, 32, "<6iq"


def field(blob, name):
    offset, fmt = FIELDS[name]
    values = struct.unpack_from(fmt, blob, offset)
    return values if len(values) > 1 else values[0]


def axis(blob, i):
    return struct.unpack_from(AXIS_FORMAT, blob, AXIS_OFFSET + i * AXIS_SIZE)


def with_field(blob, name, value):
    offset, fmt = FIELDS[name]
    out = bytearray(blob)
    struct.pack_into(fmt, out, offset, *(value if isinstance(value, tuple) else (value,)))
    return bytes(out)


def encode(tensor, **kwargs):
    header, data = _tensor.serialize_tensor(tensor, **kwargs)
    return header + bytes(data)


SUPPORTED = [
    (torch.float32, 0), (torch.float64, 1), (torch.int8, 2), (torch.uint8, 3), (torch.int16, 4),
    (torch.int32, 6), (torch.int64, 8), (torch.bool, 10), (torch.float16, 11),
    (torch.bfloat16, 12),
] + [(getattr(torch, name), code) for name, code in
     [("uint16", 5), ("uint32", 7), ("uint64", 9), ("float8_e4m3fn", 13), ("float8_e5m2", 14)]
     if hasattr(torch, name)]


def sample(dtype, shape=(3, 5)):
    values = torch.arange(-7, -7 + torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    if dtype == torch.bool:
        return values.remainder(3) == 0
    if not dtype.is_floating_point and (dtype == torch.uint8 or "uint" in str(dtype)):
        values = values.abs()
    return values.to(dtype)


# ---- format ----

def test_metadata_size():
    assert _tensor.tensor_metadata_size() == META
    header, data = _tensor.serialize_tensor(torch.ones(2))
    assert len(header) == META and len(data) == 8


@pytest.mark.parametrize("dtype,code", SUPPORTED, ids=[str(d) for d, _ in SUPPORTED])
def test_round_trip_every_dtype(dtype, code):
    tensor = sample(dtype)
    blob = encode(tensor)
    assert field(blob, "dtype") == code
    out = _tensor.deserialize_tensor(blob)
    assert out.dtype == dtype and out.shape == tensor.shape
    assert torch.equal(out.view(torch.uint8), tensor.view(torch.uint8))


@pytest.mark.parametrize("shape", [(), (1,), (7,), (2, 3), (1, 2, 1, 2, 1, 2, 1, 3)])
def test_round_trip_shapes(shape):
    tensor = torch.randn(shape)
    out = _tensor.deserialize_tensor(encode(tensor))
    assert out.shape == tensor.shape and torch.equal(out, tensor)


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), (0, 4)])
def test_zero_element_tensor_round_trips(shape):
    # A zero-size dimension is stored as the metadata alone, as Mooncake stores it.
    tensor = torch.ones(shape)
    blob = encode(tensor)
    assert len(blob) == META and field(blob, "data_bytes") == 0
    assert field(blob, "global_shape")[:len(shape)] == shape
    out = _tensor.deserialize_tensor(blob)
    assert out.shape == tensor.shape and out.dtype == tensor.dtype
    store = FakeStore()
    assert store.put_tensor("k", tensor) == 0
    assert store.get_tensor("k").shape == tensor.shape


def test_non_contiguous_input():
    base = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    for tensor in (base.t(), base[:, ::2], base[::2, 1:]):
        assert not tensor.is_contiguous()
        header, data = _tensor.serialize_tensor(tensor)
        assert bytes(data) == tensor.contiguous().numpy().tobytes()
        out = _tensor.deserialize_tensor(header + bytes(data))
        assert out.shape == tensor.shape and torch.equal(out, tensor)


def test_full_header_layout():
    tensor = torch.zeros(2, 3, 4, dtype=torch.float16)
    blob = encode(tensor)
    assert blob[:4] == b"NOOM"
    assert field(blob, "magic") == 0x4D4F4F4E
    assert field(blob, "version") == 1
    assert field(blob, "header_size") == META
    assert field(blob, "dtype") == 11
    assert field(blob, "ndim") == 3
    assert field(blob, "layout_kind") == 0
    assert field(blob, "reserved_flags") == 0
    assert field(blob, "data_offset") == META
    assert field(blob, "data_bytes") == 2 * 3 * 4 * 2 == len(blob) - META
    assert field(blob, "global_shape") == (2, 3, 4, -1, -1, -1, -1, -1)
    assert field(blob, "local_shape") == (2, 3, 4, -1, -1, -1, -1, -1)
    assert field(blob, "axis_count") == 0
    assert field(blob, "layout_reserved") == 0
    assert blob[AXIS_OFFSET:META] == bytes(META - AXIS_OFFSET)


def test_shard_header_layout():
    full = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)
    shard = full[:, 3:]
    blob = encode(shard, shard=_tensor.TpShard(rank=1, size=2, split_dim=1, global_shape=(4, 6)))
    assert field(blob, "layout_kind") == 1
    assert field(blob, "global_shape")[:3] == (4, 6, -1)
    assert field(blob, "local_shape")[:3] == (4, 3, -1)
    assert field(blob, "axis_count") == 1
    # kind TP, axis_index, shard_rank, shard_count, split_dim, reserved0, local extent
    assert axis(blob, 0) == (1, 0, 1, 2, 1, 0, 3)
    assert blob[AXIS_OFFSET + AXIS_SIZE:META] == bytes(META - AXIS_OFFSET - AXIS_SIZE)
    meta = _tensor.parse_tensor_metadata(blob)
    assert meta.global_shape == (4, 6) and meta.local_shape == (4, 3)
    assert meta.axes == (_tensor.LayoutAxis(1, 0, 1, 2, 1, 0, 3),)
    assert torch.equal(_tensor.deserialize_tensor(blob), shard)


GOOD = encode(torch.arange(6, dtype=torch.int64).reshape(2, 3))
SHARD = encode(torch.ones(2, 3), shard=_tensor.TpShard(0, 2, 1, (2, 6)))


def with_axis(blob, **values):
    names = ["kind", "axis_index", "shard_rank", "shard_count", "split_dim", "reserved0",
             "reserved1"]
    fields = dict(zip(names, axis(blob, 0)), **values)
    out = bytearray(blob)
    struct.pack_into(AXIS_FORMAT, out, AXIS_OFFSET, *(fields[n] for n in names))
    return bytes(out)


BAD_OBJECTS = {
    "magic": (with_field(GOOD, "magic", 0x4D4F4F4F), "magic"),
    "version": (with_field(GOOD, "version", 2), "version"),
    "header_size": (with_field(GOOD, "header_size", 264), "header_size"),
    "dtype_negative": (with_field(GOOD, "dtype", -1), "dtype"),
    "dtype_too_big": (with_field(GOOD, "dtype", 15), "dtype"),
    "ndim_negative": (with_field(GOOD, "ndim", -1), "ndim"),
    "ndim_too_big": (with_field(GOOD, "ndim", 9), "ndim"),
    "layout_kind": (with_field(GOOD, "layout_kind", 2), "layout_kind"),
    "axis_count": (with_field(GOOD, "axis_count", 5), "axis_count"),
    "data_offset_small": (with_field(GOOD, "data_offset", 296), "data_offset"),
    "data_offset_past_end": (with_field(GOOD, "data_offset", len(GOOD) + 1), "data_offset"),
    "data_bytes": (with_field(GOOD, "data_bytes", 40), "data_bytes"),
    "truncated_data": (GOOD[:-8], "data_bytes"),
    "trailing_byte": (GOOD + b"\0", "data_bytes"),
    "shorter_than_metadata": (GOOD[:META - 1], "shorter"),
    "empty": (b"", "shorter"),
    "unused_global_dim": (with_field(GOOD, "global_shape", (2, 3, 0, -1, -1, -1, -1, -1)),
                          "unused dim 2"),
    "unused_local_dim": (with_field(GOOD, "local_shape", (2, 3, -1, -1, -1, -1, -1, 7)),
                         "unused dim 7"),
    "global_dim_negative": (with_field(GOOD, "global_shape", (2, -3, -1, -1, -1, -1, -1, -1)),
                            "dim 1"),
    "local_dim_negative": (with_field(GOOD, "local_shape", (2, -3, -1, -1, -1, -1, -1, -1)),
                           "dim 1"),
    "shape_vs_bytes": (with_field(GOOD, "local_shape", (3, 3, -1, -1, -1, -1, -1, -1)),
                       "does not match shape"),
    "ndim_vs_sentinels": (with_field(GOOD, "ndim", 3), "dim 2"),
    "axis_kind": (with_axis(SHARD, kind=5), "kind"),
    "axis_count_zero": (with_axis(SHARD, shard_count=0), "shard"),
    "axis_rank_too_big": (with_axis(SHARD, shard_rank=2), "shard"),
    "axis_rank_negative": (with_axis(SHARD, shard_rank=-1), "shard"),
    "axis_split_dim_low": (with_axis(SHARD, split_dim=-2), "split_dim"),
    "axis_split_dim_high": (with_axis(SHARD, split_dim=2), "split_dim"),
}


@pytest.mark.parametrize("name", list(BAD_OBJECTS))
def test_deserialize_rejects(name):
    blob, message = BAD_OBJECTS[name]
    with pytest.raises(ValueError, match=message):
        _tensor.deserialize_tensor(blob)
    with pytest.raises(ValueError):
        _tensor.parse_tensor_metadata(blob)


def test_valid_variants_accepted():
    assert torch.equal(_tensor.deserialize_tensor(GOOD), torch.arange(6).reshape(2, 3))
    # split_dim -1 (none) and a DP axis are valid axes.
    assert _tensor.deserialize_tensor(with_axis(SHARD, kind=0, split_dim=-1)).shape == (2, 3)


@pytest.mark.skipif(hasattr(torch, "uint16"), reason="this torch has uint16")
def test_dtype_missing_from_torch():
    blob = with_field(encode(torch.zeros(2, dtype=torch.int16)), "dtype", 5)
    assert _tensor.parse_tensor_metadata(blob).dtype == 5
    with pytest.raises(ValueError, match="UINT16"):
        _tensor.deserialize_tensor(blob)


def test_copy_and_alias():
    buffer = bytearray(encode(torch.zeros(4)))
    copied = _tensor.deserialize_tensor(buffer)
    aliased = _tensor.deserialize_tensor(buffer, copy=False)
    aliased.fill_(2.0)
    assert buffer[META:] == torch.full((4,), 2.0).numpy().tobytes()
    assert torch.equal(copied, torch.zeros(4))
    with pytest.raises(ValueError, match="writable"):
        _tensor.deserialize_tensor(bytes(buffer), copy=False)
    # Any contiguous buffer works: a ctypes array of c_char has format "<c".
    raw = ctypes.create_string_buffer(bytes(buffer), len(buffer))
    assert torch.equal(_tensor.deserialize_tensor(raw, copy=False), torch.full((4,), 2.0))


def test_serialize_rejects():
    with pytest.raises(TypeError):
        _tensor.serialize_tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="host memory only"):
        _tensor.serialize_tensor(torch.empty(2, device="meta"))
    with pytest.raises(ValueError, match="no Mooncake tensor code"):
        _tensor.serialize_tensor(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="at most 8"):
        _tensor.serialize_tensor(torch.zeros((1,) * 9))
    with pytest.raises(ValueError, match="dense"):
        _tensor.serialize_tensor(torch.eye(2).to_sparse())
    with pytest.raises(ValueError, match="split_dim"):
        _tensor.serialize_tensor(torch.ones(2), shard=_tensor.TpShard(0, 2, 1, (4,)))
    with pytest.raises(ValueError, match="rank"):
        _tensor.serialize_tensor(torch.ones(2), shard=_tensor.TpShard(2, 2, 0, (4,)))
    with pytest.raises(ValueError, match="differs"):
        _tensor.serialize_tensor(torch.ones(2, 3), shard=_tensor.TpShard(0, 2, 0, (4, 2)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensor_refused():
    with pytest.raises(ValueError, match="host memory only"):
        _tensor.serialize_tensor(torch.ones(2, device="cuda"))
    assert FakeStore().put_tensor("k", torch.ones(2, device="cuda")) == INVALID


@pytest.mark.parametrize("shape,tp_size,split_dim", [
    ((4, 6), 2, 1), ((4, 6), 3, 0), ((5, 2), 2, 0), ((7,), 4, 0), ((2, 3, 8), 4, 2)])
def test_tp_split_matches_chunk(shape, tp_size, split_dim):
    tensor = torch.randn(shape)
    shards = _tensor._tp_shards(tensor, tp_size, split_dim)
    chunks = tensor.chunk(tp_size, split_dim)
    assert len(shards) == tp_size
    for rank, shard in enumerate(shards):
        if rank < len(chunks):
            assert torch.equal(shard, chunks[rank])
        else:  # torch.chunk yields fewer pieces; Mooncake pads with empty shards.
            assert shard.shape[split_dim] == 0
    assert torch.equal(torch.cat(shards, split_dim), tensor)


def test_empty_tp_shard_round_trips():
    # 5 rows into 4 shards: 2, 2, 1 and an empty fourth shard.
    store = FakeStore()
    tensor = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    assert store.put_tensor_with_tp("k", tensor, tp_size=4, split_dim=0) == 0
    shards = [store.get_tensor_with_tp("k", tp_rank=r, tp_size=4) for r in range(4)]
    assert [s.shape[0] for s in shards] == [2, 2, 1, 0]
    assert len(store.objects["k_tp_3"]) == META
    assert torch.equal(torch.cat(shards), tensor)


# ---- the methods, through an in-memory store ----

class FakeStore(_tensor.TensorMethods):
    """The primitives TensorMethods needs, over a dict. put of an existing key fails with
    OBJECT_ALREADY_EXISTS; keys in ``fail`` fail with their code."""

    def __init__(self):
        self.objects = {}
        self.ready = True
        self.fail = {}
        self.configs = []

    def _not_ready(self):
        return not self.ready

    def _store(self, key, data, config, upsert):
        self.configs.append(config)
        if key in self.fail:
            return self.fail[key]
        if key in self.objects and not upsert:
            return ALREADY_EXISTS
        self.objects[key] = data
        return 0

    def _batch_put_parts(self, keys, parts, config=None, upsert=False):
        return [self._store(k, b"".join(bytes(memoryview(p).cast("B")) for p in ps), config,
                            upsert) for k, ps in zip(keys, parts)]

    def put_from(self, key, ptr, size, config=None):
        return self._store(key, ctypes.string_at(ptr, size), config, False)

    def upsert_from(self, key, ptr, size, config=None):
        return self._store(key, ctypes.string_at(ptr, size), config, True)

    def batch_put_from(self, keys, ptrs, sizes, config=None):
        return [self.put_from(*args, config) for args in zip(keys, ptrs, sizes)]

    def batch_upsert_from(self, keys, ptrs, sizes, config=None):
        return [self.upsert_from(*args, config) for args in zip(keys, ptrs, sizes)]

    def batch_get_buffer(self, keys):
        return [self.objects.get(k) for k in keys]

    def batch_get_into(self, keys, ptrs, sizes):
        if len(ptrs) != len(keys) or len(sizes) != len(keys):
            return [INVALID] * len(keys)
        out = []
        for key, ptr, size in zip(keys, ptrs, sizes):
            data = self.objects.get(key)
            if data is None:
                out.append(NOT_FOUND)
            elif len(data) > size:
                out.append(INVALID)
            else:
                ctypes.memmove(ptr, data, len(data))
                out.append(len(data))
        return out


class Buffer:
    """A ctypes buffer of ``size`` bytes, optionally filled with ``data``."""

    def __init__(self, size, data=b""):
        self.raw = ctypes.create_string_buffer(size)
        ctypes.memmove(self.raw, data, len(data))
        self.ptr = ctypes.addressof(self.raw)
        self.size = size

    @classmethod
    def holding(cls, tensor):
        blob = encode(tensor)
        return cls(len(blob), blob)

    def bytes(self):
        return self.raw.raw


@pytest.fixture
def store():
    return FakeStore()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool, torch.int64])
def test_put_get_tensor(store, dtype):
    tensor = sample(dtype, (4, 5))
    assert store.put_tensor("k", tensor) == 0
    assert store.objects["k"] == encode(tensor)
    got = store.get_tensor("k")
    assert got.dtype == dtype and got.shape == tensor.shape and torch.equal(got, tensor)
    got.zero_()  # the result owns its memory
    assert store.objects["k"] == encode(tensor)


def test_missing_and_invalid_reads(store):
    assert store.get_tensor("absent") is None
    store.objects["junk"] = b"x" * 400
    assert store.get_tensor("junk") is None
    assert store.put_tensor("k", torch.ones(3)) == 0
    assert store.batch_get_tensor(["k", "absent", "junk"])[1:] == [None, None]
    assert store.batch_get_tensor([]) == []


def test_put_and_upsert(store):
    assert store.put_tensor("k", torch.ones(3)) == 0
    assert store.put_tensor("k", torch.zeros(3)) == ALREADY_EXISTS
    assert store.upsert_tensor("k", torch.zeros(5, 5)) == 0
    assert torch.equal(store.get_tensor("k"), torch.zeros(5, 5))
    assert store.upsert_tensor("new", torch.ones(2)) == 0


def test_configs_pass_through(store):
    config = object()
    assert store.pub_tensor("a", torch.ones(1), config) == 0
    assert store.upsert_pub_tensor("a", torch.ones(1), config=config) == 0
    assert store.batch_pub_tensor(["b", "c"], [torch.ones(1)] * 2, config) == [0, 0]
    assert store.batch_upsert_pub_tensor(["b"], [torch.ones(1)], config=config) == [0]
    assert store.pub_tensor_with_tp("d", torch.ones(4), config=config, tp_size=2) == 0
    assert store.upsert_pub_tensor_with_tp("d", torch.ones(4), config, 0, 2, 0) == 0
    assert store.batch_pub_tensor_with_tp(["e"], [torch.ones(4)], config=config, tp_size=2) == [0]
    assert store.batch_upsert_pub_tensor_with_tp(["e"], [torch.ones(4)], config=config,
                                                 tp_size=2) == [0]
    assert store.configs and all(c is config for c in store.configs)
    store.configs.clear()
    store.put_tensor("f", torch.ones(1))
    assert store.configs == [None]


def test_batch_writes(store):
    tensors = [torch.randn(3, 3) for _ in range(3)]
    keys = ["a", "b", "c"]
    assert store.batch_put_tensor(keys, tensors) == [0, 0, 0]
    got = store.batch_get_tensor(keys + ["absent"])
    assert all(torch.equal(g, t) for g, t in zip(got, tensors)) and got[3] is None
    assert store.batch_put_tensor(keys, tensors) == [ALREADY_EXISTS] * 3
    updates = [t + 1 for t in tensors]
    assert store.batch_upsert_tensor(keys, updates) == [0, 0, 0]
    assert all(torch.equal(g, t) for g, t in zip(store.batch_get_tensor(keys), updates))


def test_invalid_arguments(store):
    assert store.put_tensor("k", [1, 2, 3]) == INVALID
    assert store.put_tensor("k", torch.zeros(2, dtype=torch.complex64)) == INVALID
    assert store.batch_put_tensor(["a", "b", "c"], [torch.ones(1), "x", torch.ones(2)]) == \
        [0, INVALID, 0]
    assert "b" not in store.objects
    assert store.batch_put_tensor(["x", "y"], [torch.ones(1)]) == [INVALID, INVALID]
    assert store.batch_upsert_tensor(["x"], []) == [INVALID]
    assert store.batch_put_tensor_with_tp(["x", "y"], [torch.ones(2)], tp_size=2) == \
        [INVALID, INVALID]
    assert store.batch_put_tensor([], []) == []
    assert store.put_tensor_with_tp("k", torch.ones(4), tp_size=2, split_dim=1) == INVALID
    assert store.put_tensor_with_tp("k", torch.ones(4), tp_size=2, split_dim=-1) == INVALID
    assert store.put_tensor_with_tp("k", "x", tp_size=2) == INVALID
    assert "x" not in store.objects and "y" not in store.objects


def test_put_tensor_with_tp(store):
    tensor = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert store.put_tensor_with_tp("k", tensor, tp_size=2, split_dim=1) == 0
    assert sorted(store.objects) == ["k_tp_0", "k_tp_1"]
    chunks = tensor.chunk(2, 1)
    for rank in range(2):
        meta = _tensor.parse_tensor_metadata(store.objects[f"k_tp_{rank}"])
        assert meta.layout_kind == 1 and meta.global_shape == (4, 6)
        assert meta.local_shape == (4, 3) and meta.axes[0].shard_rank == rank
        got = store.get_tensor_with_tp("k", tp_rank=rank, tp_size=2, split_dim=1)
        assert torch.equal(got, chunks[rank])
    # tp_size 1 stores and reads the tensor itself.
    assert store.put_tensor_with_tp("whole", tensor) == 0
    assert "whole" in store.objects and torch.equal(store.get_tensor_with_tp("whole"), tensor)
    # A shard read checks the stored layout: a full object or the wrong rank is no shard.
    assert store.put_tensor("full_tp_0", tensor) == 0
    assert store.get_tensor_with_tp("full", tp_rank=0, tp_size=2) is None
    store.objects["k_tp_5"] = store.objects["k_tp_0"]
    assert store.get_tensor_with_tp("k", tp_rank=5, tp_size=8) is None
    assert store.get_tensor_with_tp("absent", tp_rank=0, tp_size=2) is None


def test_upsert_tensor_with_tp(store):
    original = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    updated = original + 100
    assert store.put_tensor_with_tp("k", original, tp_size=2, split_dim=1) == 0
    assert store.put_tensor_with_tp("k", updated, tp_size=2, split_dim=1) == ALREADY_EXISTS
    assert store.upsert_tensor_with_tp("k", updated, tp_size=2, split_dim=1) == 0
    for rank, chunk in enumerate(updated.chunk(2, 1)):
        assert torch.equal(store.get_tensor_with_tp("k", tp_rank=rank, tp_size=2), chunk)


def test_batch_tensor_with_tp(store):
    keys = ["a", "b"]
    tensors = [torch.arange(16, dtype=torch.float32).reshape(4, 4) + i for i in range(2)]
    assert store.batch_put_tensor_with_tp(keys, tensors, tp_size=2, split_dim=0) == [0, 0]
    updates = [t + 1000 for t in tensors]
    assert store.batch_upsert_tensor_with_tp(keys, updates, tp_size=2, split_dim=0) == [0, 0]
    for rank in range(2):
        got = store.batch_get_tensor_with_tp(keys + ["absent"], tp_rank=rank, tp_size=2)
        assert got[2] is None
        for g, t in zip(got, updates):
            assert torch.equal(g, t.chunk(2, 0)[rank])
    assert store.batch_put_tensor_with_tp(["c"], [torch.ones(2)], tp_size=1) == [0]
    assert "c" in store.objects


def test_tp_first_failure_wins(store):
    store.fail = {"k_tp_1": -200, "k_tp_2": -800}
    assert store.put_tensor_with_tp("k", torch.ones(6), tp_size=3) == -200
    assert "k_tp_0" in store.objects
    assert store.batch_put_tensor_with_tp(["k", "ok"], [torch.ones(6)] * 2, tp_size=3) == \
        [ALREADY_EXISTS, 0]


def test_put_tensor_from(store):
    tensor = torch.randn(5, 2)
    buffer = Buffer.holding(tensor)
    assert store.put_tensor_from("k", buffer.ptr, buffer.size) == 0
    assert store.objects["k"] == buffer.bytes()
    assert torch.equal(store.get_tensor("k"), tensor)
    assert store.put_tensor_from("k", buffer.ptr, buffer.size) == ALREADY_EXISTS
    assert store.upsert_tensor_from("k", buffer.ptr, buffer.size) == 0
    bad = Buffer(buffer.size, with_field(buffer.bytes(), "magic", 0))
    assert store.put_tensor_from("bad", bad.ptr, bad.size) == INVALID
    assert store.put_tensor_from("bad", buffer.ptr, buffer.size - 4) == INVALID
    assert store.put_tensor_from("bad", buffer.ptr, META) == INVALID
    assert store.put_tensor_from("bad", 0, buffer.size) == INVALID
    assert store.upsert_tensor_from("bad", bad.ptr, bad.size) == INVALID
    assert "bad" not in store.objects


def test_batch_put_tensor_from(store):
    tensors = [torch.randn(3), torch.arange(4)]
    buffers = [Buffer.holding(t) for t in tensors]
    ptrs, sizes = [b.ptr for b in buffers], [b.size for b in buffers]
    assert store.batch_put_tensor_from(["a", "b"], ptrs, sizes) == [0, 0]
    assert all(torch.equal(g, t) for g, t in zip(store.batch_get_tensor(["a", "b"]), tensors))
    assert store.batch_upsert_tensor_from(["a", "b"], ptrs[::-1], sizes[::-1]) == [0, 0]
    assert torch.equal(store.get_tensor("a"), tensors[1])
    # One invalid buffer fails the whole batch, as in Mooncake.
    assert store.batch_put_tensor_from(["c", "d"], [ptrs[0], 0], sizes) == [INVALID] * 2
    assert store.batch_upsert_tensor_from(["c", "d"], ptrs, [sizes[0], 10]) == [INVALID] * 2
    assert store.batch_put_tensor_from(["c", "d"], ptrs, sizes[:1]) == [INVALID] * 2
    assert store.batch_put_tensor_from([], [], []) == []
    assert "c" not in store.objects


def test_put_tensor_with_tp_from(store):
    tensor = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    buffer = Buffer.holding(tensor)
    assert store.put_tensor_with_tp_from("k", buffer.ptr, buffer.size, tp_size=2,
                                         split_dim=1) == 0
    for rank, chunk in enumerate(tensor.chunk(2, 1)):
        assert torch.equal(store.get_tensor_with_tp("k", tp_rank=rank, tp_size=2), chunk)
    assert buffer.bytes() == encode(tensor)  # the source buffer is left as it was
    assert store.put_tensor_with_tp_from("whole", buffer.ptr, buffer.size) == 0
    assert store.objects["whole"] == buffer.bytes()
    bad = Buffer(buffer.size, with_field(buffer.bytes(), "version", 9))
    assert store.put_tensor_with_tp_from("bad", bad.ptr, bad.size, tp_size=2) == INVALID
    results = store.batch_put_tensor_with_tp_from(
        ["x", "bad", "y"], [buffer.ptr, bad.ptr, buffer.ptr], [buffer.size] * 3, tp_size=3)
    assert results == [0, INVALID, 0]
    assert sorted(k for k in store.objects if k.startswith(("x", "y", "bad"))) == \
        ["x_tp_0", "x_tp_1", "x_tp_2", "y_tp_0", "y_tp_1", "y_tp_2"]
    assert store.batch_put_tensor_with_tp_from(["z"], [buffer.ptr], [], tp_size=2) == [INVALID]
    assert store.batch_put_tensor_with_tp_from([], [], [], tp_size=2) == []


def test_get_tensor_into_aliases_the_buffer(store):
    original = torch.ones(100, dtype=torch.float32)
    assert store.put_tensor("k", original) == 0
    buffer = Buffer(META + 400)
    got = store.get_tensor_into("k", buffer.ptr, buffer.size)
    assert torch.equal(got, original)
    assert got.data_ptr() == buffer.ptr + META
    got.fill_(42.0)
    assert buffer.bytes()[META:] == torch.full((100,), 42.0).numpy().tobytes()
    assert store.upsert_tensor_from("k", buffer.ptr, buffer.size) == 0
    assert torch.equal(store.get_tensor("k"), torch.full((100,), 42.0))
    assert store.get_tensor_into("absent", buffer.ptr, buffer.size) is None
    assert store.get_tensor_into("k", buffer.ptr, buffer.size - 1) is None
    larger = Buffer(4096)
    assert torch.equal(store.get_tensor_into("k", larger.ptr, larger.size),
                       torch.full((100,), 42.0))


def test_batch_get_tensor_into(store):
    tensors = [torch.randn(8), torch.arange(3)]
    assert store.batch_put_tensor(["a", "b"], tensors) == [0, 0]
    buffers = [Buffer(1024) for _ in range(3)]
    ptrs, sizes = [b.ptr for b in buffers], [b.size for b in buffers]
    got = store.batch_get_tensor_into(["a", "absent", "b"], ptrs, sizes)
    assert torch.equal(got[0], tensors[0]) and got[1] is None and torch.equal(got[2], tensors[1])
    assert got[2].data_ptr() == buffers[2].ptr + META
    # As in Mooncake: INVALID_PARAMS ints, not None, for mismatched lists.
    assert store.batch_get_tensor_into(["a", "b"], ptrs, sizes) == [INVALID, INVALID]
    assert store.batch_get_tensor_into([], [], []) == []


def test_get_tensor_with_tp_into(store):
    tensor = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    assert store.put_tensor_with_tp("k", tensor, tp_size=3, split_dim=1) == 0
    assert store.put_tensor("full", tensor) == 0
    buffers = [Buffer(1024) for _ in range(3)]
    for rank, chunk in enumerate(tensor.chunk(3, 1)):
        got = store.get_tensor_with_tp_into("k", buffers[rank].ptr, 1024, tp_rank=rank,
                                            tp_size=3, split_dim=1)
        assert torch.equal(got, chunk) and got.data_ptr() == buffers[rank].ptr + META
    assert torch.equal(store.get_tensor_with_tp_into("full", buffers[0].ptr, 1024), tensor)
    ptrs = [b.ptr for b in buffers]
    got = store.batch_get_tensor_with_tp_into(["k", "absent", "full"], ptrs, [1024] * 3,
                                              tp_rank=2, tp_size=3)
    assert torch.equal(got[0], tensor.chunk(3, 1)[2]) and got[1:] == [None, None]
    assert store.batch_get_tensor_with_tp_into(["k", "k"], ptrs, [1024], tp_size=3) == \
        [None, None]


def test_not_ready(store):
    assert store.put_tensor("k", torch.ones(1)) == 0
    buffer = Buffer.holding(torch.ones(2))
    store.ready = False
    t, p, n = torch.ones(2), buffer.ptr, buffer.size
    for result in (store.put_tensor("x", t), store.pub_tensor("x", t), store.upsert_tensor("x", t),
                   store.upsert_pub_tensor("x", t), store.put_tensor_with_tp("x", t, tp_size=2),
                   store.pub_tensor_with_tp("x", t), store.upsert_tensor_with_tp("x", t),
                   store.upsert_pub_tensor_with_tp("x", t, tp_size=2),
                   store.put_tensor_from("x", p, n), store.upsert_tensor_from("x", p, n),
                   store.put_tensor_with_tp_from("x", p, n, tp_size=2),
                   store.put_tensor_with_tp_from("x", p, n)):
        assert result == INVALID
    for results in (store.batch_put_tensor(["x", "y"], [t, t]),
                    store.batch_pub_tensor(["x", "y"], [t, t]),
                    store.batch_upsert_tensor(["x", "y"], [t, t]),
                    store.batch_upsert_pub_tensor(["x", "y"], [t, t]),
                    store.batch_put_tensor_with_tp(["x", "y"], [t, t], tp_size=2),
                    store.batch_pub_tensor_with_tp(["x", "y"], [t, t]),
                    store.batch_upsert_tensor_with_tp(["x", "y"], [t, t]),
                    store.batch_upsert_pub_tensor_with_tp(["x", "y"], [t, t]),
                    store.batch_put_tensor_from(["x", "y"], [p, p], [n, n]),
                    store.batch_upsert_tensor_from(["x", "y"], [p, p], [n, n]),
                    store.batch_put_tensor_with_tp_from(["x", "y"], [p, p], [n, n], tp_size=2),
                    store.batch_get_tensor_into(["k", "y"], [p, p], [n, n])):
        assert results == [INVALID, INVALID]
    assert store.objects.keys() == {"k"}
    assert store.get_tensor("k") is None
    assert store.get_tensor_with_tp("k") is None
    assert store.get_tensor_into("k", p, n) is None
    assert store.get_tensor_with_tp_into("k", p, n) is None
    assert store.batch_get_tensor(["k", "y"]) == [None, None]
    assert store.batch_get_tensor_with_tp(["k", "y"], tp_size=2) == [None, None]
    assert store.batch_get_tensor_with_tp_into(["k", "y"], [p, p], [n, n]) == [None, None]
    assert buffer.bytes() == encode(torch.ones(2))
    store.ready = True
    assert torch.equal(store.get_tensor("k"), torch.ones(1))


def test_import_needs_no_torch():
    """The module imports torch only inside functions."""
    source = pathlib.Path(_tensor.__file__).read_text()
    assert "\nimport torch" not in source and "\nfrom torch" not in source

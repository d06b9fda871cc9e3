# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Tensors to and from files through the Mooncake layer (save_tensor_to_safetensor,
load_tensor_from_file, save_tensor / load_tensor, ...), called as Mooncake's users call them:
the safetensors bytes are checked field by field (no safetensors package is used), and a file
written here loads back into another key."""

import io
import json
import struct

import pytest

from conftest import setup_mooncake_store

torch = pytest.importorskip("torch")

INVALID = -600
FILE_NOT_FOUND = -1100


@pytest.fixture
def mc(mooncake_store, master):
    s = setup_mooncake_store(mooncake_store, master.address)
    yield s
    s.close()


def read_safetensors(path):
    """(header dict, data bytes) of a safetensors file, parsed by hand."""
    blob = path.read_bytes()
    (length,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + length])
    return header, blob[8 + length:], length


def write_safetensors(path, entries):
    """A safetensors file of (name, dtype code, shape, bytes) entries, written by hand."""
    header, data = {}, b""
    for name, code, shape, raw in entries:
        header[name] = {"dtype": code, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_safetensors_file_layout(mc, prefix, tmp_path):
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert mc.put_tensor(prefix + "t", tensor) == 0
    path = tmp_path / "t.safetensors"
    assert mc.save_tensor_to_safetensor(prefix + "t", str(path)) == 0
    header, data, length = read_safetensors(path)
    assert length % 8 == 0  # the data starts 8-byte aligned
    assert header == {prefix + "t": {"dtype": "F32", "shape": [2, 3],
                                     "data_offsets": [0, 24]}}
    assert data == tensor.numpy().tobytes()


@pytest.mark.parametrize("tensor", [
    torch.tensor([1.0, 2.0, 3.0]),
    torch.tensor([1, 2, 3], dtype=torch.int32),
    torch.tensor([True, False, True]),
    torch.tensor([[[1.5, -2.0]], [[3.0, 4.25]]], dtype=torch.float64),
    torch.arange(12, dtype=torch.int64).reshape(3, 4),
    torch.ones(2, 3, dtype=torch.bfloat16),
    torch.ones(0, 4),
], ids=["f32", "i32", "bool", "f64-3d", "i64", "bf16", "empty"])
def test_save_then_load_into_another_key(mc, prefix, tmp_path, tensor):
    assert mc.put_tensor(prefix + "src", tensor) == 0
    path = tmp_path / "x.safetensors"
    assert mc.save_tensor_to_safetensor(prefix + "src", str(path)) == 0
    loaded = mc.load_tensor_from_safetensor(prefix + "dst", str(path))
    assert loaded is not None and torch.equal(loaded, tensor)
    got = mc.get_tensor(prefix + "dst")
    assert got.dtype == tensor.dtype and torch.equal(got, tensor)


def test_default_file_name_is_the_key(mc, prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    key = prefix.rstrip("/") + "-default"
    tensor = torch.tensor([5.0, 6.0, 7.0])
    assert mc.put_tensor(key, tensor) == 0
    assert mc.save_tensor_to_safetensor(key) == 0
    assert (tmp_path / key).exists()
    # Loading into the key that already holds it succeeds, as a put of a stored key does.
    assert torch.equal(mc.load_tensor_from_safetensor(key, key), tensor)


def test_file_uri_nested_folder_and_tensor_name(mc, prefix, tmp_path):
    tensor = torch.tensor([[11.0, 12.0], [13.0, 14.0]])
    assert mc.put_tensor(prefix + "kv", tensor) == 0
    path = tmp_path / "nested" / "deeper" / "kv.safetensors"
    assert mc.save_tensor_to_safetensor(prefix + "kv", path.as_uri(), filesystem="file",
                                        tensor_name="kv_cache") == 0
    header, _, _ = read_safetensors(path)
    assert list(header) == ["kv_cache"]
    loaded = mc.load_tensor_from_safetensor(prefix + "kv2", path.as_uri(), filesystem="file",
                                            tensor_name="kv_cache")
    assert torch.equal(loaded, tensor)


def test_entry_choice_in_a_file_of_several(mc, prefix, tmp_path):
    path = tmp_path / "two.safetensors"
    write_safetensors(path, [(prefix + "a", "F32", [2], struct.pack("<2f", 1, 2)),
                             ("b", "I16", [3], struct.pack("<3h", 7, 8, 9))])
    assert torch.equal(mc.load_tensor_from_safetensor(prefix + "b", str(path), tensor_name="b"),
                       torch.tensor([7, 8, 9], dtype=torch.int16))
    # Without tensor_name: the entry named like the key it loads into.
    assert torch.equal(mc.load_tensor_from_safetensor(prefix + "a", str(path)),
                       torch.tensor([1.0, 2.0]))
    # An unknown name in a file of several entries loads nothing.
    assert mc.load_tensor_from_file(prefix + "none", str(path), format="safetensors",
                                    tensor_name="missing") is None
    assert mc.get_tensor(prefix + "none") is None


def test_single_entry_file_loads_whatever_its_name(mc, prefix, tmp_path):
    path = tmp_path / "one.safetensors"
    write_safetensors(path, [("weights", "U8", [4], b"\x01\x02\x03\x04")])
    got = mc.load_tensor_from_safetensor(prefix + "w", str(path), tensor_name="other")
    assert torch.equal(got, torch.tensor([1, 2, 3, 4], dtype=torch.uint8))


def test_failures(mc, prefix, tmp_path):
    assert mc.save_tensor_to_safetensor(prefix + "absent", str(tmp_path / "a.st")) == \
        FILE_NOT_FOUND
    assert not (tmp_path / "a.st").exists()
    assert mc.load_tensor_from_safetensor(prefix + "k", str(tmp_path / "none.st")) is None
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 5)
    assert mc.load_tensor_from_safetensor(prefix + "k", str(tmp_path / "junk.safetensors")) \
        is None
    assert mc.put_tensor(prefix + "t", torch.ones(2)) == 0
    assert mc.save_tensor_to_file(prefix + "t", str(tmp_path / "t.bin"), format="npz") == INVALID
    assert mc.get_tensor(prefix + "k") is None


def test_torch_format(mc, prefix, tmp_path):
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert mc.put_tensor(prefix + "t", tensor) == 0
    path = tmp_path / "t.pt"
    assert mc.save_tensor_to_file(prefix + "t", str(path)) == 0  # "auto": torch for .pt
    assert torch.equal(torch.load(io.BytesIO(path.read_bytes())), tensor)
    assert torch.equal(mc.load_tensor_from_file(prefix + "t2", str(path), filesystem="file"),
                       tensor)
    # A checkpoint that is not one tensor is refused; so is torch.load from a remote scheme.
    torch.save({"weight": tensor}, str(tmp_path / "dict.pt"))
    assert mc.load_tensor_from_file(prefix + "d", str(tmp_path / "dict.pt")) is None
    assert mc.load_tensor_from_file(prefix + "r", "s3://bucket/model.pt", format="torch") is None
    assert mc.get_tensor(prefix + "d") is None and mc.get_tensor(prefix + "r") is None


def test_kv_cache_aliases(mc, prefix, tmp_path):
    tensor = torch.tensor([21.0, 22.0, 23.0])
    assert mc.put_tensor(prefix + "kv", tensor) == 0
    path = str(tmp_path / "kv.safetensors")
    assert mc.save_kv_cache_to_file(prefix + "kv", path, format="safetensors",
                                    filesystem="file") == 0
    assert torch.equal(mc.load_kv_cache_from_file(prefix + "kv2", path, format="safetensors"),
                       tensor)


def test_save_tensor_and_load_tensor(mooncake_store, mc, prefix, tmp_path):
    from mooncake.store_file_io import FILE_NOT_FOUND as CODE_NOT_FOUND
    from mooncake.store_file_io import INVALID_PARAMS, PERSISTENT_FAIL

    assert (INVALID_PARAMS, CODE_NOT_FOUND, PERSISTENT_FAIL) == (-600, -1100, -1503)
    tensor = torch.tensor([4.0, 5.0, 6.0])
    assert mc.save_tensor(prefix + "only", tensor) == 0
    assert torch.equal(mc.load_tensor(prefix + "only"), tensor)
    path = str(tmp_path / "export.safetensors")
    assert mc.save_tensor(prefix + "exp", tensor, file_name=path, artifact_kind="safetensor",
                          tensor_name="payload") == 0
    assert torch.equal(mc.load_tensor(prefix + "exp2", file_name=path,
                                      artifact_kind="safetensor", tensor_name="payload"), tensor)
    assert mc.save_tensor(prefix + "kv", tensor, file_name=path, artifact_kind="kv_cache") == 0
    assert torch.equal(mc.load_tensor(prefix + "kv2", file_name=path, artifact_kind="kv_cache"),
                       tensor)
    assert mc.save_tensor(prefix + "bad", tensor, file_name=path,
                          artifact_kind="not-a-kind") == INVALID_PARAMS
    assert mc.get_tensor(prefix + "bad") is None
    assert mc.load_tensor(prefix + "bad", file_name=path, artifact_kind="not-a-kind") is None


def test_before_setup(mooncake_store, tmp_path):
    s = mooncake_store.MooncakeDistributedStore()
    assert s.save_tensor_to_safetensor("k", str(tmp_path / "k")) == INVALID
    assert s.load_tensor_from_safetensor("k", str(tmp_path / "k")) is None

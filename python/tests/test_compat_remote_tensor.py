# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake's remote tensor batches (``mooncake.remote_tensor_batch``), the store's
``get_tensor_dim_selection_into`` behind them, and the matrix read planner
(``mooncake._partial_read``), each checked against numpy's indexing."""

import ctypes

import numpy as np
import pytest

from conftest import INVALID, NOT_FOUND, setup_mooncake_store


@pytest.fixture
def rtb(shim_path):
    from mooncake import remote_tensor_batch

    return remote_tensor_batch


@pytest.fixture
def plan_matrix_read(shim_path):
    from mooncake._partial_read import plan_matrix_read as plan

    return plan


@pytest.fixture(params=["tcp", "auto"])
def route(request):
    return request.param


@pytest.fixture
def mc(mooncake_store, master, route):
    s = setup_mooncake_store(mooncake_store, master.address)
    yield s
    s.close()


def test_shim_modules_resolve_to_larder(rtb, plan_matrix_read):
    from larder.compat.mooncake import _partial_read, _remote_tensor_batch

    assert rtb.RemoteTensorBatch is _remote_tensor_batch.RemoteTensorBatch
    assert plan_matrix_read is _partial_read.plan_matrix_read


# ---- the matrix read planner ----


def _run_plan(source: np.ndarray, plan) -> np.ndarray:
    flat = source.tobytes()
    out = bytearray(plan.nbytes)
    for src, dst, size in plan.ranges:
        out[dst:dst + size] = flat[src:src + size]
    return np.frombuffer(bytes(out), dtype=source.dtype).reshape(plan.shape)


@pytest.mark.parametrize("rows", [(0,), (4, 3, 2), (1, 2, 3), (0, 0, 4), range(1, 5),
                                  range(0, 5, 2), ()])
@pytest.mark.parametrize("columns", [slice(None), slice(1, 3), slice(-2, None), slice(3, 1),
                                     slice(None, 100)])
def test_matrix_plan_reads_what_numpy_selects(plan_matrix_read, rows, columns):
    source = np.arange(5 * 4, dtype=np.int32).reshape(5, 4)
    plan = plan_matrix_read(source.shape, source.itemsize, rows, columns, max_ranges=64)
    expected = source[list(rows), columns]
    assert plan.shape == expected.shape and plan.nbytes == expected.nbytes
    np.testing.assert_array_equal(_run_plan(source, plan), expected)


def test_matrix_plan_merges_neighbouring_rows_and_caps_ranges(plan_matrix_read):
    # Whole rows 1, 2, 3 are one range; row 1 again starts a second.
    plan = plan_matrix_read((5, 4), 2, (1, 2, 3, 1), slice(None), max_ranges=2)
    assert plan.ranges == ((8, 0, 24), (8, 24, 8))
    assert plan_matrix_read((5, 4), 2, (1, 2, 3, 1), slice(None), max_ranges=1).ranges is None
    # Part rows never merge: one range a row.
    assert len(plan_matrix_read((5, 4), 2, (1, 2), slice(0, 3), max_ranges=2).ranges) == 2


@pytest.mark.parametrize("shape, rows, columns, error", [
    ((4,), (), slice(None), ValueError),
    ((4, 4), (), slice(None, None, -1), ValueError),
    ((4, 4), range(3, 0, -1), slice(None), ValueError),
    ((4, 4), (-1,), slice(None), IndexError),
    ((4, 4), (4,), slice(None), IndexError),
    ((4, 4), [0], slice(None), TypeError),
    ((4, 4), (0,), 1, TypeError),
])
def test_matrix_plan_rejects(plan_matrix_read, shape, rows, columns, error):
    with pytest.raises(error):
        plan_matrix_read(shape, 4, rows, columns, max_ranges=8)


# ---- selection arithmetic ----


@pytest.mark.parametrize("selections, numpy_index", [
    ([("select_idxs", [2, -1, 0])], [2, 5, 0]),
    ([("select_idxs", [True, False, True, False, False, True])], [0, 2, 5]),
    ([("slice", (None, None, -2))], [5, 3, 1]),
    ([("repeat", (2, True))], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
    ([("slice", (0, 2, None)), ("repeat", (3, False))], [0, 1, 0, 1, 0, 1]),
    ([("cat", [[("slice", (4, None, None))], [("select_idxs", [1])], []])],
     [4, 5, 1, 0, 1, 2, 3, 4, 5]),
    ([{"op": "select_idxs", "value": [3, 4]}, ("cat", [[("repeat", (2, True))],
                                                       [("select_idxs", [0])]])],
     [3, 3, 4, 4, 3]),
])
def test_selection_shape_matches_numpy(rtb, selections, numpy_index):
    assert rtb.selection_output_shape((6, 3), selections) == (len(numpy_index), 3)
    assert rtb.selection_output_shape((2, 6), selections, dim=-1) == (2, len(numpy_index))


def test_selection_errors(rtb):
    with pytest.raises(IndexError):
        rtb.selection_output_shape((4,), [("select_idxs", [True, False])])
    with pytest.raises(ValueError):
        rtb.selection_output_shape((4,), [("transpose", None)])
    with pytest.raises(ValueError):
        rtb.selection_output_shape((4,), [("repeat", (-1, True))])
    with pytest.raises(ValueError):
        rtb.selection_output_shape((4,), [], dim=1)
    with pytest.raises(ValueError):
        rtb.selection_output_shape((), [])
    with pytest.raises(ValueError):
        rtb.RemoteTensorBatch({}, 4).repeat(-1)
    with pytest.raises(ValueError):
        rtb.RemoteTensorBatch.cat([])


def test_dtype_helpers(rtb):
    assert rtb.normalize_dtype_name("torch.BFloat16") == "bfloat16"
    assert rtb.dtype_byte_size(np.dtype("float32")) == 4
    assert rtb.tensor_nbytes((3, 0), "int64") == 0
    with pytest.raises(ValueError):
        rtb.dtype_byte_size("complex-ish")
    with pytest.raises(ValueError):
        rtb.tensor_nbytes((-1,), "int8")


def test_writable_buffer_region_refuses_read_only(rtb):
    with pytest.raises(ValueError):
        rtb.writable_buffer_region(b"12345678")
    array = np.zeros((2, 3), dtype=np.int16)
    with rtb.writable_buffer_region(array) as region:
        assert region.size == array.nbytes
        ctypes.memset(region.ptr, 1, region.size)
    assert (array == 0x0101).all()


# ---- get_tensor_dim_selection_into on a real store ----


def _read(mc, key, source, dim, selections, data_offset=0, size=4096):
    """(code, the elements read) of one get_tensor_dim_selection_into into a registered
    buffer of 4 KiB, of which ``size`` bytes are offered."""
    buffer = (ctypes.c_ubyte * 4096)()
    ptr = ctypes.addressof(buffer)
    assert mc.register_buffer(ptr, len(buffer)) == 0
    try:
        code = mc.get_tensor_dim_selection_into(key, ptr, size, list(source.shape),
                                                str(source.dtype), dim, selections, data_offset)
    finally:
        assert mc.unregister_buffer(ptr) == 0
    read = max(code, 0)
    return code, np.frombuffer(bytes(buffer)[:read], dtype=source.dtype)


@pytest.mark.parametrize("shape, dim, selections, index", [
    ((6, 2), 0, [("select_idxs", [5, 0, 5])], np.s_[[5, 0, 5]]),
    ((3, 5, 2), 1, [("slice", (None, None, -2))], np.s_[:, ::-2]),
    ((2, 3, 4), -1, [("repeat", (2, False))], np.s_[:, :, [0, 1, 2, 3, 0, 1, 2, 3]]),
    ((7,), 0, [("slice", (1, 6, None)), ("cat", [[("select_idxs", [4, 0])], []])],
     np.s_[[5, 1, 1, 2, 3, 4, 5]]),
    ((4, 3), 0, [], np.s_[:]),
])
def test_dim_selection_reads_what_numpy_selects(mc, prefix, shape, dim, selections, index):
    source = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    header = b"HDR!" * 4
    key = prefix + "t"
    assert mc.put(key, header + source.tobytes()) == 0
    expected = source[index]
    code, out = _read(mc, key, source, dim, selections, data_offset=len(header))
    assert code == expected.nbytes
    np.testing.assert_array_equal(out.reshape(expected.shape), expected)


def test_dim_selection_errors(mc, prefix):
    source = np.arange(12, dtype=np.int64).reshape(4, 3)
    key = prefix + "t"
    assert mc.put(key, source.tobytes()) == 0
    assert _read(mc, prefix + "missing", source, 0, [])[0] == NOT_FOUND
    assert _read(mc, key, source, 0, [("select_idxs", [9])])[0] == INVALID
    assert _read(mc, key, source, 2, [])[0] == INVALID
    assert _read(mc, key, source, 0, [("shuffle", None)])[0] == INVALID
    # A buffer smaller than the selection.
    assert _read(mc, key, source, 0, [], size=8)[0] == INVALID
    # A shape larger than the value.
    assert _read(mc, key, np.zeros((5, 3), dtype=np.int64), 0, [])[0] < 0
    # An empty selection reads nothing and succeeds.
    assert _read(mc, key, source, 0, [("select_idxs", [])])[0] == 0


def test_materializer_reads_a_remote_batch(mc, prefix, rtb):
    ids = np.arange(8 * 3, dtype=np.int64).reshape(8, 3)
    mask = np.arange(8, dtype=np.float32) * 0.5
    assert mc.put(prefix + "ids", ids.tobytes()) == 0
    assert mc.put(prefix + "mask", b"\0" * 8 + mask.tobytes()) == 0
    batch = rtb.RemoteTensorBatch({
        "ids": rtb.TensorFieldRef(prefix + "ids", (8, 3), "int64"),
        "mask": rtb.TensorFieldRef(prefix + "mask", (8,), "float32", 8),
    }, 8)
    picked = batch.select_indices(np.array([7, 2, 2])).repeat(2, interleave=False)
    both = rtb.RemoteTensorBatch.cat([picked, batch.slice(6, None, None)])
    assert len(both) == 8
    out = rtb.RemoteTensorBatchMaterializer(mc).materialize_buffers(both)
    rows = [7, 2, 2, 7, 2, 2, 6, 7]
    buffer, shape, dtype = out["ids"]
    assert shape == (8, 3) and dtype == "int64"
    np.testing.assert_array_equal(np.frombuffer(buffer, dtype=np.int64).reshape(shape), ids[rows])
    np.testing.assert_array_equal(np.frombuffer(out["mask"][0], dtype=np.float32), mask[rows])
    # Nothing stays registered.
    assert mc._registered == {}


def test_materializer_raises_for_a_missing_key(mc, prefix, rtb):
    request = rtb.TensorReadRequest("x", rtb.TensorFieldRef(prefix + "missing", (2,), "int8"))
    with pytest.raises(RuntimeError):
        rtb.RemoteTensorBatchMaterializer(mc).materialize_request_into(request, bytearray(2))
    with pytest.raises(ValueError):
        rtb.RemoteTensorBatchMaterializer(mc).materialize_request_into(request, bytearray(1))
    assert mc._registered == {}

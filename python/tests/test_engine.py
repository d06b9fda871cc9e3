# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.TransferEngine: every method, its buffer forms, and its errors."""

import socket
import threading
import time

import numpy as np
import pytest

import larder
from conftest import auto_routes


@pytest.fixture
def engine():
    e = larder.TransferEngine()
    yield e
    e.close()


@pytest.fixture
def peer():
    """A second engine, reached from `engine` over shm (memfd segments) or tcp."""
    e = larder.TransferEngine()
    yield e
    e.close()


def test_properties(engine):
    assert engine.address.startswith("127.0.0.1:")
    assert engine.routes == auto_routes()
    assert engine.id.startswith(engine.host_id + "/")
    assert engine.address in repr(engine)
    with larder.TransferEngine("tcp", listen_address="127.0.0.1:0", copy_threads=2,
                               slice_bytes="1MiB", default_timeout=5,
                               tcp_connections_per_peer=2) as e:
        assert e.routes == ["tcp"]


@pytest.mark.parametrize("kwargs,error", [
    ({"protocol": "carrier-pigeon"}, larder.InvalidArgumentError),
    ({"listen_address": "nowhere"}, larder.InvalidArgumentError),
    ({"role": "boss"}, larder.InvalidArgumentError),
    ({"slice_bytes": 0}, larder.InvalidArgumentError),
    ({"default_timeout": "never"}, larder.InvalidArgumentError),
])
def test_bad_options(kwargs, error):
    with pytest.raises(error):
        larder.TransferEngine(**kwargs)


def test_close(engine):
    engine.close()
    assert engine.closed
    engine.close()
    for call in (lambda: engine.address, lambda: engine.list_segments(),
                 lambda: engine.allocate_segment_memory(4096)):
        with pytest.raises(larder.FailedPreconditionError):
            call()


def test_memory_region(engine):
    region = engine.allocate_segment_memory("1MiB")
    assert region.size == len(region) == 1 << 20
    assert region.kind == "memfd"
    assert region.address != 0
    view = np.frombuffer(region, dtype=np.uint8)
    assert view.ctypes.data == region.address and not view.any()
    view[:3] = [1, 2, 3]
    assert bytes(memoryview(region)[:3]) == b"\x01\x02\x03"
    with pytest.raises(larder.InvalidArgumentError):
        engine.allocate_segment_memory(0)


@pytest.mark.parametrize("kind", ["numpy", "bytearray", "address", "region"])
def test_register_read_write(engine, peer, kind):
    size = 1 << 20
    keep = None
    if kind == "numpy":
        keep = np.zeros(size, np.uint8)
        peer.register_segment("kv", keep)
        target = keep
    elif kind == "bytearray":
        keep = bytearray(size)
        peer.register_segment("kv", keep)
        target = np.frombuffer(keep, np.uint8)
    elif kind == "address":
        keep = np.zeros(size, np.uint8)
        peer.register_segment("kv", keep.ctypes.data, size)
        target = keep
    else:
        keep = peer.allocate_segment_memory(size)
        peer.register_segment("kv", keep)
        target = np.frombuffer(keep, np.uint8)
    handle = engine.open_segment(peer.address, "kv")
    assert engine.segment_route(handle) == ("shm" if kind == "region" else "tcp")
    assert engine.segment_info(handle).name == "kv"
    data = np.arange(8192, dtype=np.uint8)
    assert engine.write(handle, 4096, data) == 8192
    assert np.array_equal(target[4096:4096 + 8192], data)
    out = bytearray(100)
    assert engine.read(handle, 4096 + 10, out) == 100
    assert out == data[10:110].tobytes()
    local = np.zeros(64, np.uint8)
    assert engine.read(handle, 4096, local.ctypes.data, 64) == 64
    assert np.array_equal(local, data[:64])
    assert engine.write(handle, 0, b"hello", 2) == 2
    assert bytes(target[:3]) == b"he\0"
    engine.close_segment(handle)


def test_segment_errors(engine, peer):
    buf = np.zeros(4096, np.uint8)
    sid = peer.register_segment("kv", buf)
    with pytest.raises(larder.AlreadyExistsError):
        peer.register_segment("kv", np.zeros(16, np.uint8))
    with pytest.raises((BufferError, TypeError)):  # exported memory must be writable
        peer.register_segment("ro", b"read-only")
    with pytest.raises(TypeError):
        peer.register_segment("x", peer.allocate_segment_memory(4096), 10)
    with pytest.raises(TypeError):
        peer.register_segment("x", buf.ctypes.data)  # address without size
    with pytest.raises(larder.NotFoundError):
        engine.open_segment(peer.address, "no-such-segment")
    handle = engine.open_segment(peer.address, "kv")
    out = bytearray(64)
    with pytest.raises(larder.OutOfRangeError):
        engine.read(handle, 4090, out)
    with pytest.raises(larder.InvalidArgumentError):
        engine.read(handle, 0, out, 65)  # longer than the buffer
    with pytest.raises(BufferError):
        engine.read(handle, 0, b"\0" * 64)  # reading into read-only memory
    peer.unregister_segment(sid)
    with pytest.raises(larder.LarderError):
        engine.read(handle, 0, out)
    with pytest.raises(larder.NotFoundError):
        peer.unregister_segment(sid)
    with pytest.raises(larder.LarderError):
        engine.segment_route(123456)
    with pytest.raises(larder.LarderError):
        engine.close_segment(123456)


def test_descriptors(engine, peer):
    peer.register_segment("a", np.zeros(4096, np.uint8))
    peer.register_segment("b", peer.allocate_segment_memory(8192))
    local = {d.name: d for d in peer.list_segments()}
    remote = {d.name: d for d in engine.list_peer_segments(peer.address, timeout=2)}
    assert set(local) == set(remote) == {"a", "b"}
    b = remote["b"]
    assert b.size == 8192 and b.memory_kind == "memfd" and b.address == peer.address
    assert remote["a"].memory_kind == "anonymous"
    copy = larder.SegmentDescriptor.from_json(b.to_json())
    assert (copy.name, copy.segment_id, copy.engine_id) == (b.name, b.segment_id, b.engine_id)
    handle = engine.open_segment(copy)
    assert engine.read(handle, 0, bytearray(16)) == 16
    with pytest.raises(larder.InvalidArgumentError):
        larder.SegmentDescriptor.from_json("{not json")
    with pytest.raises(larder.UnavailableError):
        engine.list_peer_segments("127.0.0.1:1", timeout=1)


def test_transfer_batch(engine, peer):
    target = np.zeros(1 << 16, np.uint8)
    peer.register_segment("kv", target)
    handle = engine.open_segment(peer.address, "kv")
    src = np.arange(1 << 12, dtype=np.uint8)
    dst = np.zeros(1 << 12, np.uint8)
    writes = [larder.TransferRequest("write", src.ctypes.data + i * 256, handle, i * 1024, 256)
              for i in range(16)]
    results = engine.transfer(writes, timeout=5)
    assert all(r.ok and r.bytes == 256 and r.route == "tcp" for r in results)
    reads = [larder.TransferRequest(larder.TransferOp.READ, dst.ctypes.data + i * 256, handle,
                                    i * 1024, 256) for i in range(16)]
    reads.append(larder.TransferRequest("read", dst.ctypes.data, handle, 1 << 16, 16))
    results = engine.transfer(reads)
    assert all(r.ok for r in results[:16])
    assert np.array_equal(dst, src)
    assert not results[16].ok and isinstance(results[16].error, larder.OutOfRangeError)
    request = reads[0]
    request.offset = 2048
    request.length = 8
    assert (request.op, request.offset, request.length) == (larder.TransferOp.READ, 2048, 8)
    assert "read" in repr(request)
    with pytest.raises(larder.InvalidArgumentError):
        engine.transfer([])
    with pytest.raises(larder.InvalidArgumentError):
        larder.TransferRequest("sideways", 0, handle, 0, 1)


def test_local_memory(engine):
    buf = np.zeros(1 << 16, np.uint8)
    engine.register_local_memory(buf)
    with pytest.raises(larder.AlreadyExistsError):
        engine.register_local_memory(buf[10:20])
    engine.unregister_local_memory(buf)
    with pytest.raises(larder.NotFoundError):
        engine.unregister_local_memory(buf)
    engine.register_local_memory(buf.ctypes.data, 100)
    engine.unregister_local_memory(buf.ctypes.data)


def test_required_local_registration():
    with larder.TransferEngine(require_local_registration=True) as e:
        target = np.zeros(4096, np.uint8)
        e.register_segment("kv", target)
        handle = e.open_segment(e.address, "kv")
        buf = np.ones(64, np.uint8)
        with pytest.raises(larder.LarderError):
            e.write(handle, 0, buf)
        e.register_local_memory(buf)
        assert e.write(handle, 0, buf) == 64
        assert target[:64].all()


def test_gil_released_while_waiting(engine):
    """A peer that accepts connections but never answers: the call waits for its deadline while
    other Python threads keep running."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    start = time.monotonic()
    try:
        with pytest.raises(larder.DeadlineExceededError):
            engine.list_peer_segments("127.0.0.1:%d" % silent.getsockname()[1], timeout=1)
    finally:
        stop.set()
        t.join()
        silent.close()
    assert time.monotonic() - start >= 0.9
    assert len(ticks) > 100

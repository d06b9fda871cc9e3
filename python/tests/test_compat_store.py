# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""larder.compat.mooncake.MooncakeDistributedStore, imported as Mooncake users do: through the
shim (`from mooncake.store import ...`)."""

import json
import uuid
import warnings

import numpy as np
import pytest

import larder
from conftest import INVALID, NOT_FOUND, setup_mooncake_store
from larder.compat import mooncake as compat
from workers import MB

RPC_FAIL = -900
INTERNAL = -1


@pytest.fixture
def mc(mooncake_store, master):
    s = setup_mooncake_store(mooncake_store, master.address)
    yield s
    s.close()


def test_shim_resolves_to_larder(shim_path):
    import mooncake
    from mooncake.engine import TransferEngine, TransferOpcode
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    assert mooncake.IS_LARDER
    assert MooncakeDistributedStore is compat.MooncakeDistributedStore
    assert ReplicateConfig is compat.ReplicateConfig
    assert TransferEngine is compat.TransferEngine
    assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1


# ---- setup ----


def test_setup_positional_and_engine_argument(mooncake_store, master):
    s = mooncake_store.MooncakeDistributedStore()
    # SGLang passes an eighth positional argument (a shared engine, usually None).
    assert s.setup("localhost", "http://127.0.0.1:8080/metadata", 16 * MB, 16 * MB, "tcp", "",
                   master.address, None) == 0
    # As in Mooncake: the host as given, and a port of [12300, 14300] when it names none.
    host, port = s.get_hostname().split(":")
    assert host == "localhost" and 12300 <= int(port) <= 14300
    assert s.close() == 0
    assert s.get_hostname() == ""


def test_setup_keywords_and_dict_form(mooncake_store, master):
    s = mooncake_store.MooncakeDistributedStore()
    assert s.setup(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE",
                   global_segment_size=16 * MB, local_buffer_size=0, protocol="tcp",
                   rdma_devices="", master_server_addr=master.address) == 0
    s.close()
    assert s.setup({"local_hostname": "127.0.0.1:12345", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "16mb", "local_buffer_size": "16mb",
                    "protocol": "tcp", "device_name": "", "master_server_address": master.address,
                    "some_other_key": True}) == 0
    assert s.put("k-dict", b"v") == 0
    s.close()


def test_setup_unknown_keyword_is_a_type_error(mooncake_store, master):
    # SGLang probes optional setup() keywords this way and retries without them.
    with pytest.raises(TypeError):
        mooncake_store.MooncakeDistributedStore().setup(
            "127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "", master.address,
            enable_telepathy=True)


def test_setup_from_environment(mooncake_store, master, monkeypatch, tmp_path):
    config = tmp_path / "mooncake.json"
    config.write_text(json.dumps({
        "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": "4gb", "local_buffer_size": 1024,
        "protocol": "rdma", "device_name": "mlx5_0", "master_server_address": "127.0.0.1:1"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(config))
    # The file alone names a dead master.
    resolved = compat.load_config()
    assert resolved["global_segment_size"] == 4 << 30
    assert resolved["master_server_addr"] == "127.0.0.1:1"
    assert resolved["default_kv_lease_ttl"] == 5000  # Mooncake master's default, in ms
    # The environment wins over the file, explicit arguments over both.
    monkeypatch.setenv("MOONCAKE_MASTER", master.address)
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "16mb")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "1mb")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "localhost")
    resolved = compat.load_config({"local_buffer_size": 7, "protocol": None})
    assert resolved["global_segment_size"] == 16 * MB
    assert resolved["local_buffer_size"] == 7
    assert resolved["protocol"] == "tcp"
    s = mooncake_store.MooncakeDistributedStore()
    assert s.setup() == 0
    assert s.put("from-env", b"v") == 0 and s.get("from-env") == b"v"
    s.close()
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "a lot")
    assert s.setup() == INVALID
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "16mb")
    # Each setup on a store of its own: a store refuses a second setup after a failed one.
    for ttl in ("soon", "-1"):
        monkeypatch.setenv("MOONCAKE_DEFAULT_KV_LEASE_TTL", ttl)
        assert mooncake_store.MooncakeDistributedStore().setup() == INVALID
    monkeypatch.setenv("MOONCAKE_DEFAULT_KV_LEASE_TTL", "250")
    assert compat.load_config()["default_kv_lease_ttl"] == 250
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(tmp_path / "missing.json"))
    assert mooncake_store.MooncakeDistributedStore().setup() == INVALID


def test_larder_store_ignores_mooncake_environment(master, monkeypatch):
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:1")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "not a size")
    with larder.Store(master.address, global_segment_size="8MiB") as s:
        assert s.segment_name


def test_unknown_protocol_maps_to_auto_with_one_warning(mooncake_store, master, monkeypatch):
    monkeypatch.setattr(compat._config, "_warned_protocols", set())
    monkeypatch.delenv("LARDER_PROTOCOL", raising=False)
    monkeypatch.delenv("LARDER_STORE_PROTOCOL", raising=False)
    with pytest.warns(RuntimeWarning, match="'rdma'"):
        assert compat.map_protocol("rdma") == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.map_protocol("RDMA") == "auto"  # warned once already
        s = mooncake_store.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "rdma", "mlx5_0",
                       master.address) == 0
        s.close()
    # Mooncake's "tcp" names the network only: one host's processes stay on shm.
    assert compat.map_protocol("tcp") == "local,shm,tcp"
    assert compat.map_protocol("tcp", role="engine") == "local,shm,tcp"
    assert compat.map_protocol("shm,tcp") == "shm,tcp"
    assert compat.map_protocol("") == ""


def test_larders_own_protocol_setting_wins(monkeypatch):
    monkeypatch.setattr(compat._config, "_warned_protocols", set())
    monkeypatch.delenv("LARDER_PROTOCOL", raising=False)
    monkeypatch.setenv("LARDER_STORE_PROTOCOL", "tcp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no 'rdma' transport" warning: Larder's setting rules
        for name in ("tcp", "rdma", "shm"):
            assert compat.map_protocol(name) == ""  # the store's engine reads the variable
    # LARDER_STORE_PROTOCOL is the store's only; an engine reads LARDER_PROTOCOL.
    assert compat.map_protocol("tcp", role="engine") == "local,shm,tcp"
    monkeypatch.setenv("LARDER_PROTOCOL", "tcp")
    assert compat.map_protocol("rdma", role="engine") == ""


def test_mooncake_tcp_keeps_one_hosts_processes_on_shm(mooncake_store, master, monkeypatch):
    """A Mooncake-configured pair on one host (protocol "tcp", Mooncake's default) moves its bytes
    over shm, and says once what it did."""
    monkeypatch.setattr(compat._config, "_warned_protocols", set())
    monkeypatch.delenv("LARDER_PROTOCOL", raising=False)
    monkeypatch.delenv("LARDER_STORE_PROTOCOL", raising=False)
    stores = []
    for _ in range(2):
        s = mooncake_store.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                       master.address) == 0
        stores.append(s)
    writer, reader = stores
    key = "same-host/" + uuid.uuid4().hex
    assert writer.put(key, b"x" * MB) == 0
    def by_route():
        stats = json.loads(reader.larder_store().stats_json())
        return {r: int(c.get("bytes", 0)) for r, c in stats.get("routes", {}).items()}

    before = by_route()
    assert reader.get(key) == b"x" * MB
    after = by_route()
    assert after.get("shm", 0) - before.get("shm", 0) >= MB, (before, after)
    assert after.get("tcp", 0) == before.get("tcp", 0), (before, after)
    assert reader.larder_store().route_to(writer.larder_store().segment_name) == "shm"
    for s in stores:
        s.close()


def test_setup_failures(mooncake_store, monkeypatch):
    # Creation waits for a master to answer; this one never does.
    monkeypatch.setenv("LARDER_MASTER_CONNECT_TIMEOUT", "300ms")
    s = mooncake_store.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   "127.0.0.1:1") == RPC_FAIL
    assert s.setup("no-such-host.invalid", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   "127.0.0.1:1") == INVALID


def test_calls_before_setup(mooncake_store):
    s = mooncake_store.MooncakeDistributedStore()
    # Mooncake's binding answers INVALID_PARAMS before setup.
    assert s.put("k", b"v") == INVALID
    assert s.upsert("k", b"v") == INVALID
    assert s.get("k") == b""
    assert s.get_buffer("k") is None
    assert s.batch_get_buffer(["a", "b"]) == [None, None]
    assert s.get_batch(["a", "b"]) == [b"", b""]
    assert s.is_exist("k") == INVALID
    assert s.batch_is_exist(["a", "b"]) == [INVALID, INVALID]
    assert s.batch_get_into(["a"], [1 << 20], [16]) == [INVALID]
    assert s.batch_put_from_multi_buffers(["a"], [[1 << 20]], [[16]]) == [INVALID]
    assert s.get_replica_desc("k") == []
    assert s.batch_get_replica_desc(["k"]) == {}
    assert s.batch_replica_clear(["k"]) == []
    assert s.remove("k", force=True) == INVALID
    assert s.remove_by_regex(".*") == INVALID
    assert s.remove_all() == INVALID
    assert s.health_check() == 1
    assert s.get_hostname() == ""
    assert s.close() == 0


# ---- copying API ----


def test_put_get(mc):
    assert mc.put("cp/a", b"hello") == 0
    assert mc.put("cp/np", np.arange(10, dtype=np.int32)) == 0
    assert mc.get("cp/a") == b"hello"
    assert mc.get("cp/np") == np.arange(10, dtype=np.int32).tobytes()
    assert mc.get("cp/missing") == b""
    assert mc.put("cp/a", b"again") == 0  # existing keys are not rewritten
    assert mc.get("cp/a") == b"hello"
    assert mc.put("cp/empty", b"") == INVALID
    assert mc.put("", b"x") == INVALID
    assert mc.put("cp/str", "text") == INVALID
    assert mc.put_parts("cp/parts", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert mc.get("cp/parts") == b"abcdef"


def test_put_get_batch(mc):
    keys = [f"cpb/{i}" for i in range(8)]
    values = [bytes([i]) * 1000 for i in range(8)]
    assert mc.put_batch(keys, values) == 0
    assert mc.get_batch(keys) == values
    assert mc.get_batch(keys[:2] + ["cpb/missing"]) == values[:2] + [b""]
    assert mc.put_batch(["cpb/x", "cpb/y"], [b"x", b""]) == INVALID
    assert mc.put_batch(keys, values[:2]) == INVALID


def test_replicate_config(mooncake_store, mc):
    config = mooncake_store.ReplicateConfig()
    assert config.replica_num == 1
    config.replica_num = 1
    config.with_hard_pin = True
    config.with_soft_pin = True
    config.preferred_segment = mc.get_hostname()
    assert "replica_num=1" in repr(config)
    assert mc.put("rc/a", b"v", config) == 0
    pool = np.zeros(4096, np.uint8)
    assert mc.register_buffer(pool.ctypes.data, pool.nbytes) == 0
    assert mc.put_from("rc/b", pool.ctypes.data, 100, config) == 0
    assert mc.batch_put_from(["rc/c"], [pool.ctypes.data], [100], config) == [0]
    assert mc.unregister_buffer(pool.ctypes.data) == 0
    config.replica_num = 2  # one client: only one segment to place replicas in
    assert mc.put("rc/d", b"v", config) == INVALID


# ---- zero-copy API ----


def test_zero_copy(mc):
    pool = np.zeros(1 * MB, np.uint8)
    base = pool.ctypes.data
    assert mc.register_buffer(base, pool.nbytes) == 0
    pool[:4096] = 9
    assert mc.put_from("zc/a", base, 4096) == 0
    assert mc.get_into("zc/a", base + 8192, 8192) == 4096
    assert (pool[8192:8192 + 4096] == 9).all()
    assert mc.get_size("zc/a") == 4096
    assert mc.get_into("zc/a", np.uint64(base + 8192), np.int64(8192)) == 4096  # numpy ints
    # errors
    assert mc.get_into("zc/missing", base, 4096) == NOT_FOUND
    assert mc.get_into("zc/a", base, 100) == INVALID  # value larger than the buffer
    outside = np.zeros(4096, np.uint8)
    assert mc.put_from("zc/b", outside.ctypes.data, 4096) == INVALID  # not registered
    assert mc.get_into("zc/a", outside.ctypes.data, 4096) == INVALID
    assert mc.put_from("zc/b", base, 0) == INVALID
    assert mc.put_from("zc/b", base, -5) == INVALID
    assert mc.put_from("zc/b", 0, 10) == INVALID
    assert mc.get_into("zc/a", base, 0) == INVALID
    assert mc.register_buffer(base + 100, 10) == INVALID  # overlaps
    assert mc.register_buffer(0, 10) == INVALID
    assert mc.register_buffer(outside.ctypes.data, 0) == INVALID
    assert mc.unregister_buffer(base) == 0
    assert mc.unregister_buffer(base) == NOT_FOUND
    assert mc.unregister_buffer(0) == INVALID


def test_batch_zero_copy(mc):
    page = 16 * 1024
    pool = np.zeros(64 * page, np.uint8)
    base = pool.ctypes.data
    assert mc.register_buffer(base, pool.nbytes) == 0
    keys = [f"bz/{i}" for i in range(16)]
    for i in range(16):
        pool[i * page:(i + 1) * page] = i + 1
    ptrs = [base + i * page for i in range(16)]
    assert mc.batch_put_from(keys, ptrs, [page] * 16) == [0] * 16
    dst = [base + (32 + i) * page for i in range(16)]
    assert mc.batch_get_into(keys, dst, [page] * 16) == [page] * 16
    assert np.array_equal(pool[32 * page:48 * page], pool[:16 * page])
    # per-key errors
    assert mc.batch_get_into(["bz/0", "bz/missing"], dst[:2], [page] * 2) == [page, NOT_FOUND]
    assert mc.batch_get_into(["bz/0"], dst[:1], [10]) == [INVALID]
    outside = np.zeros(page, np.uint8)
    assert mc.batch_put_from(["bz/x", "bz/y"], [base, outside.ctypes.data],
                             [page, page]) == [0, INVALID]
    # malformed calls: one code per key
    assert mc.batch_get_into(keys[:3], dst[:2], [page] * 3) == [INVALID] * 3
    assert mc.batch_put_from(keys[:2], ptrs[:2], [page, 0]) == [INVALID] * 2
    assert mc.batch_put_from([], [], []) == []
    assert mc.batch_get_into([], [], []) == []
    assert mc.unregister_buffer(base) == 0


# ---- metadata ----


def test_exist_size_remove(mooncake_store, fresh_master):
    s = mooncake_store.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   fresh_master.address) == 0
    assert s.put("m/a", b"12345") == 0
    assert s.is_exist("m/a") == 1
    assert s.is_exist("m/b") == 0
    assert s.batch_is_exist(["m/a", "m/b"]) == [1, 0]
    assert s.get_size("m/a") == 5
    assert s.get_size("m/b") == NOT_FOUND
    assert s.get("m/a") == b"12345"
    assert s.remove("m/a") == 0  # the get's lease ended with its copy
    assert s.remove("m/a") == NOT_FOUND
    assert s.put_batch(["m/c", "m/d"], [b"c", b"d"]) == 0
    assert s.batch_remove(["m/c", "m/x"]) == [0, NOT_FOUND]
    assert s.remove_all() == 1
    assert s.batch_is_exist([]) == []
    assert s.close() == 0
    assert s.put("m/e", b"v") == INVALID  # closed


def test_master_down(mooncake_store, fresh_master):
    s = mooncake_store.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MB, 16 * MB, "tcp", "",
                   fresh_master.address) == 0
    pool = np.zeros(4096, np.uint8)
    assert s.register_buffer(pool.ctypes.data, pool.nbytes) == 0
    assert s.put("d/a", b"v") == 0
    fresh_master.stop()
    assert s.put("d/b", b"v") == RPC_FAIL
    assert s.get("d/a") == b""
    assert s.health_check() == 2
    assert s.is_exist("d/a") == RPC_FAIL
    assert s.batch_is_exist(["d/a", "d/b"]) == [RPC_FAIL, RPC_FAIL]
    assert s.get_size("d/a") == RPC_FAIL
    assert s.get_into("d/a", pool.ctypes.data, 4096) == RPC_FAIL
    assert s.batch_get_into(["d/a"], [pool.ctypes.data], [4096]) == [RPC_FAIL]
    assert s.batch_put_from(["d/c"], [pool.ctypes.data], [16]) == [RPC_FAIL]
    assert s.remove("d/a") == RPC_FAIL
    assert s.remove_all() == RPC_FAIL
    assert s.close() == 0


def test_error_codes():
    assert compat.error_code(larder.NotFoundError("x")) == NOT_FOUND
    assert compat.error_code(larder.UnavailableError("x")) == RPC_FAIL
    assert compat.error_code(larder.InvalidArgumentError("x")) == INVALID
    assert compat.error_code(larder.ResourceExhaustedError("x")) == -200
    assert compat.error_code(larder.DeadlineExceededError("x")) == -901
    assert compat.error_code(TypeError("x")) == INVALID
    assert compat.ErrorCode.OBJECT_NOT_FOUND == NOT_FOUND

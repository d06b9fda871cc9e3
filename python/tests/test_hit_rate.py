"""The hit rate the master shows is the one a serving engine sees: SGLang and vLLM look keys up
(batch_is_exist) and fetch only the hits, so the master counts lookups, per tenant."""

import json
import urllib.request

import pytest

from conftest import Master, setup_mooncake_store


@pytest.fixture
def http_master():
    m = Master(http=True)
    yield m
    m.stop()


def fetch(master: Master, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{master.http_port}{path}", timeout=10) as reply:
        return json.loads(reply.read())


def test_lookups_make_the_hit_rate_engines_see(http_master, mooncake_store):
    store = setup_mooncake_store(mooncake_store, http_master.address, tenant_id="sglang-a")
    try:
        keys = [f"page-{i}" for i in range(10)]
        for key in keys[:4]:
            assert store.put(key, b"x" * 4096) == 0
        # HiCache's prefetch: look the prefix up, then fetch only what exists.
        exist = store.batch_is_exist(keys)
        assert exist == [1] * 4 + [0] * 6
        for key in keys[:4]:
            assert store.get(key) == b"x" * 4096
    finally:
        store.close()

    summary = fetch(http_master, "/api/summary")
    assert summary["lookups"] == 10
    assert summary["lookup_misses"] == 6
    assert summary["get_hit_rate"] == 1.0  # every get hit: it asked only for hits
    assert summary["hit_rate"] == pytest.approx(0.4)  # what the engine found of what it asked
    tenants = {t["tenant"]: t for t in fetch(http_master, "/api/tenants")["tenants"]}
    assert tenants["sglang-a"]["lookups"] == 10
    assert tenants["sglang-a"]["hit_rate_of"] == "lookups"
    assert tenants["sglang-a"]["hit_rate"] == pytest.approx(0.4)

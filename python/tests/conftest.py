# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Fixtures: a real larder-master process per session (and fresh ones for tests that stop it).

The binary is found in $LARDER_BIN_DIR (ctest sets it), else in <build>/bin next to the
<build>/python/larder package being tested.
"""

import os
import pathlib
import select
import subprocess
import sys
import time
import uuid

os.environ.setdefault("LARDER_LOG_LEVEL", "warn")

import pytest  # noqa: E402

import larder  # noqa: E402

BUILD_PYTHON_DIR = pathlib.Path(larder.__file__).resolve().parents[1]
SHIM_DIR = BUILD_PYTHON_DIR / "shim"


def bin_dir() -> pathlib.Path:
    env = os.environ.get("LARDER_BIN_DIR")
    return pathlib.Path(env) if env else BUILD_PYTHON_DIR.parent / "bin"


class Master:
    """A larder-master child. It exits when we close its stdin (--parent-watch), so it never
    outlives a crashed test run."""

    def __init__(self, *extra_args: str) -> None:
        path = bin_dir() / "larder-master"
        if not path.exists():
            pytest.fail(f"{path} not found; build larder-master or set LARDER_BIN_DIR")
        self.proc = subprocess.Popen(
            [str(path), "--host", "127.0.0.1", "--port", "0", "--http-port", "-1",
             "--parent-watch", *extra_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.address = self._wait_ready(timeout=60)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if not ready:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1)
            if not chunk:
                break
            if chunk != b"\n":
                line += chunk
                continue
            text = line.decode()
            if text.startswith("READY "):
                return text.split()[1]  # "READY 127.0.0.1:PORT HTTPPORT"
            line = b""
        self.stop()
        pytest.fail("larder-master did not print READY")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture(scope="session")
def master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture
def fresh_master():
    """A master of this test's own (it may be stopped), with short leases: a read that is cut
    short (its client closed before its release was sent) holds up remove for 200 ms only."""
    m = Master("--lease-ttl", "200ms")
    yield m
    m.stop()


@pytest.fixture
def store(master):
    s = larder.Store(master.address, global_segment_size="32MiB", rpc_timeout=5)
    yield s
    s.close()


@pytest.fixture
def prefix():
    """A key prefix unique to the test, so tests sharing the session master do not collide."""
    return f"t{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def shim_path(monkeypatch):
    """Puts the Mooncake shim first on sys.path (and drops any mooncake already imported)."""
    monkeypatch.syspath_prepend(str(SHIM_DIR))
    for name in [n for n in sys.modules if n == "mooncake" or n.startswith("mooncake.")]:
        monkeypatch.delitem(sys.modules, name)
    return SHIM_DIR


def child_env(**extra: str) -> dict:
    """The environment for worker processes: this one, plus the shim and package on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(SHIM_DIR), str(BUILD_PYTHON_DIR), str(pathlib.Path(__file__).parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env

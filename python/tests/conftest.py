# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Fixtures: a real larder-master process per session (and fresh ones for tests that stop it),
the Mooncake shim on sys.path, and what several test modules share: Mooncake's error codes and
running a prefill and a decode worker process side by side.

The binary is found in $LARDER_BIN_DIR (ctest sets it), else in <build>/bin next to the
<build>/python/larder package being tested.
"""

import contextlib
import multiprocessing
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

# Mooncake's error codes, as the compat layer must return them.
INVALID = -600  # INVALID_PARAMS
NOT_FOUND = -704  # OBJECT_NOT_FOUND


def auto_routes() -> list:
    """What "auto" enables: local, shm and tcp, and ucx before tcp where it is built."""
    try:
        larder.parse_protocol("ucx")
    except larder.InvalidArgumentError:
        return ["local", "shm", "tcp"]
    return ["local", "shm", "ucx", "tcp"]


def bin_dir() -> pathlib.Path:
    env = os.environ.get("LARDER_BIN_DIR")
    return pathlib.Path(env) if env else BUILD_PYTHON_DIR.parent / "bin"


class _Service:
    """A child that prints "READY ..." when it serves and exits when we close its stdin
    (--parent-watch), so it never outlives a crashed test run."""

    def __init__(self, binary: str, *args: str) -> None:
        path = bin_dir() / binary
        if not path.exists():
            pytest.fail(f"{path} not found; build {binary} or set LARDER_BIN_DIR")
        self.proc = subprocess.Popen([str(path), *args, "--parent-watch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ready = self._wait_ready(binary, timeout=60)

    def _wait_ready(self, binary: str, timeout: float) -> list:
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
                return text.split()
            line = b""
        self.stop()
        pytest.fail(f"{binary} did not print READY")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def wait_until(predicate, what: str, timeout: float = 10.0, poll: float = 0.01):
    """Calls ``predicate`` until it returns something true (returned), failing the test with
    ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


class Master(_Service):
    """A larder-master child."""

    def __init__(self, *extra_args: str, http: bool = False) -> None:
        """``http``: serve the HTTP port too (a free one, in ``http_port``)."""
        super().__init__("larder-master", "--host", "127.0.0.1", "--port", "0", "--http-port",
                         "0" if http else "-1", *extra_args)
        self.address = self.ready[1]  # "READY 127.0.0.1:PORT HTTPPORT"
        self.http_port = int(self.ready[2]) if http else -1


class ClientDaemon(_Service):
    """A larder-client child (standalone mode's daemon) on an abstract socket of its own."""

    def __init__(self, master_address: str, *extra_args: str,
                 segment_size: str = "64MiB") -> None:
        socket_name = f"@larder-client-test-{uuid.uuid4().hex[:12]}"
        super().__init__("larder-client", "--master", master_address, "--socket", socket_name,
                         "--segment-size", segment_size, *extra_args)
        self.address, self.segment_name = self.ready[1], self.ready[2]


def have_client_daemon() -> bool:
    return (bin_dir() / "larder-client").exists()


@pytest.fixture(scope="session")
def master():
    m = Master()
    yield m
    m.stop()


def module_master(*extra_args: str):
    """A module-scoped fixture: a master of the test module's own, with ``extra_args``."""

    @pytest.fixture(scope="module")
    def own_master():
        m = Master(*extra_args)
        yield m
        m.stop()

    return own_master


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


def _prefer_shim(mp: pytest.MonkeyPatch) -> None:
    """Puts the Mooncake shim first on sys.path (and drops any mooncake already imported)."""
    mp.syspath_prepend(str(SHIM_DIR))
    for name in [n for n in sys.modules if n == "mooncake" or n.startswith("mooncake.")]:
        mp.delitem(sys.modules, name)


@pytest.fixture
def shim_path(monkeypatch):
    """Puts the Mooncake shim first on sys.path (and drops any mooncake already imported)."""
    _prefer_shim(monkeypatch)
    return SHIM_DIR


@pytest.fixture
def mooncake_store(shim_path):
    """``mooncake.store``, imported through the shim as Mooncake users import it."""
    from mooncake import store as module

    return module


def setup_mooncake_store(module, address: str, global_segment_size: int = 32 << 20, **kwargs):
    """A ``module.MooncakeDistributedStore`` set up as the compat tests do: tcp, a 16 MiB local
    buffer, on the master at ``address``; ``kwargs`` go to setup."""
    s = module.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, 16 << 20, "tcp", "", address,
                   **kwargs) == 0
    return s


@contextlib.contextmanager
def larder_protocol(route: str):
    """Larder's own protocol setting, which wins over a Mooncake config's "protocol", set while the
    block runs (workers spawned and stores set up inside keep it): route "tcp" forces the network
    even between processes of one host; any other route sets nothing."""
    names = ("LARDER_PROTOCOL", "LARDER_STORE_PROTOCOL")
    saved = {name: os.environ.get(name) for name in names}
    if route == "tcp":
        for name in names:
            os.environ[name] = "tcp"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def _larder_protocol_for_tcp_route(request):
    """A test parametrized to see route "tcp" (``route`` or ``managed_route``) through the
    Mooncake layer runs with Larder's own setting forcing tcp: a Mooncake "tcp" alone keeps the
    processes of one host on shm. (Module-scoped fixtures set up before this one use
    larder_protocol themselves.)"""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    with larder_protocol(params.get("route", params.get("managed_route", ""))):
        yield


@contextlib.contextmanager
def shim_first():
    """What shim_path does, for the length of the block (for module-scoped fixtures)."""
    with pytest.MonkeyPatch.context() as mp:
        _prefer_shim(mp)
        yield SHIM_DIR


def child_env(**extra: str) -> dict:
    """The environment for worker processes: this one, plus the shim and package on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(SHIM_DIR), str(BUILD_PYTHON_DIR), str(pathlib.Path(__file__).parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def run_prefill_decode(prefill, decode, *args) -> dict:
    """Runs ``prefill(*args, to_decode, to_prefill, results)`` and ``decode(...)`` with the same
    arguments in two spawned processes to the end; returns their reports by role ("prefill",
    "decode"), failing on an error either reported or an exit code other than 0."""
    ctx = multiprocessing.get_context("spawn")
    to_decode, to_prefill, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(*args, to_decode, to_prefill, results))
             for worker in (prefill, decode)]
    for p in procs:
        p.start()
    try:
        reports = {r["role"]: r for r in (results.get(timeout=600) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs)
    return reports

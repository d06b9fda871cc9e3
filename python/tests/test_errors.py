# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The exception hierarchy and the module-level helpers."""

import pathlib

import pytest

import larder
from conftest import auto_routes

CLASSES = {
    larder.StatusCode.CANCELLED: larder.CancelledError,
    larder.StatusCode.UNKNOWN: larder.UnknownError,
    larder.StatusCode.INVALID_ARGUMENT: larder.InvalidArgumentError,
    larder.StatusCode.DEADLINE_EXCEEDED: larder.DeadlineExceededError,
    larder.StatusCode.NOT_FOUND: larder.NotFoundError,
    larder.StatusCode.ALREADY_EXISTS: larder.AlreadyExistsError,
    larder.StatusCode.PERMISSION_DENIED: larder.PermissionDeniedError,
    larder.StatusCode.RESOURCE_EXHAUSTED: larder.ResourceExhaustedError,
    larder.StatusCode.FAILED_PRECONDITION: larder.FailedPreconditionError,
    larder.StatusCode.ABORTED: larder.AbortedError,
    larder.StatusCode.OUT_OF_RANGE: larder.OutOfRangeError,
    larder.StatusCode.UNIMPLEMENTED: larder.UnimplementedError,
    larder.StatusCode.INTERNAL: larder.InternalError,
    larder.StatusCode.UNAVAILABLE: larder.UnavailableError,
    larder.StatusCode.DATA_LOSS: larder.DataLossError,
    larder.StatusCode.UNAUTHENTICATED: larder.UnauthenticatedError,
}


@pytest.mark.parametrize("code,cls", CLASSES.items(), ids=lambda v: getattr(v, "__name__", str(v)))
def test_one_class_per_code(code, cls):
    assert issubclass(cls, larder.LarderError)
    assert issubclass(cls, Exception)
    assert cls.code == code
    assert larder.error_for_code(code) is cls
    assert larder.error_for_code(int(code)) is cls
    assert cls.__module__ == "larder"
    assert cls.__doc__


def test_codes_and_ints():
    assert int(larder.StatusCode.NOT_FOUND) == 5
    assert int(larder.StatusCode.UNAVAILABLE) == 14
    assert larder.StatusCode(3) == larder.StatusCode.INVALID_ARGUMENT
    assert larder.StatusCode.NOT_FOUND.name == "NOT_FOUND"
    assert int(larder.TransferOp.WRITE) == 1


def test_every_code_but_ok_has_a_class():
    assert set(CLASSES) == set(larder.StatusCode.__members__.values()) - {larder.StatusCode.OK}


def test_builtin_bases_let_generic_handlers_catch():
    assert issubclass(larder.InvalidArgumentError, ValueError)
    assert issubclass(larder.OutOfRangeError, ValueError)
    assert issubclass(larder.NotFoundError, LookupError)
    assert issubclass(larder.DeadlineExceededError, TimeoutError)
    assert issubclass(larder.UnimplementedError, NotImplementedError)


def test_raised_errors_carry_code_and_message():
    with pytest.raises(larder.InvalidArgumentError) as info:
        larder.parse_size("twelve")
    assert info.value.code == larder.StatusCode.INVALID_ARGUMENT
    assert "twelve" in info.value.message
    assert str(info.value) == info.value.message


def test_check_returns_or_raises_first_error():
    ok = [b"a", None, 3]
    assert larder.check(ok) is ok
    first = larder.NotFoundError("k1")
    with pytest.raises(larder.NotFoundError) as info:
        larder.check([b"a", first, larder.UnavailableError("k2")])
    assert info.value is first


def test_parse_size():
    assert larder.parse_size("4gb") == 4 << 30
    assert larder.parse_size("64KiB") == 64 << 10
    assert larder.parse_size("4096") == 4096
    assert larder.parse_size(12) == 12
    with pytest.raises(larder.InvalidArgumentError):
        larder.parse_size("4 parsecs")
    with pytest.raises(larder.InvalidArgumentError):
        larder.parse_size(-1)


def test_parse_duration():
    assert larder.parse_duration("250ms") == pytest.approx(0.25)
    assert larder.parse_duration("2m") == pytest.approx(120)
    assert larder.parse_duration(1.5) == pytest.approx(1.5)
    with pytest.raises(larder.InvalidArgumentError):
        larder.parse_duration("soon")
    with pytest.raises(larder.InvalidArgumentError):
        larder.parse_duration(-1)
    with pytest.raises(TypeError):
        larder.parse_duration(None)


def test_protocols(monkeypatch):
    assert larder.parse_protocol("auto") == auto_routes()
    assert larder.parse_protocol("tcp") == ["tcp"]
    with pytest.raises(larder.InvalidArgumentError):
        larder.parse_protocol("rdma")
    monkeypatch.setenv("LARDER_PROTOCOL", "tcp")
    monkeypatch.setenv("LARDER_STORE_PROTOCOL", "shm,tcp")
    assert larder.resolve_protocol() == "tcp"
    assert larder.resolve_protocol(role="store") == "shm,tcp"
    assert larder.resolve_protocol("auto", role="store") == "auto"
    assert larder.resolve_protocol(role="pd") == "tcp"
    with pytest.raises(larder.InvalidArgumentError, match="'pd' or 'store'"):
        larder.resolve_protocol(role="pilot")
    # The PD role's earlier name still works, with a warning that says its new name.
    with pytest.warns(DeprecationWarning, match="now called 'pd'"):
        assert larder.resolve_protocol(role="standalone") == "tcp"


def test_package_metadata():
    # One version, the VERSION file's, in the extension and the package.
    version_file = pathlib.Path(__file__).resolve().parents[2] / "VERSION"
    assert larder.__version__ == version_file.read_text().strip()
    for name in larder.__all__:
        assert hasattr(larder, name), name


def test_import_under_another_python_says_which_one_it_was_built_for(tmp_path):
    """A native module built for another interpreter gives an ImportError naming both versions
    and how to rebuild, not "No module named 'larder._larder'"."""
    import shutil
    import subprocess
    import sys

    package = pathlib.Path(larder.__file__).parent
    copy = tmp_path / "larder"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "compat"))
    (native,) = copy.glob("_larder.*.so")
    native.rename(copy / "_larder.cpython-30-x86_64-linux-gnu.so")
    result = subprocess.run([sys.executable, "-c", "import larder"], cwd=tmp_path,
                            env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "built for cpython-30-x86_64-linux-gnu" in result.stderr, result.stderr
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"this is Python {this}" in result.stderr, result.stderr
    assert "-DPython3_EXECUTABLE=" in result.stderr, result.stderr

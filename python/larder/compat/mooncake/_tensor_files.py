# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Tensors to and from files: Mooncake's ``save_tensor_to_file`` / ``load_tensor_from_file``
family, mixed into MooncakeDistributedStore.

Two formats: safetensors (written and read by ``_safetensors``, no package needed) and torch's
own (``torch.save``; loaded with ``weights_only=True``, and only from local files unless the
caller opts in). "auto" picks safetensors for a name ending in ``.safetensors``, torch otherwise.
Local paths and ``file://`` URIs are read and written directly (missing parent folders are
created); other schemes (``s3://``, ``gs://``, ...) or a ``filesystem`` other than "auto" /
"file" go through fsspec when it is installed (Debian: python3-fsspec).

Return conventions are Mooncake's: saves return 0, INVALID_PARAMS (-600) for bad arguments,
FILE_NOT_FOUND (-1100) when the key is missing or the file's folder cannot be reached, and
PERSISTENT_FAIL (-1503) when writing fails otherwise; loads return the tensor they stored, or
None (the reason is logged on the ``larder.compat.mooncake`` logger).
"""

from __future__ import annotations

import io
import logging
import os
import urllib.parse

from . import _safetensors
from ._errors import ErrorCode

_log = logging.getLogger("larder.compat.mooncake")

_INVALID = int(ErrorCode.INVALID_PARAMS)
_FILE_NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)
_PERSISTENT_FAIL = int(ErrorCode.PERSISTENT_FAIL)

_SAFETENSORS = "safetensors"
_TORCH = "torch"
_FORMAT_NAMES = {
    "safetensors": _SAFETENSORS, "safe_tensors": _SAFETENSORS, "safetensor": _SAFETENSORS,
    "torch": _TORCH, "pt": _TORCH, "pth": _TORCH, "standard": _TORCH, "standard_file": _TORCH,
}
_LOCAL_FILESYSTEMS = {"file", "local", "localfs", "posix"}
# save_tensor / load_tensor: what each artifact kind exports as ("auto": by the file's name).
_ARTIFACT_FORMATS = {
    "tensor": "auto", "kv_cache": "auto", "rl_checkpoint": "auto", "model_weights": "auto",
    "safetensor": _SAFETENSORS, "safetensors": _SAFETENSORS, "torch": _TORCH,
}


def _format(format_name, file_name: str) -> str:
    name = "auto" if format_name is None else str(format_name).lower().replace("-", "_")
    if name == "auto":
        return _SAFETENSORS if file_name.lower().endswith(".safetensors") else _TORCH
    if name not in _FORMAT_NAMES:
        raise ValueError(f"unknown file format {format_name!r} (safetensors or torch)")
    return _FORMAT_NAMES[name]


def _location(file_name, filesystem) -> tuple[str, str]:
    """``(scheme, where)``: "file" and a local path, or another scheme and a URL for fsspec."""
    target = os.fspath(file_name)
    if not isinstance(target, str) or not target:
        raise ValueError("file_name must be a non-empty path")
    fs = "auto" if filesystem is None else str(filesystem).lower().replace("-", "_")
    if "://" in target:
        scheme = target.split("://", 1)[0].lower()
        if scheme == "file":
            return "file", urllib.parse.unquote(urllib.parse.urlparse(target).path)
        return scheme, target
    if fs == "auto" or fs in _LOCAL_FILESYSTEMS:
        return "file", target
    return fs, f"{fs}://{target}"


def _fsspec_target(where: str, storage_options):
    try:
        import fsspec
    except ImportError as e:
        raise ValueError(f"{where}: remote file systems need fsspec (Debian: python3-fsspec)") \
            from e
    return fsspec.core.url_to_fs(where, **dict(storage_options or {}))


def _write(file_name, filesystem, storage_options, payload: bytes) -> None:
    scheme, where = _location(file_name, filesystem)
    if scheme == "file":
        folder = os.path.dirname(where)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(where, "wb") as f:
            f.write(payload)
        return
    fs, path = _fsspec_target(where, storage_options)
    with fs.open(path, "wb") as f:
        f.write(payload)


def _read(file_name, filesystem, storage_options) -> bytes:
    scheme, where = _location(file_name, filesystem)
    if scheme == "file":
        with open(where, "rb") as f:
            return f.read()
    fs, path = _fsspec_target(where, storage_options)
    with fs.open(path, "rb") as f:
        return f.read()


def _encode(tensor, format_name: str, tensor_name: str) -> bytes:
    if format_name == _SAFETENSORS:
        return _safetensors.encode({tensor_name: tensor})
    import torch

    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getvalue()


def _pick(tensors: dict, names) -> object:
    """The entry named by the first of ``names`` present, else the file's only entry."""
    for name in names:
        if name and name in tensors:
            return tensors[name]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    wanted = next((n for n in names if n), "<unnamed>")
    raise ValueError(f"no entry {wanted!r} among {sorted(tensors)}")


def _decode(payload: bytes, format_name: str, names, map_location, weights_only: bool):
    import torch

    if format_name == _SAFETENSORS:
        tensor = _pick(_safetensors.decode(payload)[0], names)
    else:
        tensor = torch.load(io.BytesIO(payload), map_location=map_location,
                            weights_only=bool(weights_only))
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"a torch checkpoint must hold one tensor, not a "
                             f"{type(tensor).__name__}")
        return tensor
    return tensor if map_location is None else tensor.to(map_location)


class TensorFileMethods:
    """Mooncake's tensor file methods, mixed into MooncakeDistributedStore.

    REQUIRES: ``self`` provides ``_not_ready``, ``get_tensor`` and ``put_tensor`` with Mooncake's
    return conventions.
    """

    def save_tensor_to_file(self, key, file_name=None, format="auto", filesystem="auto",
                            storage_options=None, tensor_name=None) -> int:
        """Writes the tensor stored under ``key`` to ``file_name`` (default: the key itself) in
        ``format``; a safetensors entry is named ``tensor_name`` (default: the key)."""
        if self._not_ready():
            return _INVALID
        file_name = key if file_name is None else file_name
        try:
            format_name = _format(format, os.fspath(file_name))
            tensor = self.get_tensor(key)
            if tensor is None:
                _log.warning("save_tensor_to_file: no tensor under key %r", key)
                return _FILE_NOT_FOUND
            payload = _encode(tensor, format_name, key if tensor_name is None else tensor_name)
            _write(file_name, filesystem, storage_options, payload)
            return 0
        except FileNotFoundError as e:
            _log.warning("save_tensor_to_file %r: %s", key, e)
            return _FILE_NOT_FOUND
        except (TypeError, ValueError) as e:
            _log.warning("save_tensor_to_file %r: %s", key, e)
            return _INVALID
        except OSError as e:
            _log.warning("save_tensor_to_file %r: %s", key, e)
            return _PERSISTENT_FAIL

    def load_tensor_from_file(self, key=None, file_name=None, format="auto",
                              filesystem="auto", storage_options=None, tensor_name=None,
                              map_location=None, weights_only=True,
                              allow_unsafe_remote_torch_load=False):
        """Reads a tensor from ``file_name`` and stores it under ``key`` (default: the file's
        name); returns it, or None. From a safetensors file, the entry named ``tensor_name``,
        else the one named ``key``, else the file's only entry. A torch file is loaded with
        ``weights_only`` and, from a remote scheme, only with
        ``allow_unsafe_remote_torch_load=True`` (unpickling runs code)."""
        if file_name is None or self._not_ready():
            _log.warning("load_tensor_from_file: %s",
                         "file_name is required" if file_name is None else "not set up")
            return None
        try:
            path = os.fspath(file_name)
            store_key = path if key is None else key
            format_name = _format(format, path)
            scheme, _ = _location(file_name, filesystem)
            if format_name == _TORCH and scheme != "file" and not allow_unsafe_remote_torch_load:
                raise ValueError(f"refusing to torch.load from {scheme}:// (use safetensors, or "
                                 "allow_unsafe_remote_torch_load=True for a trusted source)")
            payload = _read(file_name, filesystem, storage_options)
            tensor = _decode(payload, format_name, (tensor_name, store_key), map_location,
                             weights_only)
        except (OSError, TypeError, ValueError, RuntimeError) as e:
            _log.warning("load_tensor_from_file %r: %s", file_name, e)
            return None
        code = self.put_tensor(store_key, tensor)
        if code != 0:
            _log.warning("load_tensor_from_file %r: storing key %r failed (%d)", file_name,
                         store_key, code)
            return None
        return tensor

    def save_tensor_to_safetensor(self, key, file_name=None, filesystem="auto",
                                  storage_options=None, tensor_name=None) -> int:
        """save_tensor_to_file in the safetensors format."""
        return self.save_tensor_to_file(key, file_name, _SAFETENSORS, filesystem,
                                        storage_options, tensor_name)

    def load_tensor_from_safetensor(self, key=None, file_name=None, filesystem="auto",
                                    storage_options=None, tensor_name=None):
        """load_tensor_from_file from a safetensors file."""
        return self.load_tensor_from_file(key, file_name, _SAFETENSORS, filesystem,
                                          storage_options, tensor_name)

    def save_kv_cache_to_file(self, key, file_name=None, format="auto", filesystem="auto",
                              storage_options=None, tensor_name=None) -> int:
        """save_tensor_to_file, under the name Mooncake gives it for KV caches."""
        return self.save_tensor_to_file(key, file_name, format, filesystem, storage_options,
                                        tensor_name)

    def load_kv_cache_from_file(self, key=None, file_name=None, format="auto",
                                filesystem="auto", storage_options=None, tensor_name=None,
                                map_location=None):
        """load_tensor_from_file, under the name Mooncake gives it for KV caches."""
        return self.load_tensor_from_file(key, file_name, format, filesystem, storage_options,
                                          tensor_name, map_location)

    def save_tensor(self, key, tensor, file_name=None, artifact_kind="tensor", tensor_name=None,
                    format=None, filesystem="auto", storage_options=None) -> int:
        """Stores ``tensor`` under ``key`` and, with ``file_name``, exports it there too.
        ``artifact_kind`` ("tensor", "kv_cache", "rl_checkpoint", "model_weights": the format
        follows the file's name; "safetensor" / "safetensors", "torch") picks the format unless
        ``format`` is given; any other kind is INVALID_PARAMS."""
        export = _ARTIFACT_FORMATS.get(str(artifact_kind).lower())
        if export is None:
            _log.warning("save_tensor: unknown artifact_kind %r", artifact_kind)
            return _INVALID
        code = self.put_tensor(key, tensor)
        if code != 0 or file_name is None:
            return code
        return self.save_tensor_to_file(key, file_name, format or export, filesystem,
                                        storage_options, tensor_name)

    def load_tensor(self, key, file_name=None, artifact_kind="tensor", tensor_name=None,
                    format=None, filesystem="auto", storage_options=None, map_location=None):
        """The tensor under ``key``; with ``file_name``, first loads it from that file into
        ``key`` (as load_tensor_from_file, the format picked as save_tensor picks it). None on
        any failure, an unknown ``artifact_kind`` included."""
        export = _ARTIFACT_FORMATS.get(str(artifact_kind).lower())
        if export is None:
            _log.warning("load_tensor: unknown artifact_kind %r", artifact_kind)
            return None
        if file_name is None:
            return self.get_tensor(key)
        return self.load_tensor_from_file(key, file_name, format or export, filesystem,
                                          storage_options, tensor_name, map_location)

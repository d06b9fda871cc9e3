# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""Mooncake's unified parallelism tensor API (the ``*_with_parallelism`` methods), mixed into
MooncakeDistributedStore, and its spec classes ``ParallelAxis``, ``TensorParallelism`` and
``ReadTarget``.

A write's ``parallelism`` is None (the tensor is stored whole under its key, as put_tensor
does) or a TensorParallelism of one "tp" axis (every shard of the tensor along the axis's
``split_dim``, default 0, under ``key_tp_<rank>``, as put_tensor_with_tp does). A read's
``target`` is None or a ReadTarget: mode "as_stored" (or no parallelism) reads the object under
the key; "shard" with one TP axis reads shard ``rank``; "full" with one TP axis gathers every
shard into the whole tensor. Other axes ("dp", "ep", "pp", several axes) and writer partitions
are refused with INVALID_PARAMS (writes) or None (reads), and logged.

Specs may also be given as dicts with the same keys (``{"axes": [{"kind": "tp", ...}]}``).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping, Sequence

from ._errors import ErrorCode
from ._tensor import _object_at, _tp_key, deserialize_tensor, serialize_tensor

_log = logging.getLogger("larder.compat.mooncake")

_INVALID = int(ErrorCode.INVALID_PARAMS)
_AXIS_KINDS = ("tp", "dp", "ep", "pp")
_READ_MODES = ("as_stored", "shard", "full")


class ParallelAxis:
    """One axis of a tensor's parallel layout: ``kind`` ("tp", "dp", "ep" or "pp"), this
    writer's ``rank`` of ``size``, and for TP the ``split_dim`` (None: 0). ``expert_id`` and
    ``stage_id`` are Mooncake's EP / PP fields."""

    def __init__(self, kind: str = "tp", rank: int = 0, size: int = 1,
                 split_dim: int | None = None, expert_id: int | None = None,
                 stage_id: int | None = None) -> None:
        self.kind = kind
        self.rank = rank
        self.size = size
        self.split_dim = split_dim
        self.expert_id = expert_id
        self.stage_id = stage_id

    def __repr__(self) -> str:
        return (f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, "
                f"split_dim={self.split_dim})")


class TensorParallelism:
    """A tensor's parallel layout: its ``axes`` (ParallelAxis), outermost first."""

    def __init__(self, axes: Sequence | None = None) -> None:
        self.axes = list(axes or [])

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """What a ``get_tensor_with_parallelism`` returns: ``mode`` "as_stored" (the object under
    the key), "shard" (this ``parallelism``'s shard) or "full" (every shard gathered)."""

    def __init__(self, mode: str = "as_stored", parallelism=None) -> None:
        self.mode = mode
        self.parallelism = parallelism

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self.mode!r}, parallelism={self.parallelism!r})"


def _field(spec, name: str, default=None):
    if isinstance(spec, Mapping):
        return spec.get(name, default)
    return getattr(spec, name, default)


def _tp_layout(parallelism) -> tuple[int, int, int] | None:
    """``(rank, size, split_dim)`` of a one-TP-axis spec; None for no parallelism. Raises
    ValueError for a spec this layer does not store."""
    if parallelism is None:
        return None
    axes = parallelism if isinstance(parallelism, Sequence) else _field(parallelism, "axes")
    if axes is None:
        raise TypeError(f"{type(parallelism).__name__} is not a TensorParallelism")
    axes = list(axes)
    if not axes:
        return None
    kinds = [str(_field(axis, "kind", "")).lower() for axis in axes]
    if any(kind not in _AXIS_KINDS for kind in kinds):
        raise ValueError(f"axis kinds {kinds}: each must be one of {_AXIS_KINDS}")
    if kinds != ["tp"]:
        raise ValueError(f"axes {kinds}: only a single tp axis is supported by Larder")
    axis = axes[0]
    rank, size = int(_field(axis, "rank", 0)), int(_field(axis, "size", 1))
    split_dim = _field(axis, "split_dim")
    split_dim = 0 if split_dim is None else int(split_dim)
    if size < 1 or not 0 <= rank < size or split_dim < 0:
        raise ValueError(f"tp axis rank {rank} of {size}, split_dim {split_dim}")
    return rank, size, split_dim


def _read_plan(target) -> tuple[str, tuple | None]:
    """``(mode, tp layout)`` of a ReadTarget (None: as stored)."""
    if target is None:
        return "as_stored", None
    mode = str(_field(target, "mode", "as_stored")).lower()
    if mode not in _READ_MODES:
        raise ValueError(f"read mode {mode!r} is not one of {_READ_MODES}")
    layout = _tp_layout(_field(target, "parallelism"))
    return ("as_stored", None) if layout is None or layout[1] <= 1 else (mode, layout)


def _per_key(values, n: int, what: str) -> list:
    """``values`` (None: all None) as a list of n entries."""
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{n} keys but {len(values)} {what}")
    return values


class ParallelTensorMethods:
    """The ``*_with_parallelism`` methods, mixed into MooncakeDistributedStore (see the module
    docstring for what a spec may say). Writes return 0 or a negative code per key; reads a
    tensor or None per key. Thread-safe as the store is.

    REQUIRES: ``self`` is a TensorMethods (``_not_ready``, ``_write_tensors``,
    ``_read_tensors``, ``put_tensor_from`` and the other tensor methods).
    """

    # ---- writes from tensors ----

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None) -> int:
        """Stores ``tensor`` as ``parallelism`` says (whole under ``key``, or its TP shards)."""
        return self._parallel_write("put_tensor_with_parallelism", [key], [tensor],
                                    [parallelism], config, [writer_partition], False)[0]

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None) -> int:
        """put_tensor_with_parallelism that replaces existing objects."""
        return self._parallel_write("upsert_tensor_with_parallelism", [key], [tensor],
                                    [parallelism], config, [writer_partition], True)[0]

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                          config=None, writer_partitions=None) -> list:
        """put_tensor_with_parallelism for every key (``parallelisms``: one per key, or None)."""
        return self._parallel_batch("batch_put_tensor_with_parallelism", keys, tensors_list,
                                    parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                             config=None, writer_partitions=None) -> list:
        """batch_put_tensor_with_parallelism that replaces existing objects."""
        return self._parallel_batch("batch_upsert_tensor_with_parallelism", keys,
                                    tensors_list, parallelisms, config, writer_partitions, True)

    # ---- writes from serialized tensor objects ----

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None) -> int:
        """Stores the tensor object at [buffer_ptr, buffer_ptr + size) (registered memory) as
        ``parallelism`` says: as is, or split into TP shards."""
        return self._parallel_from("put_tensor_with_parallelism_from", [key], [buffer_ptr],
                                   [size], [parallelism], config, [writer_partition], False)[0]

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                            config=None, writer_partition=None) -> int:
        """put_tensor_with_parallelism_from that replaces existing objects."""
        return self._parallel_from("upsert_tensor_with_parallelism_from", [key], [buffer_ptr],
                                   [size], [parallelism], config, [writer_partition], True)[0]

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                               parallelisms=None, config=None,
                                               writer_partitions=None) -> list:
        """put_tensor_with_parallelism_from for every key."""
        return self._parallel_from_batch("batch_put_tensor_with_parallelism_from", keys,
                                         buffer_ptrs, sizes, parallelisms, config,
                                         writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                                  parallelisms=None, config=None,
                                                  writer_partitions=None) -> list:
        """batch_put_tensor_with_parallelism_from that replaces existing objects."""
        return self._parallel_from_batch("batch_upsert_tensor_with_parallelism_from", keys,
                                         buffer_ptrs, sizes, parallelisms, config,
                                         writer_partitions, True)

    # ---- reads ----

    def get_tensor_with_parallelism(self, key, target=None):
        """The tensor ``target`` names (None: the object under ``key``), or None."""
        return self.batch_get_tensor_with_parallelism([key], [target])[0]

    def batch_get_tensor_with_parallelism(self, keys, targets=None) -> list:
        """get_tensor_with_parallelism for every key (``targets``: one per key, or None)."""
        what = "batch_get_tensor_with_parallelism"
        keys = list(keys)
        plans = _read_plans(what, targets, len(keys))
        if plans is None:
            return [None] * len(keys)
        results = [None] * len(keys)
        for mode, layout, indices in _groups(plans):
            group = [keys[i] for i in indices]
            if mode == "as_stored":
                found = self._read_tensors(what, group, None)
            elif mode == "shard":
                found = self._read_tensors(what, [_tp_key(k, layout[0]) for k in group],
                                           layout[0])
            else:
                found = [self._gather(what, k, layout) for k in group]
            for i, tensor in zip(indices, found):
                results[i] = tensor
        return results

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        """Reads the tensor ``target`` names into [buffer_ptr, buffer_ptr + size) (registered
        memory) as a tensor object and returns a tensor aliasing it at offset 304, or None."""
        if self._not_ready():
            return None
        return self.batch_get_tensor_with_parallelism_into([key], [buffer_ptr], [size],
                                                           [target])[0]

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes,
                                               targets=None) -> list:
        """get_tensor_with_parallelism_into for every key; as batch_get_tensor_into, a list of
        INVALID_PARAMS before setup or when the lists' lengths differ."""
        what = "batch_get_tensor_with_parallelism_into"
        keys = list(keys)
        if self._not_ready() or len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [_INVALID] * len(keys)
        plans = _read_plans(what, targets, len(keys))
        if plans is None:
            return [None] * len(keys)
        results = [None] * len(keys)
        for mode, layout, indices in _groups(plans):
            group = [keys[i] for i in indices]
            ptrs = [buffer_ptrs[i] for i in indices]
            lens = [sizes[i] for i in indices]
            if mode == "as_stored":
                found = self._read_into(what, group, ptrs, lens, None)
            elif mode == "shard":
                found = self._read_into(what, [_tp_key(k, layout[0]) for k in group], ptrs,
                                        lens, layout[0])
            else:
                found = [self._gather_into(what, k, layout, p, n)
                         for k, p, n in zip(group, ptrs, lens)]
            for i, tensor in zip(indices, found):
                results[i] = tensor
        return results

    # ---- shared paths ----

    def _parallel_write(self, what, keys, tensors, parallelisms, config, partitions,
                        upsert) -> list:
        results = [_INVALID] * len(keys)
        if self._not_ready():
            return results
        layouts = {}
        for i, (key, parallelism, partition) in enumerate(zip(keys, parallelisms, partitions)):
            try:
                if partition is not None:
                    raise ValueError("writer partitions are not supported by Larder")
                layouts[i] = _tp_layout(parallelism)
            except (TypeError, ValueError) as e:
                _log.warning("%s key %r: %s", what, key, e)
        for _, layout, indices in _groups([("write", layouts.get(i)) for i in range(len(keys))]):
            indices = [i for i in indices if i in layouts]
            if not indices:
                continue
            tp_size, split_dim = (1, 0) if layout is None else layout[1:]
            codes = self._write_tensors(what, [keys[i] for i in indices],
                                        [tensors[i] for i in indices], config, upsert, tp_size,
                                        split_dim)
            for i, code in zip(indices, codes):
                results[i] = code
        return results

    def _parallel_batch(self, what, keys, tensors, parallelisms, config, partitions,
                        upsert) -> list:
        keys, tensors = list(keys), list(tensors)
        try:
            parallelisms = _per_key(parallelisms, len(keys), "parallelisms")
            partitions = _per_key(partitions, len(keys), "writer partitions")
            if len(tensors) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(tensors)} tensors")
        except (TypeError, ValueError) as e:
            _log.warning("%s: %s", what, e)
            return [_INVALID] * len(keys)
        return self._parallel_write(what, keys, tensors, parallelisms, config, partitions,
                                    upsert)

    def _parallel_from(self, what, keys, buffer_ptrs, sizes, parallelisms, config,
                       partitions, upsert) -> list:
        """Decodes each tensor object, then writes it as _parallel_write does; an object
        written whole is stored as is (its bytes, not re-encoded)."""
        results = [_INVALID] * len(keys)
        if self._not_ready():
            return results
        whole, split = [], []
        for i, (key, parallelism, partition) in enumerate(zip(keys, parallelisms, partitions)):
            try:
                if partition is not None:
                    raise ValueError("writer partitions are not supported by Larder")
                layout = _tp_layout(parallelism)
                view = _object_at(buffer_ptrs[i], sizes[i])
                if layout is None or layout[1] <= 1:
                    whole.append(i)
                else:
                    split.append((i, deserialize_tensor(view, copy=False), parallelism))
            except (TypeError, ValueError) as e:
                _log.warning("%s key %r: %s", what, key, e)
        if whole:
            write = self.batch_upsert_tensor_from if upsert else self.batch_put_tensor_from
            codes = write([keys[i] for i in whole], [buffer_ptrs[i] for i in whole],
                          [sizes[i] for i in whole])
            for i, code in zip(whole, codes):
                results[i] = code
        if split:
            codes = self._parallel_write(what, [keys[i] for i, _, _ in split],
                                         [t for _, t, _ in split], [p for _, _, p in split],
                                         config, [None] * len(split), upsert)
            for (i, _, _), code in zip(split, codes):
                results[i] = code
        return results

    def _parallel_from_batch(self, what, keys, buffer_ptrs, sizes, parallelisms, config,
                             partitions, upsert) -> list:
        keys = list(keys)
        try:
            parallelisms = _per_key(parallelisms, len(keys), "parallelisms")
            partitions = _per_key(partitions, len(keys), "writer partitions")
            if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
                raise ValueError(f"{len(keys)} keys, {len(buffer_ptrs)} pointers, "
                                 f"{len(sizes)} sizes")
        except (TypeError, ValueError) as e:
            _log.warning("%s: %s", what, e)
            return [_INVALID] * len(keys)
        return self._parallel_from(what, keys, list(buffer_ptrs), list(sizes), parallelisms,
                                   config, partitions, upsert)

    def _gather(self, what, key, layout):
        """Every TP shard of ``key`` (``layout``: rank, size, split_dim), concatenated."""
        import torch

        _, size, split_dim = layout
        shards = []
        for rank in range(size):
            shard = self._read_tensors(what, [_tp_key(key, rank)], rank)[0]
            if shard is None:
                return None
            shards.append(shard)
        try:
            return torch.cat(shards, dim=split_dim)
        except (RuntimeError, IndexError) as e:
            _log.warning("%s key %r: the shards do not fit together: %s", what, key, e)
            return None

    def _gather_into(self, what, key, layout, buffer_ptr, size):
        tensor = self._gather(what, key, layout)
        if tensor is None:
            return None
        header, data = serialize_tensor(tensor)
        total = len(header) + len(data)
        if not isinstance(size, int) or total > size or not isinstance(buffer_ptr, int):
            _log.warning("%s key %r: %d bytes do not fit the %r-byte buffer", what, key, total,
                         size)
            return None
        ctypes.memmove(buffer_ptr, header, len(header))
        ctypes.memmove(buffer_ptr + len(header), bytes(data), len(data))
        return deserialize_tensor(_object_at(buffer_ptr, total), copy=False)


def _read_plans(what, targets, n):
    """The read plan of each of ``n`` keys' ``targets`` (None: as stored), or None (logged) when
    one is malformed."""
    try:
        return [_read_plan(t) for t in _per_key(targets, n, "targets")]
    except (TypeError, ValueError) as e:
        _log.warning("%s: %s", what, e)
        return None


def _groups(plans) -> list:
    """``(mode, layout, indices)`` for each distinct (mode, layout) in ``plans``, in order of
    first appearance."""
    groups: dict = {}
    for i, plan in enumerate(plans):
        groups.setdefault(plan, []).append(i)
    return [(mode, layout, indices) for (mode, layout), indices in groups.items()]
